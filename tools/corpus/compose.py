"""Composing labelled responses: slots, insertion points, variants and their checks.

A template writes a :class:`Doc`: the passages (plain strings), the question, and the
faithful response as a sequence of *parts*. A part is literal text or a slot:

* :class:`Num` -- a number copied from the source (numeric change),
* :class:`When` -- a year, date or clock time copied from the source (date change),
* :class:`Ent` -- a named entity copied from the source (entity swap),
* :class:`Flip` -- a predicate with a contradicting wording (contradiction/negation),
* :class:`Add` -- a place where an unsupported detail or a subtle baseless claim can be
  inserted (renders as nothing in the faithful response).

:func:`make_variant` renders the response with one part changed and records the exact
character span of the changed text while composing, so offsets never come from a search.
Every variant is checked: a replacement differs from the original and none of its
renderings occurs in the passages or question; an insertion does not occur in the
passages. :func:`check_faithful` checks that each slot's value does occur in the source.
"""

from __future__ import annotations

import builtins
import datetime as dt
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import tools.corpus.names as names
from core.base.examples import Span

T = TypeVar("T")
HallucinationType = Literal[
    "numeric change",
    "date change",
    "entity swap",
    "unsupported added detail",
    "contradiction/negation",
    "subtle baseless claim",
]
HALLUCINATION_TYPES: tuple[HallucinationType, ...] = (
    "numeric change",
    "date change",
    "entity swap",
    "unsupported added detail",
    "contradiction/negation",
    "subtle baseless claim",
)
TYPE_SLUGS: dict[str, str] = {
    "numeric change": "numeric-change",
    "date change": "date-change",
    "entity swap": "entity-swap",
    "unsupported added detail": "added-detail",
    "contradiction/negation": "contradiction",
    "subtle baseless claim": "baseless-claim",
}
SOURCE_WORD: dict[str, str] = {"qa": "passages", "summary": "article", "data2txt": "record"}
MONTHS: tuple[str, ...] = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
WEEKDAYS: tuple[str, ...] = (
    "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday",
)  # fmt: skip

NumFmt = Literal["int", "comma", "1f", "2f"]
DateStyle = Literal["year", "month_year", "month", "dmy", "mdy", "dm", "md", "wdm", "iso", "time"]
_INSERT_LEAD = " ,;:-\u2014"
_INSERT_TRAIL = " .,;"
_NAME_STOPWORDS = frozenset(
    {"the", "of", "and", "university", "institute", "technology", "cafe", "kitchen", "river"}
)


# --------------------------------------------------------------------------- formatting


def fnum(value: float, fmt: NumFmt = "int") -> str:
    """Format a number as the corpus writes it (``int``, ``comma``, ``1f``, ``2f``)."""
    if fmt == "int":
        return str(int(value))
    if fmt == "comma":
        return f"{int(value):,}"
    if fmt == "1f":
        return f"{value:.1f}"
    return f"{value:.2f}"


def fdate(d: dt.date | dt.time, style: DateStyle) -> str:
    """Format a date (or a clock time for ``style="time"``) in one of the corpus styles."""
    if isinstance(d, dt.time):
        return f"{d.hour:02d}:{d.minute:02d}"
    if style == "time":
        raise ValueError("style 'time' needs a datetime.time")
    m = MONTHS[d.month - 1]
    return {
        "year": str(d.year),
        "month_year": f"{m} {d.year}",
        "month": m,
        "dmy": f"{d.day} {m} {d.year}",
        "mdy": f"{m} {d.day}, {d.year}",
        "dm": f"{d.day} {m}",
        "md": f"{m} {d.day}",
        "wdm": f"{WEEKDAYS[d.weekday()]} {d.day} {m}",
        "iso": d.isoformat(),
    }[style]


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``11th``, ``82nd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def a_an(word: str) -> str:
    """``word`` with its indefinite article (``an accordion``, ``a cello``)."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def occurs(needle: str, hay: str) -> bool:
    """Whether ``needle`` occurs in ``hay`` as whole words (case-insensitive)."""
    needle = needle.strip()
    if not needle:
        return False
    # numbers: "67" occurs in "67th" but not in "1,267", "4.67" or "670"
    before = r"(?<![\d.,])" if needle[0].isdigit() else r"(?<![\w])"
    after = r"(?![\d]|[.,]\d)" if needle[-1].isdigit() else r"(?![\w])"
    return re.search(before + re.escape(needle) + after, hay, flags=re.IGNORECASE) is not None


def _words(s: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", s.lower()) if w not in _NAME_STOPWORDS}


# --------------------------------------------------------------------------- parts


@dataclass(frozen=True)
class Num:
    """A number copied from the source; alternatives keep its format and scale."""

    value: float
    fmt: NumFmt = "int"
    lo: float | None = None
    hi: float | None = None

    @property
    def text(self) -> str:
        return fnum(self.value, self.fmt)

    def forms(self) -> tuple[str, ...]:
        """Renderings that count as this number in a source (``1200`` and ``1,200``)."""
        v = self.value
        out = [self.text]
        if float(v).is_integer():
            out += [str(int(v)), f"{int(v):,}", f"{float(v):.1f}"]
        else:
            out += [f"{v:.1f}", f"{v:.2f}", repr(float(v))]
        return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class When:
    """A year, date or clock time copied from the source."""

    value: dt.date | dt.time
    style: DateStyle

    @property
    def text(self) -> str:
        return fdate(self.value, self.style)

    def forms(self) -> tuple[str, ...]:
        """Renderings that count as this date in a source (any style that shows it)."""
        v = self.value
        if isinstance(v, dt.time):
            h12 = v.hour % 12 or 12
            ampm = "am" if v.hour < 12 else "pm"
            return (fdate(v, "time"), f"{h12}:{v.minute:02d} {ampm}", f"{h12}:{v.minute:02d}{ampm}")
        if self.style == "year":
            return (str(v.year),)
        if self.style == "month":
            return (MONTHS[v.month - 1],)
        if self.style == "month_year":
            return (fdate(v, "month_year"), f"{v.year}-{v.month:02d}")
        styles: tuple[DateStyle, ...] = ("dmy", "mdy", "iso", "dm", "md", "wdm")
        if self.style in ("dm", "md", "wdm"):
            styles = ("dm", "md", "wdm", "dmy", "mdy", "iso")
        return tuple(fdate(v, s) for s in styles)


@dataclass(frozen=True)
class Ent:
    """A named entity copied from the source; ``kind`` names its generator in ``POOLS``."""

    text: str
    kind: str

    def forms(self) -> tuple[str, ...]:
        return (self.text,)


@dataclass(frozen=True)
class Flip:
    """A predicate and wordings that contradict it (``alts``)."""

    text: str
    alts: tuple[str, ...]
    note: str | None = None


@dataclass(frozen=True)
class Add:
    """An insertion point with candidate added details and baseless claims.

    Each candidate is the full inserted text including its leading separator
    (``", which ..."`` or ``" It ..."``); the labelled span leaves out the separator and
    the closing punctuation.
    """

    detail: tuple[str, ...] = ()
    baseless: tuple[str, ...] = ()


Part = str | Num | When | Ent | Flip | Add
Slot = Num | When | Ent | Flip


@dataclass(frozen=True)
class Doc:
    """One source document with its faithful response, as a template writes it."""

    passages: tuple[str, ...]
    response: tuple[Part, ...]
    question: str | None = None

    @property
    def context(self) -> str:
        """Passages and question joined (what a hallucination must not occur in)."""
        return "\n".join((*self.passages, self.question or ""))

    def faithful(self) -> str:
        """The faithful response text."""
        return "".join(_render(p) for p in self.response)


def _render(p: Part) -> str:
    if isinstance(p, str):
        return p
    if isinstance(p, Add):
        return ""
    return p.text


@dataclass(frozen=True)
class Variant:
    """A hallucinated response and its one labelled span."""

    type: HallucinationType
    response: str
    span: Span


# --------------------------------------------------------------------------- generator


class Gen:
    """Random fillers and slot constructors for one document (one seeded RNG).

    Names drawn with :meth:`fresh` are unique within the document and share no word,
    so an entity swap can never land on another entity of the same document.
    """

    def __init__(self, rng: random.Random, task: str) -> None:
        self.rng = rng
        self.task = task
        self._used_words: set[str] = set()

    # -- plain randomness
    def pick(self, seq: Sequence[str]) -> str:
        """One element of ``seq``."""
        return self.rng.choice(seq)

    def pick_any(self, seq: Sequence[T]) -> T:
        """One element of a sequence of any type."""
        return seq[self.rng.randrange(len(seq))]

    def int(self, lo: int, hi: int, step: int = 1) -> int:
        """A uniform integer in ``[lo, hi]`` on a grid of ``step``."""
        return self.rng.randrange(lo, hi + 1, step)

    def real(self, lo: float, hi: float, decimals: builtins.int = 1) -> float:
        """A uniform float in ``[lo, hi]`` rounded to ``decimals``."""
        return round(self.rng.uniform(lo, hi), decimals)

    def chance(self, p: float) -> bool:
        """True with probability ``p``."""
        return self.rng.random() < p

    def sample(self, seq: Sequence[str], k: builtins.int) -> list[str]:
        """``k`` distinct elements of ``seq``."""
        return self.rng.sample(list(seq), k)

    def date(self, y0: builtins.int, y1: builtins.int) -> dt.date:
        """A uniform date between 1 January ``y0`` and 28 December ``y1``."""
        return dt.date(self.int(y0, y1), self.int(1, 12), self.int(1, 28))

    def time(self, h0: builtins.int = 6, h1: builtins.int = 22, step: builtins.int = 5) -> dt.time:
        """A clock time between ``h0`` and ``h1`` hours, on a ``step``-minute grid."""
        return dt.time(self.int(h0, h1), self.int(0, 55, step))

    # -- names
    def fresh(self, kind: str | Callable[[random.Random], str]) -> str:
        """A new name of ``kind`` sharing no word with the document's earlier names."""
        fn = names.POOLS[kind] if isinstance(kind, str) else kind
        for _ in range(200):
            s = fn(self.rng)
            w = _words(s)
            if not (w & self._used_words):
                self._used_words |= w
                return s
        raise RuntimeError(f"name pool {kind!r} ran out of fresh names")

    def person(self) -> str:
        """A fresh person name."""
        return self.fresh("person")

    def town(self) -> str:
        """A fresh town name."""
        return self.fresh("town")

    def company(self) -> str:
        """A fresh company name."""
        return self.fresh("company")

    # -- slots
    def num(
        self, value: float, fmt: NumFmt = "int", lo: float | None = None, hi: float | None = None
    ) -> Num:
        """A number slot (see :class:`Num`)."""
        return Num(value=value, fmt=fmt, lo=lo, hi=hi)

    def when(self, value: dt.date | dt.time | builtins.int, style: DateStyle = "year") -> When:
        """A date slot; an int is a year."""
        if isinstance(value, int):
            value = dt.date(value, 1, 1)
        if isinstance(value, dt.time):
            style = "time"
        return When(value=value, style=style)

    def ent(self, text: str, kind: str) -> Ent:
        """An entity slot."""
        return Ent(text=text, kind=kind)

    def flip(self, text: str, *alts: str, note: str | None = None) -> Flip:
        """A contradiction slot: the faithful wording and contradicting ones."""
        return Flip(text=text, alts=alts, note=note)

    def add(self, detail: Sequence[str] = (), baseless: Sequence[str] = ()) -> Add:
        """An insertion point."""
        return Add(detail=tuple(detail), baseless=tuple(baseless))


# --------------------------------------------------------------------------- alternatives


def _alt_numbers(n: Num) -> list[float]:
    v = n.value
    decimals = {"int": 0, "comma": 0, "1f": 1, "2f": 2}[n.fmt]
    if decimals == 0:
        iv = int(v)
        g: float = 1
        while iv and iv % (g * 10) == 0 and g * 10 <= max(iv // 4, 1):
            g *= 10
        cands = [iv + k * g for k in (-5, -4, -3, -2, -1, 1, 2, 3, 4, 5, 7)]
        cands += [round(iv * f / g) * g for f in (0.5, 0.6, 0.75, 1.25, 1.4, 1.5, 2.0)]
    else:
        # visible changes: 4.5 -> 4.2, 2.40 -> 2.55, 36.5 -> 39.5
        g = 1.0 if v >= 10 else (0.1 if decimals == 1 else 0.05)
        cands = [round(v + k * g * s, decimals) for k in (1, 2, 3, 4, 5) for s in (-1, 1)]
        cands += [round(v * f, decimals) for f in (0.6, 0.75, 1.3, 1.5)]
    lo = n.lo if n.lo is not None else (1 if v >= 1 else 0)
    out: list[float] = []
    for c in cands:
        if c == v or c < lo or (n.hi is not None and c > n.hi) or c in out:
            continue
        if fnum(c, n.fmt) == n.text:
            continue
        out.append(c)
    return out


def _alt_dates(w: When) -> list[dt.date | dt.time]:
    v = w.value
    if isinstance(v, dt.time):
        base = v.hour * 60 + v.minute
        return [
            dt.time(((base + s * k) // 60) % 24, (base + s * k) % 60)
            for k in (15, 25, 40, 55, 70, 90, 120, 180)
            for s in (-1, 1)
        ]
    if w.style == "year":
        return [dt.date(v.year + s * k, 1, 1) for k in (1, 2, 3, 4, 6, 8, 11, 14) for s in (-1, 1)]
    out: list[dt.date | dt.time] = []
    if w.style in ("month_year", "month"):
        for k in (1, 2, 3, 4, 5, 7):
            for s in (-1, 1):
                m = (v.month - 1 + s * k) % 12 + 1
                out.append(dt.date(v.year, m, 1))
        if w.style == "month_year":
            out += [dt.date(v.year + s * k, v.month, 1) for k in (1, 2, 3) for s in (-1, 1)]
        return out
    for k in (1, 2, 3, 5, 6, 8, 9, 12, 16):
        for s in (-1, 1):
            out.append(v + dt.timedelta(days=s * k))
    for k in (1, 2, 3, 4):
        m = (v.month - 1 + k) % 12 + 1
        out.append(dt.date(v.year, m, min(v.day, 28)))
    if w.style in ("dmy", "mdy", "iso"):
        out += [
            dt.date(v.year + s * k, v.month, v.day if v.day < 29 else 28)
            for k in (1, 2)
            for s in (-1, 1)
        ]
    if w.style in ("dm", "md", "wdm"):
        # a shift across the year boundary would be invisible without the year
        out = [d for d in out if isinstance(d, dt.date) and d.year == v.year]
    return out


# --------------------------------------------------------------------------- variants


def _src(task: str, plural: str, singular: str) -> str:
    """``"the passages give"`` / ``"the article gives"``: subject and verb agreeing."""
    noun = SOURCE_WORD.get(task, "source")
    return f"the {noun} {plural if noun == 'passages' else singular}"


def _replacements(doc: Doc, i: int, gen: Gen) -> list[tuple[str, str]]:
    """Candidate (new text, note) pairs for slot ``i``, all checked against the source."""
    p = doc.response[i]
    ctx = doc.context
    t = gen.task
    out: list[tuple[str, str]] = []
    if isinstance(p, Num):
        for c in _alt_numbers(p):
            alt = Num(value=c, fmt=p.fmt)
            if not any(occurs(f, ctx) for f in alt.forms()):
                out.append((alt.text, f"{_src(t, 'give', 'gives')} {p.text}, not {alt.text}"))
    elif isinstance(p, When):
        for d in _alt_dates(p):
            when = When(value=d, style=p.style)
            if when.text != p.text and not any(occurs(f, ctx) for f in when.forms()):
                out.append((when.text, f"{_src(t, 'give', 'gives')} {p.text}, not {when.text}"))
    elif isinstance(p, Ent):
        for _ in range(12):
            try:
                new = gen.fresh(p.kind)
            except RuntimeError:
                break
            if new != p.text and not (_words(new) & _words(p.text)) and not occurs(new, ctx):
                out.append((new, f"{_src(t, 'name', 'names')} {p.text}; {new} is not mentioned"))
    elif isinstance(p, Flip):
        for wording in p.alts:
            if wording != p.text and not occurs(wording, ctx):
                default = f"{_src(t, 'support', 'supports')} '{p.text}', not '{wording}'"
                out.append((wording, p.note or default))
    return out


_KIND_OF_TYPE: dict[str, type] = {
    "numeric change": Num,
    "date change": When,
    "entity swap": Ent,
    "contradiction/negation": Flip,
}


def make_variant(doc: Doc, htype: HallucinationType, gen: Gen) -> Variant | None:
    """Render ``doc``'s response with one hallucination of type ``htype``.

    Returns:
        The variant, or ``None`` when the document offers no checked edit of that type.
    """
    rng = gen.rng
    if htype in _KIND_OF_TYPE:
        kind = _KIND_OF_TYPE[htype]
        idx = [i for i, p in enumerate(doc.response) if isinstance(p, kind)]
        rng.shuffle(idx)
        for i in idx:
            cands = _replacements(doc, i, gen)
            if cands:
                new, note = cands[rng.randrange(len(cands))]
                return _compose(doc, i, new, htype, note, insertion=False)
        return None
    field = "detail" if htype == "unsupported added detail" else "baseless"
    idx = [i for i, p in enumerate(doc.response) if isinstance(p, Add) and getattr(p, field)]
    rng.shuffle(idx)
    for i in idx:
        add = doc.response[i]
        assert isinstance(add, Add)
        texts = [
            c
            for c in getattr(add, field)
            if not occurs(c.strip(_INSERT_LEAD + _INSERT_TRAIL), doc.context)
        ]
        if texts:
            text = texts[rng.randrange(len(texts))]
            if field == "detail":
                note = f"{_src(gen.task, 'do', 'does')} not mention this"
            else:
                note = f"an inference or judgement that {_src(gen.task, 'do', 'does')} not support"
            return _compose(doc, i, text, htype, note, insertion=True)
    return None


def _compose(
    doc: Doc, at: int, new: str, htype: HallucinationType, note: str, *, insertion: bool
) -> Variant:
    out: list[str] = []
    pos = 0
    start = end = -1
    for i, p in enumerate(doc.response):
        text = new if i == at else _render(p)
        if i == at:
            if insertion:
                lead = len(text) - len(text.lstrip(_INSERT_LEAD))
                start, end = pos + lead, pos + len(text.rstrip(_INSERT_TRAIL))
            else:
                start, end = pos, pos + len(text)
        out.append(text)
        pos += len(text)
    response = "".join(out)
    assert 0 <= start < end <= len(response), (start, end, response)
    return Variant(
        type=htype, response=response, span=Span(start=start, end=end, type=htype, note=note)
    )


# --------------------------------------------------------------------------- checks


def check_faithful(doc: Doc, where: str) -> None:
    """Raise when a slot of the faithful response is not backed by the source.

    Numbers, dates and entities must occur (in one of their renderings) in the passages
    or question; a template that breaks this has a bug.
    """
    ctx = doc.context
    for p in doc.response:
        if isinstance(p, Num | When | Ent) and not any(occurs(f, ctx) for f in p.forms()):
            raise AssertionError(f"{where}: faithful slot {p.text!r} is not in the source")
    text = doc.faithful()
    if "  " in text or " ." in text or " ," in text:
        raise AssertionError(f"{where}: odd spacing in the response {text!r}")
