"""Fictional names for the built-in corpus: people, places, organisations, products.

Every generator takes a :class:`random.Random` and returns one name. Places, companies
and products are assembled from invented syllables, so the corpus describes no real
entity; first names are ordinary given names, surnames are invented or uncommon, and
the combinations are fictional.
"""

from __future__ import annotations

import random
from collections.abc import Callable

FIRST_NAMES: tuple[str, ...] = (
    "Ada", "Aiko", "Amara", "Anders", "Anika", "Aurelio", "Beatriz", "Bram", "Camille",
    "Casimir", "Dalia", "Darius", "Edda", "Elif", "Emeka", "Esme", "Farid", "Freya",
    "Gideon", "Greta", "Hana", "Hugo", "Idris", "Ilse", "Ines", "Ivo", "Jalen", "Jonas",
    "Katya", "Kofi", "Laila", "Lars", "Lena", "Lucan", "Mariam", "Marta", "Mateo", "Mei",
    "Milan", "Nadia", "Nils", "Noor", "Odile", "Oskar", "Pavel", "Priya", "Quentin",
    "Rafael", "Rhea", "Rosa", "Ruben", "Sanna", "Selim", "Sofia", "Tamsin", "Teodor",
    "Thea", "Tobias", "Ulla", "Valentin", "Vera", "Wendell", "Ximena", "Yara", "Yusuf",
    "Zofia", "Adaeze", "Bruno", "Cleo", "Dmitri", "Eamon", "Fenna", "Halima", "Joaquim",
    "Kiran", "Lotte", "Magnus", "Nerea", "Orla", "Petra", "Rasmus", "Saoirse", "Tariq",
)  # fmt: skip

_SURNAME_HEADS: tuple[str, ...] = (
    "Ash", "Bel", "Brom", "Cald", "Dorn", "Ell", "Fenn", "Gar", "Hal", "Ivers", "Kest",
    "Lind", "Mar", "Norr", "Ost", "Pell", "Quill", "Rand", "Sel", "Tarr", "Ulm", "Vass",
    "Wex", "Yor", "Zell", "Brenn", "Corv", "Dal", "Hask", "Morr", "Pryd", "Stav", "Thorn",
)  # fmt: skip
_SURNAME_TAILS: tuple[str, ...] = (
    "by", "ford", "wick", "mann", "sen", "ova", "ari", "eda", "ley", "ton", "strom",
    "berg", "ino", "ez", "ard", "elli", "ow", "ak", "ian", "ing",
)  # fmt: skip
SURNAMES: tuple[str, ...] = (
    "Okafor", "Varga", "Lindqvist", "Moreau", "Haddad", "Takeda", "Novak", "Quist",
    "Abara", "Rosales", "Kowalczyk", "Delacroix", "Mbeki", "Oyelaran", "Castellanos",
    "Brennan", "Falk", "Hoang", "Iversen", "Jablonski", "Kuznetsova", "Achterberg",
    "Nakamura", "Oduya", "Petrossian", "Rahimi", "Salonen", "Tavares", "Umarova",
    "Voskuijlen", "Wainwright", "Yilmaz", "Zapata", "Ferreira", "Gallardo", "Halvorsen",
)  # fmt: skip

_PLACE_HEADS: tuple[str, ...] = (
    "Ash", "Bryn", "Dorn", "Elm", "Fal", "Gran", "Hollis", "Kell", "Lark", "Mor",
    "Nether", "Oak", "Pen", "Rath", "Stav", "Thorn", "Vell", "Wick", "Yarrow", "Brack",
    "Cairn", "Drum", "Esk", "Fern", "Gill", "Harrow", "Ivel", "Kest", "Lun", "Mark",
    "Orm", "Quar", "Ros", "Sel", "Tav", "Ulver", "Var", "Wend", "Aldr", "Corr",
)  # fmt: skip
_PLACE_TAILS: tuple[str, ...] = (
    "holm", "vik", "ford", "bridge", "mouth", "stead", "haven", "ton", "by", "wick",
    "dale", "minster", "berg", "ridge", "port", "field", "moor", "water", "hurst", "sund",
)  # fmt: skip
_RIVER_NAMES: tuple[str, ...] = (
    "Aln", "Brae", "Cessa", "Dovra", "Elsk", "Fenn", "Galder", "Hessel", "Ilm", "Jura",
    "Kenna", "Lusk", "Marra", "Nidd", "Orra", "Pell", "Rane", "Sulva", "Tarn", "Vey",
)  # fmt: skip
_REGION_WORDS: tuple[str, ...] = ("Valley", "Coast", "Highlands", "Basin", "Plains", "Peninsula")

_COMPANY_HEADS: tuple[str, ...] = (
    "Brightwell", "Corvane", "Halden", "Meridel", "Northgate", "Quillon", "Ravel",
    "Solenne", "Tarrow", "Vantor", "Ardent", "Bellwether", "Cobalt Reach", "Driftmark",
    "Evenfall", "Fernhill", "Greystone", "Helix", "Ironleaf", "Juniper", "Keystrel",
    "Lumora", "Mistral", "Nortide", "Orrin", "Palisade", "Quarry Lane", "Redfern",
    "Silverbeck", "Tidewell", "Umbra", "Verity", "Westmoor", "Zephyrine",
)  # fmt: skip
_COMPANY_TAILS: tuple[str, ...] = (
    "Systems", "Foods", "Robotics", "Textiles", "Energy", "Logistics", "Pharma", "Labs",
    "Motors", "Analytics", "Materials", "Audio", "Outdoor", "Instruments", "Software",
)  # fmt: skip
_CLUB_TAILS: tuple[str, ...] = (
    "Rovers",
    "United",
    "Athletic",
    "City",
    "Harriers",
    "Wanderers",
    "FC",
)
_PRODUCT_MODELS: tuple[str, ...] = (
    "Aero", "Pulse", "Nimbus", "Vector", "Orbit", "Summit", "Echo", "Flux", "Strata",
    "Quill", "Tern", "Halo", "Nova", "Ridge", "Spark", "Lynx", "Atlas", "Wren",
)  # fmt: skip
_DRUG_HEADS: tuple[str, ...] = (
    "Zor",
    "Lem",
    "Vel",
    "Tarn",
    "Quel",
    "Mor",
    "Dax",
    "Fen",
    "Ost",
    "Cira",
    "Brev",
    "Nol",
)
_DRUG_TAILS: tuple[str, ...] = (
    "avil",
    "azine",
    "oxan",
    "ifex",
    "oprin",
    "amide",
    "estra",
    "ulin",
    "idone",
    "aprol",
)
_ADJECTIVES: tuple[str, ...] = (
    "Silver", "Hollow", "Quiet", "Golden", "Crimson", "Salt", "Copper", "Last", "Winter",
    "Painted", "Northern", "Hidden", "Little", "Amber", "Glass", "Paper", "Wandering",
)  # fmt: skip
_NOUNS: tuple[str, ...] = (
    "Harbour", "Lantern", "Orchard", "Compass", "Kettle", "Heron", "Garden", "Anchor",
    "Fox", "Meadow", "Tide", "Signal", "Ferry", "Spoon", "Owl", "Cellar", "Bell", "Thread",
)  # fmt: skip
_STREET_TAILS: tuple[str, ...] = ("Street", "Road", "Lane", "Avenue", "Quay", "Row", "Terrace")
CUISINES: tuple[str, ...] = (
    "Ethiopian", "Peruvian", "Georgian", "Vietnamese", "Lebanese", "Basque", "Korean",
    "Sicilian", "Oaxacan", "Nepalese", "Portuguese", "Malaysian", "Moroccan", "Ukrainian",
)  # fmt: skip
_BIRD_WORDS: tuple[str, ...] = (
    "warbler",
    "plover",
    "shrike",
    "bunting",
    "tern",
    "wagtail",
    "kestrel",
    "finch",
)
_BIRD_ADJ: tuple[str, ...] = (
    "marsh",
    "dune",
    "cliff",
    "reed",
    "copper",
    "grey-capped",
    "banded",
    "pale",
)
_AIRLINE_TAILS: tuple[str, ...] = ("Air", "Airways", "Wings", "Aviation", "Skylines")


def _syl(rng: random.Random, heads: tuple[str, ...], tails: tuple[str, ...]) -> str:
    while True:
        head = rng.choice(heads)
        tail = rng.choice(tails)
        if head.lower() != tail:  # no "Wickwick"
            break
    if head[-1] == tail[0]:
        tail = tail[1:]
    return head + tail


def surname(rng: random.Random) -> str:
    """An invented or uncommon surname."""
    if rng.random() < 0.45:
        return rng.choice(SURNAMES)
    return _syl(rng, _SURNAME_HEADS, _SURNAME_TAILS)


def person(rng: random.Random) -> str:
    """A fictional person: given name and surname."""
    return f"{rng.choice(FIRST_NAMES)} {surname(rng)}"


def town(rng: random.Random) -> str:
    """A fictional town, e.g. ``Larkhaven``."""
    return _syl(rng, _PLACE_HEADS, _PLACE_TAILS)


def river(rng: random.Random) -> str:
    """A fictional river name without the word river, e.g. ``Dovra``."""
    return rng.choice(_RIVER_NAMES)


def region(rng: random.Random) -> str:
    """A fictional region, e.g. ``the Esk Valley``."""
    return f"the {rng.choice(_PLACE_HEADS)} {rng.choice(_REGION_WORDS)}"


def company(rng: random.Random) -> str:
    """A fictional company, e.g. ``Corvane Robotics``."""
    return f"{rng.choice(_COMPANY_HEADS)} {rng.choice(_COMPANY_TAILS)}"


def brand(rng: random.Random) -> str:
    """A one-word fictional brand."""
    return rng.choice(_COMPANY_HEADS).split()[0]


def label(rng: random.Random) -> str:
    """A fictional record label, e.g. ``Driftmark Records``."""
    return f"{rng.choice(_COMPANY_HEADS)} {rng.choice(('Records', 'Music', 'Sound'))}"


def trust(rng: random.Random) -> str:
    """A fictional conservation charity, e.g. ``the Fernhill Wildlife Trust``."""
    return f"the {rng.choice(_COMPANY_HEADS)} {rng.choice(('Wildlife Trust', 'Nature Society', 'Conservation Fund'))}"


def foundation(rng: random.Random) -> str:
    """A fictional grant-giving foundation, e.g. ``the Redfern Foundation``."""
    return f"the {rng.choice(_COMPANY_HEADS)} {rng.choice(('Foundation', 'Trust', 'Arts Fund'))}"


def club(rng: random.Random) -> str:
    """A fictional sports club, e.g. ``Dornholm Rovers``."""
    return f"{town(rng)} {rng.choice(_CLUB_TAILS)}"


def university(rng: random.Random) -> str:
    """A fictional university or institute."""
    t = town(rng)
    return rng.choice(
        (f"University of {t}", f"{t} Institute of Technology", f"{t} College of Arts")
    )


def product(rng: random.Random) -> str:
    """A fictional product, e.g. ``Halden Nimbus 4``."""
    return f"{brand(rng)} {rng.choice(_PRODUCT_MODELS)} {rng.randint(2, 9)}"


def drug(rng: random.Random) -> str:
    """A fictional medicine name, e.g. ``Lemazine``."""
    return _syl(rng, _DRUG_HEADS, _DRUG_TAILS)


def title(rng: random.Random) -> str:
    """A fictional work title (book, album, film), e.g. ``The Quiet Lantern``."""
    adj, noun = rng.choice(_ADJECTIVES), rng.choice(_NOUNS)
    article = "An" if adj[0] in "AEIOU" else "A"
    place = _syl(rng, _PLACE_HEADS, _PLACE_TAILS)
    return rng.choice(
        (f"The {adj} {noun}", f"{adj} {noun}", f"{article} {adj} {noun}", f"The {noun} of {place}")
    )


def venue(rng: random.Random) -> str:
    """A fictional restaurant, cafe or bar name."""
    adj, noun = rng.choice(_ADJECTIVES), rng.choice(_NOUNS)
    first = rng.choice(FIRST_NAMES)
    return rng.choice(
        (
            f"The {adj} {noun}",
            f"{first}'s Kitchen",
            f"Cafe {noun}",
            f"{noun} & {rng.choice(_NOUNS)}",
        )
    )


def street(rng: random.Random) -> str:
    """A fictional street name, e.g. ``Heron Lane``."""
    return f"{rng.choice(_NOUNS + _PLACE_HEADS)} {rng.choice(_STREET_TAILS)}"


def cuisine(rng: random.Random) -> str:
    """A cuisine adjective."""
    return rng.choice(CUISINES)


def bird(rng: random.Random) -> str:
    """A fictional bird species, e.g. ``the reed shrike``."""
    return f"{rng.choice(_BIRD_ADJ)} {rng.choice(_BIRD_WORDS)}"


def airline(rng: random.Random) -> str:
    """A fictional airline."""
    return f"{rng.choice(_COMPANY_HEADS).split()[0]} {rng.choice(_AIRLINE_TAILS)}"


def ship(rng: random.Random) -> str:
    """A fictional ship name without a prefix, e.g. ``Amber Heron``."""
    return f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"


POOLS: dict[str, Callable[[random.Random], str]] = {
    "person": person,
    "surname": surname,
    "town": town,
    "river": river,
    "region": region,
    "company": company,
    "brand": brand,
    "label": label,
    "trust": trust,
    "foundation": foundation,
    "club": club,
    "university": university,
    "product": product,
    "drug": drug,
    "title": title,
    "venue": venue,
    "street": street,
    "cuisine": cuisine,
    "bird": bird,
    "airline": airline,
    "ship": ship,
}
"""Entity generators by kind; an entity swap draws its replacement from the same kind."""
