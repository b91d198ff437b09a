"""QA templates: one to three short passages, a question and an answer.

Each template writes a main passage (sometimes split over two passages) about a
fictional entity, picks one of several question/answer framings, and may append
unrelated background passages. Every answer carries number, date, entity and
contradiction slots plus insertion points (see :mod:`tools.corpus.compose`).
"""

from __future__ import annotations

from collections.abc import Callable

from tools.corpus.compose import Doc, Gen, Part, a_an, fdate, fnum, ordinal

_BUDGET = 1250  # passage characters; leaves room for the question and answer


def _doc(
    g: Gen, passages: list[str], question: str, response: list[Part], town: str | None = None
) -> Doc:
    """Add up to two unrelated background passages within the budget, in random places."""
    ps = list(passages)
    n_extra = min(g.pick_any((0, 0, 1, 1, 2)), 3 - len(ps))
    for _ in range(n_extra):
        extra = _background(g, town)
        if sum(map(len, ps)) + len(extra) > _BUDGET:
            break
        ps.insert(g.int(0, len(ps)), extra)
    return Doc(passages=tuple(ps), question=question, response=tuple(response))


def _background(g: Gen, town: str | None) -> str:
    t = town or g.town()
    k = g.int(0, 7)
    if k == 0:
        return (
            f"The ferry between {t} and {g.town()} runs {g.int(2, 9)} times a day in summer. "
            f"Tickets cost {g.int(4, 19)} crowns for adults; children under {g.int(5, 12)} travel free."
        )
    if k == 1:
        return (
            f"{t}'s weekly market is held on {g.pick(('Tuesdays', 'Thursdays', 'Saturdays'))} in "
            f"the old square. Around {g.int(30, 90)} stalls sell vegetables, cheese and hand-made goods."
        )
    if k == 2:
        return (
            f"The public library in {t} reopened in {g.int(1995, 2022)} after a refurbishment. "
            f"It holds about {fnum(g.int(20, 120) * 1000, 'comma')} books and is open six days a week."
        )
    if k == 3:
        return (
            f"Winters around {t} are mild, with January temperatures averaging {g.int(1, 7)} degrees. "
            f"Most of the region's {g.int(600, 1400)} millimetres of annual rain falls in autumn."
        )
    if k == 4:
        return (
            f"{g.fresh('club')} play their home games at a ground on the edge of {t}. The club "
            f"was promoted in {g.int(1990, 2023)} and has a capacity of {fnum(g.int(2, 18) * 500, 'comma')}."
        )
    if k == 5:
        return (
            f"The regional bus company {g.company()} operates {g.int(12, 60)} routes in and around "
            f"{t}. Its depot moved to a new site on {g.fresh('street')} in {g.int(2001, 2023)}."
        )
    if k == 6:
        return (
            f"{g.person()} was mayor of {t} from {(y := g.int(1960, 2005))} to {y + g.int(4, 12)}. "
            f"During that time the town's population grew to about {fnum(g.int(8, 60) * 1000, 'comma')}."
        )
    return (
        f"A farmers' cooperative near {t} produces cider from {g.int(9, 30)} apple varieties. "
        f"It was founded by {g.int(5, 20)} families and sells mostly to local shops."
    )


# --------------------------------------------------------------------------- templates


def landmark(g: Gen) -> Doc:
    """A lighthouse, tower or windmill: completion year, height, engineer, whether it still works."""
    town = g.town()
    kind = g.pick(("Lighthouse", "Clock Tower", "Water Tower", "Signal Tower", "Windmill"))
    site = g.pick(("a granite spur", "a low hill", "the old harbour wall", "a chalk ridge"))
    year, h, y2 = g.int(1820, 1935), g.int(14, 62), g.int(1950, 2015)
    eng = g.person()
    working = g.chance(0.5)
    status = (
        f"It is still in working order and is maintained by a volunteer society founded in {y2}."
        if working
        else f"It was taken out of service in {y2} and now houses a small museum."
    )
    p1 = (
        f"The {town} {kind} stands on {site} at the {g.pick(('northern', 'southern', 'eastern', 'western'))} "
        f"edge of {town}. It was completed in {year} to a design by the engineer {eng} and is "
        f"{h} metres tall. {status}"
    )
    flip = (
        g.flip("is still in working order", "is no longer in working order")
        if working
        else g.flip("was taken out of service", "is still in regular service")
    )
    add = g.add(
        detail=[
            f", and its lamp was last replaced in {g.int(1960, 2020)}",
            f", at a cost of {g.int(3, 40)},000 crowns",
        ],
        baseless=[
            ", which makes it the oldest structure of its kind in the region",
            ", largely because of the town's long seafaring history",
        ],
    )
    end = g.add(
        detail=[
            f" It was restored by the architect {g.person()}.",
            f" About {fnum(g.int(5, 40) * 1000, 'comma')} people visit it each year.",
        ],
        baseless=[
            " It remains the town's best-known landmark.",
            " Its design was widely copied along the coast.",
        ],
    )
    if g.chance(0.5):
        q = f"When was the {town} {kind} completed, and who designed it?"
        r: list[Part] = [
            "The ", g.ent(town, "town"), f" {kind} was completed in ", g.when(year), add,
            ". It was designed by the engineer ", g.ent(eng, "person"), ", is ", g.num(h),
            " metres tall and ", flip, ".", end,
        ]  # fmt: skip
    else:
        q = f"How tall is the {town} {kind}, and is it still in use?"
        r = [
            "It is ", g.num(h), " metres tall and ", flip, ". The ", kind.lower(), ", designed by ",
            g.ent(eng, "person"), ", was completed in ", g.when(year), add, ".", end,
        ]  # fmt: skip
    return _doc(g, [p1], q, r, town)


def bridge(g: Gen) -> Doc:
    """A road bridge: opening date, length, piers, engineer, river, toll (two passages)."""
    river, town, town2 = g.fresh("river"), g.town(), g.town()
    d = g.date(1890, 2012)
    length, spans, eng = g.int(12, 95) * 10, g.int(2, 9), g.person()
    cost = g.int(3, 90)
    toll = g.chance(0.5)
    p1 = (
        f"The {town} Bridge carries the coast road over the River {river} between {town} and "
        f"{town2}. It opened on {fdate(d, 'dmy')} and is {length} metres long, resting on {spans} stone piers. "
        f"The chief engineer was {eng}, and construction cost {cost} million crowns."
    )
    p2 = (
        f"Crossing the {town} Bridge {'costs a small toll for cars' if toll else 'is free for all traffic'}. "
        f"Cyclists use a separate lane added during repairs in {g.int(2013, 2023)}."
    )
    flip = (
        g.flip("charges a toll for cars", "is free for cars")
        if toll
        else g.flip("is free to cross", "charges a toll for cars")
    )
    add = g.add(
        detail=[", two years later than planned", f", in a ceremony led by {g.person()}"],
        baseless=[
            ", after decades of campaigning by local residents",
            ", which transformed trade between the two towns",
        ],
    )
    q = g.pick((
        f"When did the {town} Bridge open and how long is it?",
        f"What can you tell me about the bridge over the River {river}?",
    ))  # fmt: skip
    r: list[Part] = [
        "The ",
        g.ent(town, "town"),
        " Bridge over the River ",
        g.ent(river, "river"),
        " opened on ",
        g.when(d, "dmy"),
        add,
        ". It is ",
        g.num(length),
        " metres long, rests on ",
        g.num(spans),
        " piers, was engineered by ",
        g.ent(eng, "person"),
        " and ",
        flip,
        ".",
        g.add(
            detail=[f" It was widened in {g.int(1960, 2010)}."],
            baseless=[" It is considered an engineering landmark."],
        ),
    ]
    return _doc(g, [p1, p2], q, r, town)


def company_profile(g: Gen) -> Doc:
    """A manufacturer: founding year, founder, home town, staff, stock listing."""
    co, town, founder = g.company(), g.town(), g.person()
    year, staff = g.int(1952, 2005), g.int(3, 95) * 10
    product = g.pick(
        (
            "water pumps",
            "bicycle frames",
            "lab glassware",
            "weather sensors",
            "kitchen knives",
            "solar inverters",
        )
    )
    listed = g.chance(0.5)
    p1 = (
        f"{co} is a manufacturer of {product} based in {town}. The company was founded in {year} by "
        f"{founder}, who ran it until {g.int(year + 15, 2023)}. It employs about {staff} people and "
        f"{'is listed on the regional stock exchange' if listed else 'remains privately owned'}."
    )
    flip = (
        g.flip("is listed on the regional stock exchange", "is privately owned")
        if listed
        else g.flip("remains privately owned", "is listed on the regional stock exchange")
    )
    q = g.pick(
        (f"Who founded {co}, and when?", f"Where is {co} based and how many people work there?")
    )
    r: list[Part] = [
        g.ent(co, "company"),
        " was founded in ",
        g.when(year),
        " by ",
        g.ent(founder, "person"),
        g.add(
            detail=[
                f" with a loan of {g.int(2, 50)},000 crowns",
                f" in a rented garage on {g.fresh('street')}",
            ],
            baseless=[" after spotting a gap in the market"],
        ),
        ". It makes ",
        product,
        " in ",
        g.ent(town, "town"),
        ", employs about ",
        g.num(staff),
        " people and ",
        flip,
        ".",
        g.add(
            detail=[f" Its main customer is {g.company()}."],
            baseless=[
                " It is one of the largest employers in the area.",
                " Its products are known for their reliability.",
            ],
        ),
    ]
    return _doc(g, [p1], q, r, town)


def musician_bio(g: Gen) -> Doc:
    """A musician: debut and second album, label, sales, a prize (two passages)."""
    name, town, label = g.person(), g.town(), g.fresh("label")
    born = g.int(1948, 1996)
    album, album2 = g.fresh("title"), g.fresh("title")
    y1 = born + g.int(19, 27)
    y2 = y1 + g.int(2, 6)
    inst = g.pick(("cello", "accordion", "trumpet", "piano", "double bass", "violin"))
    sold = g.int(2, 60) * 1000
    won = g.chance(0.5)
    p1 = (
        f"{name} (born {born} in {town}) is {a_an(inst)} player and composer. The debut album, {album}, "
        f"was released in {y1} on the label {label} and sold about {fnum(sold, 'comma')} copies."
    )
    p2 = f"{name}'s second album, {album2}, followed in {y2}. " + (
        "It won the national folk music prize that year."
        if won
        else "It was nominated for the national folk music prize but did not win."
    )
    flip = (
        g.flip("won", "did not win") if won else g.flip("was nominated for but did not win", "won")
    )
    q = g.pick(
        (
            f"What was {name}'s debut album and when did it come out?",
            f"Tell me about the albums of {name}.",
        )
    )
    r: list[Part] = [
        g.ent(name, "person"),
        "'s debut album, ",
        g.ent(album, "title"),
        ", came out in ",
        g.when(y1),
        " on ",
        g.ent(label, "label"),
        " and sold about ",
        g.num(sold, "comma"),
        " copies",
        g.add(
            detail=[f", reaching number {g.int(2, 30)} in the charts"],
            baseless=[", helped by strong word of mouth"],
        ),
        ". The second album, ",
        album2,
        ", followed in ",
        g.when(y2),
        " and ",
        flip,
        " the national folk music prize.",
        g.add(
            detail=[f" {name.split()[0]} studied at the {g.fresh('university')}."],
            baseless=[" Both albums were praised by critics."],
        ),
    ]
    return _doc(g, [p1, p2], q, r, town)


def match_report(g: Gen) -> Doc:
    """A league match: score, weekday date, decisive goal minute, scorer, crowd."""
    home, away = g.fresh("club"), g.fresh("club")
    hs, as_ = g.int(2, 5), g.int(0, 1)
    scorer = g.person()
    minute, crowd = g.int(55, 89), g.int(3, 28) * 250
    d = g.date(2015, 2024)
    p1 = (
        f"{home} beat {away} {hs}-{as_} on {fdate(d, 'wdm')} in front of {fnum(crowd, 'comma')} spectators. "
        f"{scorer} scored the decisive goal in the {ordinal(minute)} minute from a corner. "
        f"The win lifts {home} to {g.pick(('third', 'fourth', 'fifth'))} place in the table."
    )
    q = g.pick(
        (
            f"Who scored the decisive goal for {home} against {away}?",
            f"How did {home}'s match against {away} end?",
        )
    )
    r: list[Part] = [
        g.ent(home, "club"),
        " ",
        g.flip("beat", "lost to", "drew with"),
        " ",
        g.ent(away, "club"),
        " ",
        g.num(hs),
        "-",
        g.num(as_, lo=0),
        " on ",
        g.when(d, "wdm"),
        ". ",
        g.ent(scorer, "person"),
        " scored the decisive goal after ",
        g.num(minute, lo=2),
        " minutes",
        g.add(
            detail=[f", a shot from {g.int(18, 30)} metres", " with a low shot"],
            baseless=[", against the run of play"],
        ),
        ", and the crowd was ",
        g.num(crowd, "comma"),
        ".",
        g.add(
            detail=[f" The referee was {g.person()}."],
            baseless=[" The result keeps their title hopes alive."],
        ),
    ]
    return _doc(g, [p1], q, r)


def gadget_spec(g: Gen) -> Doc:
    """A consumer device: battery life, weight, price, launch month, waterproofing."""
    prod, co = g.fresh("product"), g.company()
    kind = g.pick(("e-reader", "wireless speaker", "handheld GPS unit", "smartwatch", "tablet"))
    hours, weight, price = g.int(9, 60), g.int(14, 65) * 5, g.int(49, 399)
    d = g.date(2018, 2024)
    waterproof = g.chance(0.5)
    p1 = (
        f"The {prod} is a {kind} made by {co}. It went on sale in {fdate(d, 'month_year')} at {price} euros. "
        f"The battery lasts up to {hours} hours and the device weighs {weight} grams. "
        + (
            "It is waterproof to a depth of one metre."
            if waterproof
            else "It is not waterproof, so the maker advises keeping it away from rain."
        )
    )
    p2 = f"Reviewers noted that the {prod} charges over USB-C and ships without a charger in the box."
    flip = (
        g.flip("is waterproof", "is not waterproof")
        if waterproof
        else g.flip("is not waterproof", "is waterproof")
    )
    q = g.pick(
        (
            f"How long does the battery of the {prod} last?",
            f"What are the main specifications of the {prod}?",
        )
    )
    r: list[Part] = [
        "The ",
        g.ent(prod, "product"),
        ", a ",
        kind,
        " from ",
        g.ent(co, "company"),
        ", lasts up to ",
        g.num(hours),
        " hours on a charge",
        g.add(
            detail=[" with the screen at half brightness"],
            baseless=[", which is better than most rivals"],
        ),
        ". It weighs ",
        g.num(weight),
        " grams, costs ",
        g.num(price),
        " euros, went on sale in ",
        g.when(d, "month_year"),
        " and ",
        flip,
        ".",
        g.add(
            detail=[f" It comes in {g.int(3, 6)} colours."],
            baseless=[" It is aimed mainly at travellers."],
        ),
    ]
    return _doc(g, [p1, p2], q, r)


def medicine_leaflet(g: Gen) -> Doc:
    """A patient leaflet: dose, times a day, food, age limit, daily maximum."""
    drug = g.fresh("drug")
    cond = g.pick(
        (
            "seasonal hay fever",
            "mild to moderate joint pain",
            "tension headaches",
            "acid reflux",
            "minor skin inflammation",
        )
    )
    mg, times, maxd = g.pick_any((5, 10, 20, 25, 50, 100, 200)), g.int(2, 3), g.int(3, 8)
    food = g.chance(0.5)
    age = g.pick_any((6, 12, 16, 18))
    p1 = (
        f"{drug} tablets are used to treat {cond}. Adults and children over {age} take one {mg} mg "
        f"tablet {times} times a day, {'with food' if food else 'on an empty stomach, an hour before a meal'}. "
        f"Do not take more than {maxd} tablets in 24 hours. If symptoms last longer than "
        f"{g.int(3, 10)} days, talk to a pharmacist."
    )
    p2 = (
        f"Common side effects of {drug} include {g.pick(('drowsiness', 'a dry mouth', 'mild nausea'))} and "
        f"{g.pick(('headache', 'dizziness', 'an upset stomach'))}. Store below {g.pick_any((25, 30))} degrees."
    )
    flip = (
        g.flip("with food", "on an empty stomach")
        if food
        else g.flip("on an empty stomach", "with food")
    )
    q = g.pick((f"How should {drug} be taken?", f"What is the dose of {drug} for adults?"))
    r: list[Part] = [
        "Take one ",
        g.num(mg),
        " mg tablet of ",
        g.ent(drug, "drug"),
        " ",
        g.num(times, lo=2),
        " times a day ",
        flip,
        g.add(
            detail=[", with a full glass of water"], baseless=[", which helps the body absorb it"]
        ),
        ". It is meant for adults and children over ",
        g.num(age),
        ", and you should not take more than ",
        g.num(maxd),
        " tablets in 24 hours.",
        g.add(
            detail=[" Avoid alcohol while taking it."],
            baseless=[" Most people feel better within a day."],
        ),
    ]
    return _doc(g, [p1, p2], q, r)


def field_study(g: Gen) -> Doc:
    """A bird-tracking study: university, lead author, sample size, percentage, year."""
    bird, uni, lead = g.fresh("bird"), g.fresh("university"), g.person()
    region = g.fresh("region")
    n, pct = g.int(12, 90) * 10, g.int(11, 68)
    y = g.int(2009, 2023)
    months = g.int(8, 30)
    rose = g.chance(0.5)
    p1 = (
        f"Researchers at the {uni} tracked {n} {bird}s in {region} over {months} months. "
        f"The study, led by {lead} and published in {y}, found that {pct} percent of the birds "
        f"{'returned to the same nesting site' if rose else 'moved to a new nesting site'} the following spring."
    )
    p2 = f"The {bird} feeds mainly on insects and weighs less than {g.int(12, 40)} grams."
    flip = (
        g.flip("returned to the same nesting site", "moved to a new nesting site")
        if rose
        else g.flip("moved to a new nesting site", "returned to the same nesting site")
    )
    q = g.pick(
        (
            f"What did the {uni} study of the {bird} find?",
            f"How many {bird}s were tracked, and by whom?",
        )
    )
    r: list[Part] = [
        "The study, led by ",
        g.ent(lead, "person"),
        " at the ",
        g.ent(uni, "university"),
        " and published in ",
        g.when(y),
        ", tracked ",
        g.num(n),
        " ",
        bird,
        "s in ",
        g.ent(region, "region"),
        " for ",
        g.num(months),
        " months. It found that ",
        g.num(pct, hi=99),
        " percent of them ",
        flip,
        " the following spring",
        g.add(
            detail=[
                ", mostly within a few days of each other",
                f", using tags weighing under {g.int(1, 3)} grams",
            ],
            baseless=[", probably because food was plentiful there"],
        ),
        ".",
        g.add(
            detail=[f" The work was funded by {g.company()}."],
            baseless=[" The results suggest the species is recovering."],
        ),
    ]
    return _doc(g, [p1, p2], q, r)


def exhibition(g: Gen) -> Doc:
    """A museum exhibition: opening date, objects, curator, ticket price, child tickets."""
    town = g.town()
    museum = (
        f"{town} {g.pick(('Museum of Art', 'City Museum', 'Textile Museum', 'Maritime Museum'))}"
    )
    theme = g.pick(
        (
            "early photography",
            "woven tapestries",
            "ship models",
            "botanical drawings",
            "folk costumes",
        )
    )
    curator = g.person()
    d1 = g.date(2019, 2025)
    nobj, price = g.int(40, 400), g.int(6, 22)
    free_kids = g.chance(0.5)
    p1 = (
        f"A new exhibition of {theme} opens at the {museum} on {fdate(d1, 'dmy')}. Curated by {curator}, it brings "
        f"together {nobj} objects, many never shown before. Tickets cost {price} euros"
        + (
            ", and entry is free for children under 12."
            if free_kids
            else "; children pay half price."
        )
    )
    flip = (
        g.flip("free for children under 12", "half price for children")
        if free_kids
        else g.flip("half price for children", "free for children")
    )
    q = g.pick(
        (
            f"When does the {theme} exhibition open at the {museum}?",
            f"How much are tickets for the new exhibition at the {museum}?",
        )
    )
    r: list[Part] = [
        "The exhibition opens at the ",
        g.ent(town, "town"),
        museum[len(town) :],
        " on ",
        g.when(d1, "dmy"),
        g.add(
            detail=[f" and runs for {g.int(3, 9)} months"],
            baseless=[", timed to coincide with the museum's anniversary"],
        ),
        ". It shows ",
        g.num(nobj),
        " objects curated by ",
        g.ent(curator, "person"),
        ". Tickets cost ",
        g.num(price),
        " euros and are ",
        flip,
        ".",
        g.add(
            detail=[f" A catalogue is available for {g.int(20, 45)} euros."],
            baseless=[" It is expected to draw large crowds."],
        ),
    ]
    return _doc(g, [p1], q, r, town)


def council_vote(g: Gen) -> Doc:
    """A town-council decision: approved/rejected, vote count, budget, start year."""
    town = g.town()
    plan = g.pick(
        (
            "a new cycle network",
            "the renovation of the swimming baths",
            "a riverside park",
            "extra street lighting",
            "a car-free market square",
        )
    )
    budget = g.real(1.2, 18.0)
    yes, no = g.int(12, 24), g.int(3, 10)
    d = g.date(2020, 2025)
    start = d.year + g.int(1, 2)
    leader = g.person()
    approved = g.chance(0.6)
    p1 = (
        f"{town} town council has {'approved' if approved else 'rejected'} plans for {plan}, with {yes if approved else no} votes "
        f"in favour and {no if approved else yes} against, at its meeting on {fdate(d, 'dmy')}. The project has a budget of "
        f"{budget:.1f} million crowns. Council leader {leader} said work "
        + (
            f"would begin in {start}."
            if approved
            else f"could not begin before {start} in any case."
        )
    )
    fav, ag = (yes, no) if approved else (no, yes)
    flip = g.flip("approved", "rejected") if approved else g.flip("rejected", "approved")
    q = g.pick(
        (f"What did {town} council decide about {plan}?", f"How did the {town} council vote go?")
    )
    r: list[Part] = [
        g.ent(town, "town"),
        " council ",
        flip,
        " the plans on ",
        g.when(d, "dmy"),
        " by ",
        g.num(fav),
        " votes to ",
        g.num(ag),
        g.add(
            detail=[f" after a {g.int(2, 5)}-hour debate"],
            baseless=[
                ", reflecting strong public support"
                if approved
                else ", despite strong public support"
            ],
        ),
        ". The project's budget is ",
        g.num(budget, "1f"),
        " million crowns, and council leader ",
        g.ent(leader, "person"),
        " said work ",
        "would begin in " if approved else "could not have begun before ",
        g.when(start),
        ".",
        g.add(
            detail=[f" Construction will be carried out by {g.company()}."],
            baseless=[" The decision is likely to be challenged."],
        ),
    ]
    return _doc(g, [p1], q, r, town)


def recipe(g: Gen) -> Doc:
    """A baking recipe: oven temperature, minutes, servings, cookbook year, resting."""
    chef, town = g.person(), g.town()
    dish = g.pick(
        (
            "rye and caraway loaf",
            "plum and almond tart",
            "barley and mushroom pie",
            "honey oat biscuits",
            "pumpkin flatbread",
        )
    )
    temp, mins, serves = g.int(16, 23) * 10, g.int(20, 75), g.int(4, 12)
    y = g.int(1958, 2012)
    rest = g.chance(0.5)
    p1 = (
        f"This {dish} comes from {chef}'s cookbook, first published in {y}. Bake it at {temp} degrees for {mins} minutes, "
        f"until golden. The recipe serves {serves}. "
        + (
            "Let it rest for ten minutes before cutting."
            if rest
            else "Serve it straight from the oven; it does not need to rest."
        )
    )
    p2 = f"{chef} ran a bakery in {town} for many years and taught cookery classes at the local college."
    flip = (
        g.flip("let it rest", "serve it immediately")
        if rest
        else g.flip("no resting time is needed", "it must rest first")
    )
    q = g.pick(
        (
            f"How long should I bake the {dish}, and at what temperature?",
            f"How many people does {chef}'s {dish} serve?",
        )
    )
    r: list[Part] = [
        "Bake the ",
        dish,
        " at ",
        g.num(temp),
        " degrees for ",
        g.num(mins),
        " minutes",
        g.add(
            detail=[" on the middle shelf", ", turning the tray halfway"],
            baseless=[", which gives it a crisp crust"],
        ),
        ". The recipe, from ",
        g.ent(chef, "person"),
        "'s cookbook published in ",
        g.when(y),
        ", serves ",
        g.num(serves),
        ", and ",
        flip,
        ".",
        g.add(
            detail=[" It keeps for three days in a tin."],
            baseless=[" It is a traditional dish from the area."],
        ),
    ]
    return _doc(g, [p1, p2], q, r, town)


def rail_line(g: Gen) -> Doc:
    """A railway line: operator, journey time, frequency, length, opening year, traction."""
    a, b, op = g.town(), g.town(), g.company()
    y = g.int(1862, 1990)
    km, mins, per_hour = g.int(18, 140), g.int(20, 110), g.int(1, 4)
    electrified = g.chance(0.5)
    p1 = (
        f"The {a}-{b} railway opened in {y} and is {km} kilometres long. Trains are run by {op} and "
        f"take {mins} minutes for the full journey, with {per_hour} departures an hour at peak times. "
        + (
            "The line was electrified in " + str(g.int(1991, 2020)) + "."
            if electrified
            else "The line is not electrified and uses diesel trains."
        )
    )
    flip = (
        g.flip("is electrified", "is not electrified")
        if electrified
        else g.flip("uses diesel trains", "is electrified")
    )
    q = g.pick(
        (
            f"How long does the train from {a} to {b} take?",
            f"Who runs the trains between {a} and {b}?",
        )
    )
    r: list[Part] = [
        "Trains between ",
        g.ent(a, "town"),
        " and ",
        b,
        " are run by ",
        g.ent(op, "company"),
        " and take ",
        g.num(mins),
        " minutes",
        g.add(
            detail=[f", stopping at {g.int(3, 9)} stations"],
            baseless=[", which is faster than driving"],
        ),
        ". There are ",
        g.num(per_hour),
        " departures an hour at peak times. The ",
        g.num(km),
        "-kilometre line opened in ",
        g.when(y),
        " and ",
        flip,
        ".",
        g.add(
            detail=[f" A return ticket costs {g.int(8, 40)} euros."],
            baseless=[" It is popular with commuters."],
        ),
    ]
    return _doc(g, [p1], q, r, a)


def college_history(g: Gen) -> Doc:
    """A university: founding year, founder, students, faculties, rector (two passages)."""
    uni, founder = g.fresh("university"), g.person()
    y = g.int(1830, 1975)
    students, fac = g.int(30, 280) * 100, g.int(4, 12)
    rector = g.person()
    y2 = g.int(2014, 2023)
    women = g.int(y + 5, max(y + 5, 1965))
    p1 = (
        f"The {uni} was founded in {y} by {founder} as a school for surveyors and engineers. It admitted "
        f"its first women students in {women}. Today it has {fnum(students, 'comma')} students in {fac} faculties."
    )
    p2 = f"{rector} became rector of the {uni} in {y2}, the first rector trained as a chemist."
    q = g.pick(
        (
            f"When was the {uni} founded and how many students does it have?",
            f"Who leads the {uni} today?",
        )
    )
    r: list[Part] = [
        "The ",
        g.ent(uni, "university"),
        " was founded in ",
        g.when(y),
        " by ",
        g.ent(founder, "person"),
        g.add(
            detail=[f" with a gift of {g.int(2, 30)} hectares of land"],
            baseless=[" to meet growing demand for engineers"],
        ),
        ". It has ",
        g.num(students, "comma"),
        " students in ",
        g.num(fac),
        " faculties and admitted its first women in ",
        g.when(women),
        ". Its rector since ",
        g.when(y2),
        " is ",
        g.ent(rector, "person"),
        ", ",
        g.flip(
            "the first rector trained as a chemist", "one of several rectors trained as chemists"
        ),
        ".",
        g.add(
            detail=[" Its main library holds over a million volumes."],
            baseless=[" It is well regarded for engineering."],
        ),
    ]
    return _doc(g, [p1, p2], q, r)


def treaty_history(g: Gen) -> Doc:
    """A historical treaty: signing date, parties, envoys, subject, duration."""
    a, b, c = g.town(), g.town(), g.town()
    d = g.date(1450, 1890)
    envoy, envoy2 = g.person(), g.person()
    years = g.int(12, 80)
    tolls = g.pick(("river tolls", "fishing rights", "grazing rights", "salt duties"))
    p1 = (
        f"The Treaty of {c} was signed on {fdate(d, 'dmy')} by the cities of {a} and {b}. It ended a long dispute "
        f"over {tolls} and was negotiated by {envoy} for {a} and {envoy2} for {b}. The treaty held for {years} years."
    )
    p2 = f"{c} was chosen as the meeting place because it lay halfway between the two cities."
    q = g.pick(
        (
            f"When was the Treaty of {c} signed, and between whom?",
            f"What was the Treaty of {c} about?",
        )
    )
    r: list[Part] = [
        "The Treaty of ",
        g.ent(c, "town"),
        " was signed on ",
        g.when(d, "dmy"),
        " by ",
        g.ent(a, "town"),
        " and ",
        b,
        ". It ",
        g.flip("ended", "began", "renewed"),
        " their dispute over ",
        tolls,
        g.add(
            detail=[
                f" after {g.int(3, 14)} months of talks",
                f", with a payment of {g.int(2, 40)},000 silver coins",
            ],
            baseless=[", a victory for the smaller city"],
        ),
        ". ",
        g.ent(envoy, "person"),
        " negotiated for ",
        a,
        ", and the treaty held for ",
        g.num(years),
        " years.",
        g.add(
            detail=[f" The original copy is kept in the {b} archive."],
            baseless=[" It is seen as a model of medieval diplomacy."],
        ),
    ]
    return _doc(g, [p1, p2], q, r)


def film_release(g: Gen) -> Doc:
    """A film: director, premiere date, festival, outcome, runtime, budget."""
    title, director, studio = g.fresh("title"), g.person(), g.company()
    d = g.date(2008, 2024)
    mins, budget, prize = g.int(84, 168), g.real(1.5, 40.0), g.chance(0.5)
    town = g.town()
    p1 = (
        f"{title} is a drama directed by {director} and produced by {studio}. It premiered on {fdate(d, 'mdy')} at the "
        f"{town} Film Festival, where it {'won the audience award' if prize else 'was shown out of competition'}. "
        f"The film runs {mins} minutes and was made for {budget:.1f} million euros."
    )
    flip = (
        g.flip("won the audience award", "was shown out of competition")
        if prize
        else g.flip("was shown out of competition", "won the audience award")
    )
    q = g.pick(
        (
            f"Who directed {title}, and when did it premiere?",
            f"What do we know about the film {title}?",
        )
    )
    r: list[Part] = [
        g.ent(title, "title"),
        " was directed by ",
        g.ent(director, "person"),
        " and premiered on ",
        g.when(d, "mdy"),
        " at the ",
        g.ent(town, "town"),
        " Film Festival, where it ",
        flip,
        ". It runs ",
        g.num(mins),
        " minutes and cost ",
        g.num(budget, "1f"),
        " million euros",
        g.add(
            detail=[f", shot over {g.int(20, 70)} days"],
            baseless=[", a modest sum for such an ambitious film"],
        ),
        ".",
        g.add(
            detail=[f" The lead role is played by {g.person()}."],
            baseless=[" It was a commercial success."],
        ),
    ]
    return _doc(g, [p1], q, r, town)


def mountain(g: Gen) -> Doc:
    """A mountain: height, first ascent year and climber, glacier, hut altitude."""
    peak = f"Mount {g.fresh('surname')}"
    region = g.fresh("region")
    h, climber = g.int(1800, 5200), g.person()
    y = g.int(1850, 1960)
    glacier = g.chance(0.5)
    hut_h = g.int(900, h - 400)
    p1 = (
        f"{peak} is the highest summit in {region}, at {fnum(h, 'comma')} metres. It was first climbed in {y} by {climber} "
        f"and two local guides. "
        + (
            "A glacier still covers its northern face."
            if glacier
            else "Its glacier disappeared during the twentieth century."
        )
    )
    p2 = f"A mountain hut at {fnum(hut_h, 'comma')} metres is open from June to September and sleeps 40 people."
    flip = (
        g.flip("still has a glacier on its northern face", "has lost its glacier")
        if glacier
        else g.flip("has lost its glacier", "still has a glacier")
    )
    q = g.pick(
        (f"How high is {peak}, and who climbed it first?", f"When was {peak} first climbed?")
    )
    r: list[Part] = [
        peak,
        ", the highest summit in ",
        g.ent(region, "region"),
        ", is ",
        g.num(h, "comma"),
        " metres high. It was first climbed in ",
        g.when(y),
        " by ",
        g.ent(climber, "person"),
        g.add(
            detail=[" via the east ridge", f" after {g.int(2, 5)} failed attempts"],
            baseless=[", a remarkable feat for the time"],
        ),
        " and two local guides, and it ",
        flip,
        ". A hut at ",
        g.num(hut_h, "comma"),
        " metres is open in summer.",
        g.add(
            detail=[" The climb takes about two days."],
            baseless=[" It is a popular goal for experienced climbers."],
        ),
    ]
    return _doc(g, [p1, p2], q, r)


def software_release(g: Gen) -> Doc:
    """A software release: version, date, languages, installer size, Linux support."""
    co = g.company()
    app = g.fresh(
        lambda r: (
            r.choice(("Ledger", "Canvas", "Relay", "Harbor", "Sketch", "Tally"))
            + r.choice(("ly", "io", "Pad", "Desk", "Kit"))
        )
    )
    major, minor = g.int(2, 14), g.int(0, 9)
    d = g.date(2019, 2025)
    langs, mb = g.int(8, 40), g.int(40, 480)
    linux = g.chance(0.5)
    p1 = (
        f"{co} released version {major}.{minor} of {app}, its note-taking app, on {fdate(d, 'dmy')}. The update adds offline sync "
        f"and support for {langs} languages. The installer is {mb} MB. "
        + ("The app now also runs on Linux." if linux else "There is still no Linux version.")
    )
    flip = (
        g.flip("now runs on Linux", "still has no Linux version")
        if linux
        else g.flip("still has no Linux version", "now runs on Linux")
    )
    q = g.pick(
        (
            f"What is new in version {major}.{minor} of {app}?",
            f"When did {co} release the new version of {app}?",
        )
    )
    r: list[Part] = [
        g.ent(co, "company"),
        " released ",
        app,
        " ",
        g.num(float(f"{major}.{minor}"), "1f"),
        " on ",
        g.when(d, "dmy"),
        ". It adds offline sync and support for ",
        g.num(langs),
        " languages",
        g.add(
            detail=[", plus a new dark theme"],
            baseless=[", features users had requested for years"],
        ),
        ", the installer is ",
        g.num(mb),
        " MB, and the app ",
        flip,
        ".",
        g.add(
            detail=[f" It costs {g.int(3, 12)} euros a month."],
            baseless=[" The update should win back users."],
        ),
    ]
    return _doc(g, [p1], q, r)


def hotel_opening(g: Gen) -> Doc:
    """A new hotel: opening month, owner, rooms, price, pets."""
    town = g.town()
    hotel = f"Hotel {g.fresh('surname')}"
    owner = g.person()
    rooms, price = g.int(12, 180), g.int(70, 340)
    d = g.date(2016, 2025)
    pets = g.chance(0.5)
    p1 = (
        f"The {hotel} opened in a former {g.pick(('grain store', 'post office', 'textile mill', 'customs house'))} in {town} "
        f"in {fdate(d, 'month_year')}. Owner {owner} converted the building into {rooms} rooms, with doubles from {price} euros a night. "
        + ("Dogs are welcome." if pets else "Pets are not allowed.")
    )
    flip = (
        g.flip("welcomes dogs", "does not allow pets")
        if pets
        else g.flip("does not allow pets", "welcomes dogs")
    )
    q = g.pick(
        (
            f"How many rooms does the {hotel} in {town} have?",
            f"When did the {hotel} open, and what does a room cost?",
        )
    )
    r: list[Part] = [
        "The ",
        hotel,
        " in ",
        g.ent(town, "town"),
        " opened in ",
        g.when(d, "month_year"),
        ". ",
        g.ent(owner, "person"),
        " converted the building into ",
        g.num(rooms),
        " rooms",
        g.add(
            detail=[", each with a balcony"], baseless=[", keeping much of its historic character"]
        ),
        ", doubles start at ",
        g.num(price),
        " euros a night, and the hotel ",
        flip,
        ".",
        g.add(
            detail=[" Breakfast is included."],
            baseless=[" It has quickly become fully booked most weekends."],
        ),
    ]
    return _doc(g, [p1], q, r, town)


def bird_species(g: Gen) -> Doc:
    """A bird species: clutch size, wingspan, season, survey year, pairs, trend."""
    bird = g.fresh("bird")
    region = g.fresh("region")
    wing, eggs, pairs = g.int(18, 64), g.int(2, 7), g.int(2, 90) * 100
    m1 = g.pick(("March", "April", "May"))
    m2 = g.pick(("September", "October", "November"))
    y = g.int(2005, 2023)
    declining = g.chance(0.5)
    p1 = (
        f"The {bird} breeds in {region} from {m1} to {m2}. It has a wingspan of {wing} centimetres and lays {eggs} eggs "
        f"per clutch. A survey in {y} counted about {fnum(pairs, 'comma')} breeding pairs, "
        + (
            "fewer than in the previous survey."
            if declining
            else "more than in the previous survey."
        )
    )
    flip = g.flip("fewer", "more") if declining else g.flip("more", "fewer")
    q = g.pick((f"How many eggs does the {bird} lay?", f"How many {bird}s breed in {region}?"))
    r: list[Part] = [
        "The ",
        g.ent(bird, "bird"),
        " lays ",
        g.num(eggs),
        " eggs per clutch and has a wingspan of ",
        g.num(wing),
        " centimetres. It breeds in ",
        g.ent(region, "region"),
        " from ",
        m1,
        " to ",
        m2,
        g.add(detail=[", nesting in reed beds"], baseless=[", when insects are most abundant"]),
        ". A ",
        g.when(y),
        " survey counted about ",
        g.num(pairs, "comma"),
        " breeding pairs, ",
        flip,
        " than before.",
        g.add(
            detail=[" It winters in coastal marshes to the south."],
            baseless=[" Habitat loss is the main threat."],
        ),
    ]
    return _doc(g, [p1], q, r)


def festival(g: Gen) -> Doc:
    """A town festival: start date, length, headliner, ticket price, visitors, camping."""
    town = g.town()
    kind = g.pick(("jazz", "folk", "street theatre", "kite", "lantern", "choir"))
    d = g.date(2017, 2025)
    days, visitors, price = g.int(2, 6), g.int(4, 80) * 1000, g.int(15, 95)
    head = g.person()
    camping = g.chance(0.5)
    p1 = (
        f"The {town} {kind} festival begins on {fdate(d, 'dmy')} and lasts {days} days. Organisers expect about "
        f"{fnum(visitors, 'comma')} visitors. This year's headline act is {head}. A day ticket costs {price} euros. "
        + (
            "Camping is available next to the main stage."
            if camping
            else "There is no camping on site this year."
        )
    )
    flip = (
        g.flip("camping is available", "there is no camping")
        if camping
        else g.flip("there is no camping on site", "camping is available on site")
    )
    q = g.pick(
        (
            f"When is the {town} {kind} festival and who is headlining?",
            f"How much is a ticket for the {town} {kind} festival?",
        )
    )
    r: list[Part] = [
        "The ",
        g.ent(town, "town"),
        f" {kind} festival starts on ",
        g.when(d, "dmy"),
        " and runs for ",
        g.num(days),
        " days, with ",
        g.ent(head, "person"),
        " as the headline act",
        g.add(detail=[" on the closing night"], baseless=[", a big draw for younger audiences"]),
        ". A day ticket costs ",
        g.num(price),
        " euros, about ",
        g.num(visitors, "comma"),
        " visitors are expected, and ",
        flip,
        ".",
        g.add(
            detail=[f" Shuttle buses run from {g.town()}."],
            baseless=[" Tickets usually sell out quickly."],
        ),
    ]
    return _doc(g, [p1], q, r, town)


def space_probe(g: Gen) -> Doc:
    """A space probe: builder, launch date, target, mass, cruise time, lander."""
    probe = (
        g.pick(("Kestrel", "Lyra", "Tamsin", "Corvid", "Halcyon", "Meridian"))
        + "-"
        + str(g.int(1, 9))
    )
    agency = g.company()
    d = g.date(2015, 2026)
    months, kg = g.int(7, 60), g.int(180, 2400)
    target = g.pick(
        (
            "the asteroid 4417 Brannoc",
            "the comet Vessel-Hart",
            "the moon Ilara",
            "the asteroid 2291 Quorne",
        )
    )
    lead = g.person()
    landed = g.chance(0.5)
    p1 = (
        f"The {probe} probe, built by {agency}, launched on {fdate(d, 'dmy')} towards {target}. It weighs {kg} kilograms "
        f"and needed {months} months to reach its target. Mission scientist {lead} said the probe "
        + (
            "carried a small lander."
            if landed
            else "carried no lander and studied the surface from orbit."
        )
    )
    flip = (
        g.flip("carried a small lander", "carried no lander")
        if landed
        else g.flip("had no lander", "carried a lander")
    )
    q = g.pick((f"When did the {probe} probe launch?", f"What is the {probe} mission?"))
    r: list[Part] = [
        "The ",
        probe,
        " probe, built by ",
        g.ent(agency, "company"),
        ", launched on ",
        g.when(d, "dmy"),
        " towards ",
        target,
        ". It weighs ",
        g.num(kg, "comma"),
        " kilograms, took ",
        g.num(months),
        " months to arrive",
        g.add(
            detail=[" after a flyby of Mars", f" and cost {g.int(80, 900)} million euros"],
            baseless=[", a journey that tested the limits of its design"],
        ),
        " and ",
        flip,
        ", according to ",
        g.ent(lead, "person"),
        ".",
        g.add(
            detail=[" Its camera was supplied by a partner agency."],
            baseless=[" The mission is expected to reshape theories of the early solar system."],
        ),
    ]
    return _doc(g, [p1], q, r)


def quarterly_results(g: Gen) -> Doc:
    """Company results: revenue, quarter and year, change up/down, new outlets."""
    co, ceo = g.company(), g.person()
    q_ = g.int(1, 4)
    y = g.int(2016, 2025)
    rev, pct, shops = g.real(12.0, 480.0), g.int(2, 24), g.int(20, 400)
    up = g.chance(0.5)
    p1 = (
        f"{co} reported revenue of {rev:.1f} million euros for the {('first', 'second', 'third', 'fourth')[q_ - 1]} quarter of {y}, "
        f"{'up' if up else 'down'} {pct} percent on a year earlier. Chief executive {ceo} said the company would open "
        f"{shops} new outlets next year."
    )
    flip = g.flip("up", "down") if up else g.flip("down", "up")
    q = g.pick((f"How did {co} do in its latest quarter?", f"What revenue did {co} report?"))
    r: list[Part] = [
        g.ent(co, "company"),
        " reported revenue of ",
        g.num(rev, "1f"),
        " million euros for the ",
        ("first", "second", "third", "fourth")[q_ - 1],
        " quarter of ",
        g.when(y),
        ", ",
        flip,
        " ",
        g.num(pct, hi=99),
        " percent on a year earlier",
        g.add(
            detail=[f", with profits of {g.int(2, 40)} million"],
            baseless=[", driven by strong online sales"],
        ),
        ". Chief executive ",
        g.ent(ceo, "person"),
        " plans to open ",
        g.num(shops),
        " new outlets next year.",
        g.add(
            detail=[" The company's shares rose after the announcement."],
            baseless=[" Analysts see this as a turning point."],
        ),
    ]
    return _doc(g, [p1], q, r)


def hospital_wing(g: Gen) -> Doc:
    """A hospital wing: opening date, beds, cost, director, new staff."""
    town = g.town()
    hosp = f"{town} General Hospital"
    beds, cost = g.int(20, 160), g.real(4.0, 95.0)
    d = g.date(2018, 2026)
    director = g.person()
    dept = g.pick(("children's", "maternity", "cancer care", "rehabilitation", "emergency"))
    staff = g.int(40, 400)
    p1 = (
        f"{hosp} opened its new {dept} wing on {fdate(d, 'dmy')}. The wing has {beds} beds and cost {cost:.1f} million euros. "
        f"Hospital director {director} said {staff} new staff had been hired. The old wing will be demolished."
    )
    q = g.pick(
        (
            f"How many beds does the new wing at {hosp} have?",
            f"When did {hosp} open its new {dept} wing?",
        )
    )
    r: list[Part] = [
        g.ent(town, "town"),
        " General Hospital opened its new ",
        dept,
        " wing on ",
        g.when(d, "dmy"),
        ". It has ",
        g.num(beds),
        " beds and cost ",
        g.num(cost, "1f"),
        " million euros",
        g.add(
            detail=[", paid for partly by a private donor"],
            baseless=[", which should shorten waiting times"],
        ),
        ". Director ",
        g.ent(director, "person"),
        " said ",
        g.num(staff),
        " new staff were hired, and the old wing ",
        g.flip("will be demolished", "will be kept in use"),
        ".",
        g.add(
            detail=[f" The building was designed by {g.company()}."],
            baseless=[" Patients have welcomed the change."],
        ),
    ]
    return _doc(g, [p1], q, r, town)


def election(g: Gen) -> Doc:
    """A mayoral election: winner, runner-up, votes, turnout, party history."""
    town = g.town()
    winner, loser = g.person(), g.person()
    party = g.pick(("Green", "Liberal", "Labour", "Civic", "Farmers'"))
    v1 = g.int(3000, 24000)
    v2 = v1 - g.int(80, 2500)
    turnout = g.int(38, 81)
    d = g.date(2014, 2025)
    first = g.chance(0.5)
    p1 = (
        f"{winner} of the {party} party won the {town} mayoral election on {fdate(d, 'dmy')} with {fnum(v1, 'comma')} votes. "
        f"The runner-up, {loser}, received {fnum(v2, 'comma')} votes. Turnout was {turnout} percent. "
        + (
            f"{winner.split()[0]} is the first {party} mayor of {town}."
            if first
            else f"The {party} party has held the post before."
        )
    )
    flip = (
        g.flip("is the first", "is not the first")
        if first
        else g.flip("has held the post before", "had never held the post")
    )
    q = g.pick(
        (
            f"Who won the {town} mayoral election?",
            f"What was the result of the mayoral election in {town}?",
        )
    )
    r: list[Part] = [
        g.ent(winner, "person"),
        " won the ",
        g.ent(town, "town"),
        " mayoral election on ",
        g.when(d, "dmy"),
        " with ",
        g.num(v1, "comma"),
        " votes, ahead of ",
        g.ent(loser, "person"),
        " with ",
        g.num(v2, "comma"),
        g.add(detail=[" after a recount"], baseless=[", a clear sign of voters' mood"]),
        ". Turnout was ",
        g.num(turnout, hi=99),
        " percent. ",
    ]
    if first:
        r += [winner.split()[0], " ", flip, f" {party} mayor of {town}."]
    else:
        r += [f"The {party} party ", flip, "."]
    r.append(
        g.add(
            detail=[f" The count took {g.int(3, 9)} hours."],
            baseless=[" The result surprised observers."],
        )
    )
    return _doc(g, [p1], q, r, town)


TEMPLATES: dict[str, Callable[[Gen], Doc]] = {
    f.__name__: f
    for f in (
        landmark, bridge, company_profile, musician_bio, match_report, gadget_spec, medicine_leaflet,
        field_study, exhibition, council_vote, recipe, rail_line, college_history, treaty_history,
        film_release, mountain, software_release, hotel_opening, bird_species, festival, space_probe,
        quarterly_results, hospital_wing, election,
    )
}  # fmt: skip
"""QA templates by name (the build order)."""
