"""What a flagged span departs from: the passage sentence it most relies on, and whether
the answer states something the passages do not (*unsupported*) or something they say
otherwise (*contradicted*), with a short reason a reviewer can check.

**Alignment.** The candidates are the passage sentences of
:func:`core.pipeline.word_spans.passage_sentences`, plus the stretches of passage text it
leaves out (a line without a full stop: a title, a list item), each cut to at most
:data:`MAX_UNIT_CHARS` characters. Each gets a *text score*, ``LEXICAL_WEIGHT * lexical +
(1 - LEXICAL_WEIGHT) * max(cosine, 0)``:

- *lexical*: the share of the claim's content words the sentence contains, each word
  weighted by its BM25 IDF over the candidate sentences themselves (a word every
  sentence has says little; a number or a name found in one sentence says much).
  Content words are lowercased, lightly stemmed words that are not stop words, numbers
  (``1,887`` and ``1887`` are one; ``ninth`` is 9; a list marker such as ``4.`` at a
  line's start, or the ``2`` of "passage 2", is no number) and names (a capitalised word
  inside a sentence, or opening one when the texts also write it capitalised inside one).
- *cosine*: of the sentence's and the claim's embeddings
  (:func:`core.signals.embed.embed`, cached per text).

**The claim** is the span's own text: its words decide. A span with fewer than
:data:`MIN_CLAIM_WORDS` content words is a fragment (``1912``, ``Google Voice``) that
means little alone, so it borrows its answer sentence: the other words of that sentence
count :data:`CONTEXT_WEIGHT` as much in the lexical score, and the cosine is the mean of
the span's and the sentence's. The values, names and negations compared for a
contradiction, and the words a reason names, are always the span's own.

**Attention** (``how="attention+text"``): one weight per sentence of
``passage_sentences(passages)``, already normalised, e.g. the attention of the copying
or lookback heads from the span's tokens. Scaled so the most attended sentence has 1, it
re-ranks the candidates: ``(1 - ATTENTION_WEIGHT) * text + ATTENTION_WEIGHT *
attention``; stretches ``passage_sentences`` leaves out have attention 0. The floor stays
on the text score (attention chooses among sentences that share the claim's words or
meaning; it cannot make an unrelated sentence evidence), and ``Evidence.score`` is the
combined score.

**The type.** Below :data:`FLOOR` no sentence is evidence: *unsupported*, "no passage
supports this", naming the claim's content words no passage mentions. Above it, the best
sentence is the evidence (the best in the passages the span cites, "passage 2", when
they hold one above the floor), and the span is *contradicted* when:

- that sentence states another value for what the span states: a different number of
  the same kind (year, money, percentage, other number) or member of the same closed
  class (a day of the week, a month, a season: "closed on *Tuesdays*" against "closed on
  *Monday*"), the one whose neighbouring words match the span's best when it states
  several; or a different name in the same slot (on each side where both have content
  words, one of the two nearest is shared: "built by *X*'s company" against "built by
  *Y*'s company");
- the span is a fragment (fewer than :data:`MIN_CLAIM_WORDS` content words) and a word
  of it has another word in its very slot in the sentence, the two nearest content words
  on **both** sides shared ("closed in 1903 after a *flood* destroyed the hall" against
  "... after a *fire* destroyed the hall": "the passage says "fire"; the answer says
  "flood""). A longer span's words are not one slot's value, so they are not compared
  this way (on RAGTruth's long spans it mostly matched paraphrases);
- the span says the sources lack something ("not mentioned in the passages", "passage 3
  does not provide") and the evidence's text score is at least :data:`ABSENCE_FLOOR`;
- the span cites passages that hold no evidence while another passage does;
- a negation is on one side only, and the sentence holds at least
  :data:`NEGATION_OVERLAP` of the claim's weighted words (otherwise a "not" is about
  something else);
- the sentence holds every content word of the span but says it of something else: a
  word of the span's answer sentence that the passages use elsewhere has another word in
  its slot there ("The *duration* of the waggle run tells the direction" against "The
  *angle* of the waggle run ... shows the direction").

Else it is *unsupported*, naming the claim's content words the passages (else the
sentence) do not contain. Two more ways to *contradicted* look past the best sentence:

- **a fragment no sentence supports**, whose answer sentence restates one passage
  sentence (text score at least :data:`CONTEXT_FLOOR` against the :data:`CONTEXT_WORDS`
  content words on each side of the span): that sentence is the evidence when it states
  another value, name or word in the span's place ("a flood" in "closed in 1903 after a
  flood destroyed the main furnace hall");
- **a field of a JSON record** among the passages (a data-to-text answer): the answer
  sentence holds every content word of the field's name, the span one of them or a
  value, and the record says ``false`` where the answer asserts it ("accepts card
  payments" against ``"accepts_cards": false``), ``true`` where it negates it, or another
  number or value of the same kind (``"warranty_years": 2`` against "a three-year
  warranty"); the field is the evidence.

**Hostile input** never crashes and stays bounded: at most :data:`MAX_PASSAGES`
passages and :data:`MAX_CHARS` characters of them are read (each passage cut to an equal
share when they are longer; attention is then ignored, as no model read such a prompt),
at most :data:`MAX_SENTENCES` candidates are scored (an equal share per passage, the
first of each), at most :data:`MAX_CLAIM_CHARS` of a span; every reason is at most
:data:`MAX_REASON` characters, each quoted word or sentence cut.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from core.pipeline.word_spans import passage_sentences
from core.signals.embed import embed

NO_SUPPORT = "no passage supports this"
"""The reason's opening when no passage sentence reaches the floor (``evidence`` None)."""

SpanType = Literal["unsupported", "contradicted"]

FLOOR = 0.35
"""Lowest text score (see the module docstring) of a sentence that is evidence."""
LEXICAL_WEIGHT = 0.5
"""Weight of the lexical score in the text score (the cosine has the rest)."""
CONTEXT_WEIGHT = 0.3
"""Weight of a fragment's borrowed answer-sentence words against its own (1)."""
MIN_CLAIM_WORDS = 4
"""A span with fewer content words is a fragment and borrows its answer sentence."""
ATTENTION_WEIGHT = 0.3
"""Weight of the (max-scaled) attention against the text score when re-ranking."""
NEGATION_OVERLAP = 0.5
"""Least lexical score for a one-sided negation to count as a contradiction."""
ABSENCE_FLOOR = 0.5
"""Least text score of a sentence that contradicts "the passages do not mention this"."""

MAX_PASSAGES = 1_000
MAX_CHARS = 500_000
MAX_SENTENCES = 2_000
MAX_UNIT_CHARS = 500
MAX_CLAIM_CHARS = 2_000
MAX_CONTEXT_CHARS = 600
"""How far before and after the span its answer sentence is looked for."""
MAX_REASON = 200
MAX_QUOTE = 40
"""Longest quoted word group in a reason (a sentence quoted whole gets twice as much)."""
MAX_NAMED = 4
"""Most word groups a reason names."""


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """The passage sentence a flagged span most relies on.

    Attributes:
        passage: Index of the passage.
        start, end: Character range ``[start, end)`` of the sentence in that passage.
        text: The sentence.
        score: Its alignment score with the span (text, or attention and text).
        how: ``"text"`` (lexical and embedding alignment) or ``"attention+text"``.
    """

    passage: int
    start: int
    end: int
    text: str
    score: float
    how: Literal["text", "attention+text"]


@dataclass(frozen=True, kw_only=True)
class SpanFinding:
    """What a flagged span departs from.

    Attributes:
        evidence: The passage sentence it most relies on; ``None``: no passage supports it.
        type: ``"unsupported"`` (the passages do not say it) or ``"contradicted"`` (they
            say otherwise).
        reason: One short sentence built from the evidence, at most :data:`MAX_REASON`
            characters.
    """

    evidence: Evidence | None
    type: SpanType
    reason: str


class _Ranged(Protocol):
    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


# ----------------------------------------------------------------------------- words

STOPWORDS = frozenset(
    """a about above after again against all also although am an and any are aren't as at
    be because been before being below between both but by can cannot could couldn't did
    didn't do does doesn't doing don't down during each either etc even ever every few for
    from further had hadn't has hasn't have haven't having he her here hers herself him
    himself his how however i if in into is isn't it it's its itself just let like may
    me might more most much must my myself neither no nor not of off often on once only
    or other others our ours ourselves out over own per perhaps rather same shall she
    should shouldn't since so some such than that that's the their theirs them themselves
    then there these they this those though through thus to too under until up upon us
    very was wasn't we were weren't what when where whether which while who whom whose
    why will with within without won't would wouldn't yet you your yours yourself
    yourselves additionally also furthermore moreover overall therefore generally usually
    typically specifically including include includes included according based given
    however note important passage passages mentioned mention mentions stated state states
    said says say provided provide provides information answer question""".split()
)
"""Words that never carry a claim (they are neither content words nor names)."""

NEGATIONS = frozenset(
    "not no never none nobody nothing neither nor cannot without n't "
    "isn't aren't wasn't weren't don't doesn't didn't won't can't couldn't shouldn't "
    "wouldn't hasn't haven't hadn't".split()
)

_NUMBER_WORDS = {
    w: str(k)
    for k, ws in {
        2: "two",
        3: "three third",
        4: "four fourth",
        5: "five fifth",
        6: "six sixth",
        7: "seven seventh",
        8: "eight eighth",
        9: "nine ninth",
        10: "ten tenth",
        11: "eleven eleventh",
        12: "twelve twelfth",
        20: "twenty twentieth",
        30: "thirty thirtieth",
        40: "forty fortieth",
        50: "fifty fiftieth",
        100: "hundred hundredth",
    }.items()
    for w in ws.split()
}

_CLASSES: dict[str, str] = {
    **{d: "weekday" for d in "monday tuesday wednesday thursday friday saturday sunday".split()},
    **{
        m: "month"
        for m in "january february march april may june july august september october "
        "november december".split()
    },
    **{s: "season" for s in "spring summer autumn winter".split()},
}
"""Words of a closed class of values (a day, a month, a season): another of the same
class in the evidence states another value, as another number does."""

_TOKEN = re.compile(
    r"(?P<money>[$£€¥]\s?)?(?P<num>\d+(?:[.,]\d+)*)(?P<pct>\s?%|\s?percent\b)?"
    r"|(?P<word>[^\W\d_]+(?:['’][^\W\d_]+)*)",
    re.UNICODE,
)
_STARTERS = frozenset(".!?:;\n\"“”'‘’()*•-–—")


@dataclass(frozen=True)
class _Tok:
    """A word or number of a text: its surface, its comparison key and what it is."""

    surface: str
    key: str
    kind: Literal["word", "name", "number", "year", "money", "percent", "class", "negation", "stop"]
    start: int
    end: int

    @property
    def is_value(self) -> bool:
        return self.kind in ("number", "year", "money", "percent", "class")

    @property
    def value_kind(self) -> str:
        """What a value is, for comparing values of one kind: a number's kind, or a
        closed class's (``weekday``, ``month``, ``season``)."""
        return self.key.split(":", 1)[0] if self.kind == "class" else self.kind

    @property
    def is_content(self) -> bool:
        return self.kind in ("word", "name") or self.is_value


def _stem(w: str) -> str:
    """A light, deterministic suffix strip, the same on both sides of a comparison."""
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    for suf, keep in (("ing", 4), ("ed", 4), ("es", 4), ("s", 3)):
        if w.endswith(suf) and len(w) - len(suf) >= keep and not w.endswith("ss"):
            return w[: -len(suf)]
    return w


_CITING = frozenset(
    "passage passages step steps paragraph paragraphs source sources document documents".split()
)
"""Words after which a number names a part of the sources, not a value of the claim."""
_ENUMERATION = re.compile(r"[.)](?:\s|$)|\s{2,}|\t")


def _tokens(text: str, names: frozenset[str] | set[str] = frozenset(), lead: int = 0) -> list[_Tok]:
    """The words and numbers of ``text[lead:]`` (``text[:lead]`` is context only: the
    start of the line it is on). A capitalised word is a name unless it opens a sentence
    and is not in ``names`` (words written capitalised inside a sentence somewhere); a
    number that opens a line as a list marker (``4.``, ``4)``, ``4  ``) or that follows
    "passage", "step"... (``passage 2 & 3``) is no value."""
    out: list[_Tok] = []
    citing = False
    for m in _TOKEN.finditer(text):
        if m.group("num") is not None:
            tok = _number(text, m)
            marker = citing or (_line_opens(text, m.start()) and tok.kind == "number")
            if marker and (citing or _ENUMERATION.match(text, m.end())):
                tok = _Tok(tok.surface, tok.key, "stop", tok.start, tok.end)
            if m.start() >= lead:
                out.append(tok)
            continue
        w = m.group("word")
        low = w.lower().replace("’", "'")
        citing = low in _CITING or (citing and low == "and")
        if m.start() < lead:
            continue
        if low in NEGATIONS or low.endswith("n't"):
            out.append(_Tok(w, low, "negation", m.start(), m.end()))
        elif low in _NUMBER_WORDS:
            out.append(_Tok(w, _NUMBER_WORDS[low], "number", m.start(), m.end()))
        elif (klass := _class_of(w)) is not None:
            out.append(_Tok(w, klass, "class", m.start(), m.end()))
        elif low in STOPWORDS or len(low) < 2:
            out.append(_Tok(w, low, "stop", m.start(), m.end()))
        else:
            name = w[0].isupper() and (not _opens(text, m.start()) or low in names)
            out.append(_Tok(w, _stem(low), "name" if name else "word", m.start(), m.end()))
    return out


def _class_of(word: str) -> str | None:
    """``class:member`` of a word of a closed class of values (:data:`_CLASSES`;
    plurals too: "Tuesdays"), else ``None``. Days and months count only capitalised, as
    English writes them ("may", "march" are verbs)."""
    low = word.lower()
    member = (
        low if low in _CLASSES else low[:-1] if low.endswith("s") and low[:-1] in _CLASSES else None
    )
    if member is None:
        return None
    klass = _CLASSES[member]
    if klass != "season" and not word[0].isupper():
        return None
    return f"{klass}:{member}"


def _number(text: str, m: re.Match[str]) -> _Tok:
    digits = m.group("num").rstrip(".,")
    plain = digits.replace(",", "")
    kind: Literal["number", "year", "money", "percent"] = "number"
    if m.group("money"):
        kind = "money"
    elif m.group("pct"):
        kind = "percent"
    elif len(plain) == 4 and plain.isdigit() and 1000 <= int(plain) <= 2100:
        kind = "year"
    try:
        key = f"{float(plain):g}"
    except ValueError:
        key = plain
    return _Tok(m.group(0).strip(), key, kind, m.start(), m.end())


def _opens(text: str, at: int) -> bool:
    """Whether the word at ``at`` opens a sentence, a line or a list item."""
    k = at - 1
    while k >= 0 and text[k] in " \t":
        k -= 1
    return k < 0 or text[k] in _STARTERS


def _line_opens(text: str, at: int) -> bool:
    """Whether only spaces and bullets stand between the line's start and ``at``."""
    k = at - 1
    while k >= 0 and text[k] in " \t*•-–":
        k -= 1
    return k < 0 or text[k] == "\n"


def _capitalised_inside(texts: Sequence[str]) -> set[str]:
    """Lowercased words written capitalised inside a sentence in ``texts`` (names)."""
    return {
        m.group(0).lower()
        for t in texts
        for m in re.finditer(r"\b[^\W\d_]+", t)
        if m.group(0)[0].isupper() and not _opens(t, m.start())
    }


def _embeddable(texts: Sequence[str]) -> list[str]:
    """``texts`` as the embedder's tokenizer takes them: a lone UTF-16 surrogate (which
    no UTF-8 text holds) becomes ``?``."""
    return [t.encode("utf-8", "replace").decode("utf-8") for t in texts]


def _cut(text: str, n: int = MAX_QUOTE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _bounded(reason: str) -> str:
    """``reason`` cut to :data:`MAX_REASON`, writable as UTF-8 (it quotes hostile text)."""
    reason = reason.encode("utf-8", "replace").decode("utf-8")
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 1].rstrip() + "…"


# ----------------------------------------------------------------------------- candidates


def candidate_sentences(passages: Sequence[str]) -> list[tuple[int, int, int]]:
    """``(passage, start, end)`` of every candidate the alignment scores, in passage
    order, bounded as the module docstring says (the sentences of
    :func:`~core.pipeline.word_spans.passage_sentences` and the text it leaves out, cut
    to :data:`MAX_UNIT_CHARS`; at most :data:`MAX_SENTENCES`)."""
    return [(k, a, b) for k, a, b, _ in _candidates(passages)[0]]


def _read(passages: Sequence[str]) -> tuple[list[str], bool]:
    """The passage texts read (each cut to a share of :data:`MAX_CHARS` when the whole is
    longer, at most :data:`MAX_PASSAGES`), and whether they are the passages exactly."""
    texts = [p if isinstance(p, str) else "" for p in list(passages[:MAX_PASSAGES])]
    exact = len(passages) <= MAX_PASSAGES and all(isinstance(p, str) for p in passages)
    if sum(len(t) for t in texts) > MAX_CHARS:
        share = MAX_CHARS // max(1, len(texts))
        texts = [t[:share] for t in texts]
        exact = False
    return texts, exact


def _candidates(
    passages: Sequence[str],
) -> tuple[list[tuple[int, int, int, int | None]], list[str], bool]:
    """The candidates ``(passage, start, end, index in passage_sentences or None)``, the
    passage texts read, and whether those indices are ``passage_sentences(passages)``'s."""
    texts, exact = _read(passages)
    per: list[list[tuple[int, int, int, int | None]]] = [[] for _ in texts]
    covered: list[list[tuple[int, int]]] = [[] for _ in texts]
    for i, (k, a, b) in enumerate(passage_sentences(texts)):
        for c, d in _pieces(texts[k], a, b):
            per[k].append((k, c, d, i))
        covered[k].append((a, b))
    for k, text in enumerate(texts):
        pos = 0
        for a, b in [*covered[k], (len(text), len(text))]:
            for m in re.finditer(r"[^\n]+", text[pos:a]):
                s, e = _strip(text, pos + m.start(), pos + m.end())
                if any(ch.isalnum() for ch in text[s:e]):
                    per[k].extend((k, c, d, None) for c, d in _pieces(text, s, e))
            pos = b
        per[k].sort(key=lambda u: u[1])
    quota = _quotas([len(p) for p in per], MAX_SENTENCES)
    return [u for p, q in zip(per, quota, strict=True) for u in p[:q]], texts, exact


def _strip(text: str, a: int, b: int) -> tuple[int, int]:
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    return a, b


def _pieces(text: str, a: int, b: int) -> list[tuple[int, int]]:
    """``[a, b)`` cut into pieces of at most :data:`MAX_UNIT_CHARS`, at a space when one
    is near the limit."""
    out = []
    while b - a > MAX_UNIT_CHARS:
        cut = text.rfind(" ", a + MAX_UNIT_CHARS // 2, a + MAX_UNIT_CHARS)
        cut = cut if cut > a else a + MAX_UNIT_CHARS
        out.append(_strip(text, a, cut))
        a, _ = _strip(text, cut, b)
    if b > a:
        out.append((a, b))
    return [(c, d) for c, d in out if d > c]


def _quotas(sizes: Sequence[int], limit: int) -> list[int]:
    """How many of each passage's candidates to keep: an equal share of ``limit``, the
    share a short passage leaves going to the others."""
    quota = [0] * len(sizes)
    left, open_ = limit, [k for k, n in enumerate(sizes) if n > 0]
    while left > 0 and open_:
        share = max(1, left // len(open_))
        for k in list(open_):
            take = min(share, sizes[k] - quota[k], left)
            quota[k] += take
            left -= take
            if quota[k] >= sizes[k]:
                open_.remove(k)
            if left <= 0:
                break
    return quota


@dataclass(frozen=True, kw_only=True, eq=False)
class _Index:
    """One answer's passages, ready to align spans against."""

    passages: tuple[str, ...]
    units: list[tuple[int, int, int, int | None]]
    texts: list[str]
    tokens: list[list[_Tok]]
    idf: dict[str, float]
    idf_max: float
    postings: dict[str, list[int]]
    vocab: frozenset[str]
    names: frozenset[str]
    vecs: np.ndarray
    n_attention: int | None
    """``len(passage_sentences(passages))`` when attention can be aligned, else None."""
    records: tuple[list[tuple[str, object, int, int]], ...] = ()
    """Per passage, its fields when it is a JSON record (:func:`_record_fields`)."""


def _index(passages: Sequence[str], answer: str) -> _Index:
    units, read, exact = _candidates(passages)
    texts = [read[k][a:b] for k, a, b, _ in units]
    names = frozenset(_capitalised_inside([*texts, answer[: MAX_CHARS // 10]]))
    tokens = [_tokens(t, names) for t in texts]
    postings: dict[str, list[int]] = defaultdict(list)
    for i, toks in enumerate(tokens):
        for key in {t.key for t in toks if t.is_content}:
            postings[key].append(i)
    n = len(units)
    idf = {w: math.log(1 + (n - len(ix) + 0.5) / (len(ix) + 0.5)) for w, ix in postings.items()}
    vecs = embed(_embeddable(texts)) if texts else np.zeros((0, 1), dtype=np.float32)
    n_att = len(passage_sentences(read)) if exact else None
    return _Index(
        passages=tuple(read),
        units=units,
        texts=texts,
        tokens=tokens,
        idf=idf,
        idf_max=math.log(1 + (n + 0.5) / 0.5),
        postings=dict(postings),
        vocab=frozenset(postings),
        names=names,
        vecs=np.asarray(vecs, dtype=np.float32),
        n_attention=n_att,
        records=tuple(_record_fields(p) for p in read),
    )


# ----------------------------------------------------------------------------- claims


@dataclass(frozen=True, kw_only=True)
class _Claim:
    """A span as the alignment reads it.

    Attributes:
        text: The span's text (at most :data:`MAX_CLAIM_CHARS`).
        own: Its words and numbers other than stop words (offsets into ``text``).
        weights: Content word key -> weight (1 its own, :data:`CONTEXT_WEIGHT` borrowed).
        context: The answer sentence a fragment borrows, else ``None``.
        cited: The passages (1-based) the span cites ("passage 2 & 3").
        absence: Whether it says the sources lack something ("not mentioned in the
            passages").
        before, after: The content words of the span's answer sentence before and after
            it (what the span is said of: "*The duration* of the waggle run tells ...").
    """

    text: str
    own: list[_Tok]
    weights: dict[str, float]
    context: str | None
    cited: frozenset[int]
    absence: bool
    before: list[_Tok]
    after: list[_Tok]


_CITATION = re.compile(r"\bpassages?\s*(\d+(?:\s*(?:,|&|and)\s*\d+)*)", re.IGNORECASE)
_SOURCES = frozenset("passage passages context source sources text document documents".split())
_ABSENT = re.compile(
    r"(?:\b(?:not|no|never|nowhere)\b|n't\b)(?:\W+\w+){0,3}?\W+(?:mention|stat|provid|specif|"
    r"say|said|contain|includ|discuss|address|cover|found|given|list|describ|explain|give)",
    re.IGNORECASE,
)
"""A negation of saying ("not mentioned", "does not provide"): with a word for the
sources, the claim is that the sources lack something."""


def _claim(answer: str, start: int, end: int, names: frozenset[str]) -> _Claim:
    n = len(answer)
    start, end = max(0, min(int(start), n)), max(0, min(int(end), n))
    end = max(start, min(end, start + MAX_CLAIM_CHARS))
    text = answer[start:end]
    line = answer.rfind("\n", max(0, start - 200), start) + 1
    lo = line if line > 0 or start <= 200 else start
    own = [
        _Tok(t.surface, t.key, t.kind, t.start - (start - lo), t.end - (start - lo))
        for t in _tokens(answer[lo:end], names, lead=start - lo)
        if t.kind != "stop"
    ]
    weights: dict[str, float] = {t.key: 1.0 for t in own if t.is_content}
    context = None
    if len(weights) < MIN_CLAIM_WORDS:
        a, b = _answer_sentence(answer, start, end)
        if (a, b) != (start, end) and answer[a:b].strip():
            context = answer[a:b]
            for t in _tokens(context, names):
                if t.is_content:
                    weights.setdefault(t.key, CONTEXT_WEIGHT)
    cited = {int(d) for m in _CITATION.finditer(text) for d in re.findall(r"\d+", m.group(1))}
    words = {w.lower() for w in re.findall(r"[^\W\d_]+", text)}
    a, b = _answer_sentence(answer, start, end)
    return _Claim(
        text=text,
        own=own,
        weights=weights,
        context=context,
        cited=frozenset(c for c in cited if c < 10_000),
        absence=bool(words & _SOURCES) and _ABSENT.search(text) is not None,
        before=[t for t in _tokens(answer[a:start], names) if t.kind != "stop"],
        after=[t for t in _tokens(answer[end:b], names) if t.kind != "stop"],
    )


def _answer_sentence(answer: str, start: int, end: int) -> tuple[int, int]:
    """The answer sentence around ``[start, end)`` (at most :data:`MAX_CONTEXT_CHARS` on
    either side)."""
    lo = max(0, start - MAX_CONTEXT_CHARS)
    before = answer[lo:start]
    cut = max(before.rfind(c) for c in ".!?\n")
    a = lo + cut + 1 if cut >= 0 else lo
    after = answer[end : end + MAX_CONTEXT_CHARS]
    stops = [k for k in (after.find(c) for c in ".!?\n") if k >= 0]
    b = end + (min(stops) + 1 if stops else len(after))
    return _strip(answer, a, b)


# ----------------------------------------------------------------------------- finding


def _text_scores(ix: _Index, claim: _Claim, qvec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each candidate's text score and lexical score."""
    n = len(ix.units)
    lex = np.zeros(n)
    total = sum(w * ix.idf.get(k, ix.idf_max) for k, w in claim.weights.items())
    for k, w in claim.weights.items():
        for i in ix.postings.get(k, ()):
            lex[i] += w * ix.idf[k]
    if total > 0:
        lex /= total
    cos = np.clip(ix.vecs @ qvec, 0.0, 1.0) if n else np.zeros(0)
    return LEXICAL_WEIGHT * lex + (1 - LEXICAL_WEIGHT) * cos, lex


def _attention_scores(ix: _Index, attention: Sequence[float] | None) -> np.ndarray | None:
    if attention is None or ix.n_attention is None:
        return None
    att = np.asarray(attention, dtype=np.float64).reshape(-1)
    if att.shape[0] != ix.n_attention:
        raise ValueError(
            f"attention has {att.shape[0]} weights but the passages have {ix.n_attention} "
            "sentences (passage_sentences): give one weight per sentence"
        )
    att = np.nan_to_num(np.clip(att, 0.0, None))
    top = float(att.max()) if att.size else 0.0
    per = np.zeros(len(ix.units))
    if top > 0:
        for u, (_, _, _, i) in enumerate(ix.units):
            if i is not None:
                per[u] = att[i] / top
    return per


def _finding(
    ix: _Index,
    claim: _Claim,
    qvec: np.ndarray,
    attention: Sequence[float] | None,
    cvec: np.ndarray | None = None,
) -> SpanFinding:
    if not any(t.is_content for t in claim.own):
        return SpanFinding(
            evidence=None,
            type="unsupported",
            reason=f"{NO_SUPPORT}: the span has no words to check",
        )
    if not ix.units:
        return SpanFinding(
            evidence=None, type="unsupported", reason=f"{NO_SUPPORT}: the passages are empty"
        )
    record = _record_clash(ix, claim)
    if record is not None:
        return record
    text, lex = _text_scores(ix, claim, qvec)
    att = _attention_scores(ix, attention)
    rank = text if att is None else (1 - ATTENTION_WEIGHT) * text + ATTENTION_WEIGHT * att
    rank = np.where(text >= FLOOR, rank, -np.inf)
    cited = np.asarray([u[0] + 1 in claim.cited for u in ix.units], dtype=bool)
    if np.isfinite(rank[cited]).any():  # the passages it cites support it: look there
        rank = np.where(cited, rank, -np.inf)
    best = int(np.argmax(rank))
    if not np.isfinite(rank[best]):
        aside = _sentence_clash(ix, claim, cvec, text, lex)
        if aside is not None:
            return aside
        missing = _missing(claim, ix.vocab)
        said = (
            f": the passages do not mention {missing}"
            if missing
            else (" (its words occur in the passages, but in no sentence close to it)")
        )
        return SpanFinding(evidence=None, type="unsupported", reason=_bounded(NO_SUPPORT + said))
    k, a, b, _ = ix.units[best]
    ev = Evidence(
        passage=k,
        start=a,
        end=b,
        text=ix.texts[best],
        score=float(rank[best]),
        how="text" if att is None else "attention+text",
    )
    clash = _contradiction(
        claim, ix.tokens[best], ev, float(text[best]), float(lex[best]), ix.tokens
    )
    if clash is not None:
        return SpanFinding(evidence=ev, type="contradicted", reason=_bounded(clash))
    return SpanFinding(
        evidence=ev, type="unsupported", reason=_bounded(_unsupported(claim, ix, best))
    )


CONTEXT_WORDS = 4
"""How many content words on each side of a fragment stand for its place in the answer
sentence (:func:`_sentence_clash`)."""
CONTEXT_FLOOR = 0.6
"""Least text score of a passage sentence against a fragment's whole answer sentence for
it to be the sentence that answer sentence restates (:func:`_sentence_clash`)."""


def _sentence_clash(
    ix: _Index, claim: _Claim, cvec: np.ndarray | None, text: np.ndarray, lex: np.ndarray
) -> SpanFinding | None:
    """A fragment no sentence supports ("a flood") whose answer sentence restates one
    passage sentence (text score at least :data:`CONTEXT_FLOOR` against the span's
    place: the :data:`CONTEXT_WORDS` content words on each side, and the answer
    sentence's embedding ``cvec``) that states another value, name or word in its place: contradicted,
    with that sentence as the evidence. ``None`` otherwise (the span stays unsupported)."""
    if claim.context is None or cvec is None or not ix.units:
        return None
    near = [t for t in claim.before if t.is_content][-CONTEXT_WORDS:]
    near += [t for t in claim.after if t.is_content][:CONTEXT_WORDS]
    weights = {t.key: 1.0 for t in near}
    total = sum(ix.idf.get(k, ix.idf_max) for k in weights)
    if total <= 0:
        return None
    clex = np.zeros(len(ix.units))
    for word in weights:
        for i in ix.postings.get(word, ()):
            clex[i] += ix.idf[word]
    score = LEXICAL_WEIGHT * clex / total + (1 - LEXICAL_WEIGHT) * np.clip(ix.vecs @ cvec, 0, 1)
    best = int(np.argmax(score))
    if score[best] < CONTEXT_FLOOR:
        return None
    k, a, b, _ = ix.units[best]
    ev = Evidence(
        passage=k, start=a, end=b, text=ix.texts[best], score=float(score[best]), how="text"
    )
    theirs = [t for t in ix.tokens[best] if t.kind != "stop"]
    clash = (
        _value_clash(claim.own, theirs, [*claim.before, *claim.own, *claim.after])
        or _name_clash(claim.own, theirs)
        or _word_clash(claim, theirs)
    )
    if clash is None:
        return None
    return SpanFinding(
        evidence=ev,
        type="contradicted",
        reason=_bounded(f'the passage says "{clash[1]}"; the answer says "{clash[0]}"'),
    )


MAX_RECORD_CHARS = 20_000
"""The longest passage read as a JSON record (:func:`_record_fields`)."""
MAX_FIELDS = 200


def _record_fields(passage: str) -> list[tuple[str, object, int, int]]:
    """A passage that is one JSON object (a data-to-text record): ``(key, value, start,
    end)`` of each scalar field (one level of nesting as ``outer.inner``), ``start`` and
    ``end`` bounding ``"key": value`` in the passage; none for other passages."""
    text = passage.strip()
    if not (text.startswith("{") and text.endswith("}")) or len(text) > MAX_RECORD_CHARS:
        return []
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to read
        return []
    if not isinstance(value, dict):
        return []
    flat: list[tuple[str, object]] = []
    for key, v in value.items():
        if isinstance(v, dict):
            flat += [(f"{key}.{k2}", v2) for k2, v2 in v.items() if not isinstance(v2, dict | list)]
        elif not isinstance(v, list):
            flat.append((str(key), v))
    out = []
    for key, v in flat[:MAX_FIELDS]:
        leaf = key.rsplit(".", 1)[-1]
        at = passage.find(json.dumps(leaf))
        end = passage.find(",", at) if at >= 0 else -1
        end = passage.find("}", at) if at >= 0 and end < 0 else end
        if at < 0:
            at, end = 0, len(passage)
        out.append((key, v, at, end if end > at else len(passage)))
    return out


def _key_words(key: str) -> set[str]:
    """A field name's content words, as the answer's tokens key them
    (``accepting_new_patients`` -> accept, new, patient)."""
    parts = re.sub(r"([a-z])([A-Z])", r"\1 \2", key.rsplit(".", 1)[-1])
    return {
        t.key
        for t in _tokens(parts.replace("_", " ").replace("-", " ").lower())
        if t.kind == "word"
    }


def _record_clash(ix: _Index, claim: _Claim) -> SpanFinding | None:
    """What a field of a JSON record among the passages says of the span: the answer
    sentence holds every content word of the field's name, and the span one of them or a
    value. *Contradicted* when the record says ``false`` where the answer asserts it (no
    negation), ``true`` where the answer negates it, or another number or value of the
    same kind ("closed_on": "Monday" against "closed on Tuesdays"), by any field; else,
    when the span names a field (a word of its name) whose value the answer states
    rightly, that field is the evidence and the span stays *unsupported* (a "false" is no
    negation the other rules may read as a clash). ``None`` when no field is about the
    span."""
    seq = [*claim.before, *claim.own, *claim.after]
    if not claim.own or not ix.passages:
        return None
    keys = {t.key for t in seq}
    own = {t.key for t in claim.own}
    negated = any(t.kind == "negation" for t in seq)
    agreed: SpanFinding | None = None
    for k, fields in enumerate(ix.records):
        passage = ix.passages[k]
        for key, value, a, b in fields:
            words = _key_words(key)
            if not words or not words <= keys:
                continue
            mine_values = [t for t in claim.own if t.is_value]
            if not (words & own or mine_values):
                continue
            said = f'the record says "{key}": {json.dumps(value)[:MAX_QUOTE]}'
            clash: str | None = None
            if value is False and not negated:
                clash = f"{said}; the answer says it is"
            elif value is True and negated:
                clash = f"{said}; the answer says it is not"
            elif isinstance(value, int | float | str) and not isinstance(value, bool):
                theirs = [t for t in _tokens(str(value)) if t.is_value]
                got = _value_clash(mine_values, theirs)
                if got is not None:
                    clash = f"{said}; the answer says {got[0]}"
            ev = Evidence(passage=k, start=a, end=b, text=passage[a:b], score=1.0, how="text")
            if clash is not None:
                return SpanFinding(evidence=ev, type="contradicted", reason=_bounded(clash))
            if agreed is None and words & own:  # the span names this field, rightly
                agrees = f"{said}, as the answer does; check how it combines the rest"
                agreed = SpanFinding(evidence=ev, type="unsupported", reason=_bounded(agrees))
    return agreed


def _missing(claim: _Claim, vocab: frozenset[str] | set[str]) -> str:
    """The claim's own content words not in ``vocab``, quoted: words next to each other
    in the claim as one group, the longest groups first (the most specific), at most
    :data:`MAX_NAMED` and a count of the rest."""
    groups: list[list[_Tok]] = []
    prev: _Tok | None = None
    for t in claim.own:
        if t.is_content and t.key not in vocab:
            joined = prev is not None and not claim.text[prev.end : t.start].strip(" -")
            if joined and groups and groups[-1][-1] is prev:
                groups[-1].append(t)
            else:
                groups.append([t])
        prev = t
    phrases: dict[str, str] = {}
    for g in sorted(groups, key=lambda g: -len(g)):  # stable: claim order within a length
        phrase = _cut(claim.text[g[0].start : g[-1].end])
        phrases.setdefault(phrase.lower(), f'"{phrase}"')
    named = list(phrases.values())
    if len(named) > MAX_NAMED:
        named = [*named[:MAX_NAMED], f"{len(named) - MAX_NAMED} more"]
    return ", ".join(named)


def _unsupported(claim: _Claim, ix: _Index, best: int) -> str:
    nowhere = _missing(claim, ix.vocab)
    if nowhere:
        return f"the passages do not mention {nowhere}"
    here = _missing(claim, {t.key for t in ix.tokens[best]})
    if here:
        return f"the closest passage sentence does not mention {here}"
    return (
        "the closest passage sentence mentions every word of this claim; check how it combines them"
    )


def _contradiction(
    claim: _Claim,
    sent: Sequence[_Tok],
    ev: Evidence,
    score: float,
    lexical: float,
    sentences: Sequence[Sequence[_Tok]],
) -> str | None:
    """Why the evidence (text score ``score``, lexical score ``lexical``) states
    otherwise than the claim, or ``None``: another value or name in the same slot; the
    answer saying the sources lack what the sentence states (``score`` at least
    :data:`ABSENCE_FLOOR`); a citation of passages that hold no evidence while another
    does; a one-sided negation; the sentence saying the span of something else
    (:func:`_role_clash`; ``sentences``: the words of every candidate sentence)."""
    mine = claim.own
    theirs = [t for t in sent if t.kind != "stop"]
    values = _value_clash(mine, theirs, [*claim.before, *claim.own, *claim.after])
    if values is not None:
        return f"the passage says {values[1]}; the answer says {values[0]}"
    names = _name_clash(mine, theirs)
    if names is not None:
        return f"the passage says {names[1]}; the answer says {names[0]}"
    quote = _cut(ev.text, 2 * MAX_QUOTE)
    if claim.absence and score >= ABSENCE_FLOOR:
        return f'the answer says the passages lack this; passage {ev.passage + 1} says "{quote}"'
    if claim.cited and ev.passage + 1 not in claim.cited:
        cites = ", ".join(str(c) for c in sorted(claim.cited)[:5])
        return f'the answer cites passage {cites}; passage {ev.passage + 1} says "{quote}"'
    neg_mine = any(t.kind == "negation" for t in mine)
    neg_theirs = any(t.kind == "negation" for t in theirs)
    if neg_mine != neg_theirs and lexical >= NEGATION_OVERLAP:
        if neg_mine:
            return f'the answer negates what the passage states: "{quote}"'
        return f'the passage negates it: "{quote}"; the answer does not'
    words = _word_clash(claim, theirs)
    if words is not None:
        return f'the passage says "{words[1]}"; the answer says "{words[0]}"'
    role = _role_clash(claim, theirs, sentences)
    if role is not None:
        return f'the passage says this of "{role[1]}", not of "{role[0]}": "{quote}"'
    return None


def _word_clash(claim: _Claim, theirs: Sequence[_Tok]) -> tuple[str, str] | None:
    """A word of the span the sentence lacks, and a word of the sentence the answer
    sentence lacks, in the very same slot: the nearest content words on **both** sides
    shared ("closed in 1903 after a *flood* destroyed the hall" against "closed in 1903
    after a *fire* destroyed the hall"). Both sides, not one: a word between the same
    two neighbours is another value of the same thing, not a paraphrase beside it."""
    if claim.context is None:  # a whole claim: its words are not one slot's value
        return None
    seq = [*claim.before, *claim.own, *claim.after]
    mine = {t.key for t in seq}
    their_keys = {t.key for t in theirs}
    start = len(claim.before)
    for i in range(start, start + len(claim.own)):
        t = seq[i]
        if t.kind != "word" or t.key in their_keys:
            continue
        left, right = _slot(seq, i, i + 1)
        if not (left and right):
            continue
        for a, s in enumerate(theirs):
            if s.kind != "word" or s.key in mine:
                continue
            l2, r2 = _slot(theirs, a, a + 1)
            if left & l2 and right & r2:
                return _cut(t.surface), _cut(s.surface)
    return None


def _same_slot(a: tuple[set[str], set[str]], b: tuple[set[str], set[str]]) -> bool:
    """Two :func:`_slot` s agree: on each side where both have content words, they share
    one (and one side at least has them on both)."""
    sides = [(x, y) for x, y in zip(a, b, strict=True) if x and y]
    return bool(sides) and all(x & y for x, y in sides)


def _role_clash(
    claim: _Claim, theirs: Sequence[_Tok], sentences: Sequence[Sequence[_Tok]]
) -> tuple[str, str] | None:
    """The sentence states the span, but of something else: it holds every content word
    of the span, and a word of the span's answer sentence (outside the span) has, in the
    sentence, another word in its slot (:func:`_slot`, as for names) that the answer
    never uses, while another passage sentence has the answer's word in that very slot:
    "The *duration* of the waggle run tells the direction of the food" against "The
    *angle* of the waggle run ... shows the direction of the food", when a passage says
    "The *duration* of the waggle run shows the distance". A word the passages never use
    in that slot (a synonym, a paraphrase: "chunks" for "cubes") is no clash."""
    their_keys = {t.key for t in theirs}
    if not claim.own or any(t.is_content and t.key not in their_keys for t in claim.own):
        return None
    seq = [*claim.before, *claim.own, *claim.after]
    mine = {t.key for t in seq}
    inside = range(len(claim.before), len(claim.before) + len(claim.own))
    for i, t in enumerate(seq):
        if i in inside or t.kind != "word" or t.key in their_keys:
            continue
        slot = _slot(seq, i, i + 1)
        used = any(
            u.key == t.key and _same_slot(slot, _slot(other, j, j + 1))
            for other in sentences
            for j, u in enumerate(other)
        )
        if not used:
            continue
        for a, s in enumerate(theirs):
            if s.kind == "word" and s.key not in mine and _same_slot(slot, _slot(theirs, a, a + 1)):
                return _cut(t.surface), _cut(s.surface)
    return None


def _value_clash(
    mine: Sequence[_Tok], theirs: Sequence[_Tok], around: Sequence[_Tok] = ()
) -> tuple[str, str] | None:
    """The first value of the claim the sentence lacks, beside a value of the same kind
    the sentence has and the claim lacks: of several, the one whose neighbouring words
    (:data:`VALUE_WINDOW` each side) share most with the claim value's in ``around``
    (its answer sentence), e.g. the women's time, not the men's."""
    my_keys = {(t.value_kind, t.key) for t in mine if t.is_value}
    their_keys = {(t.value_kind, t.key) for t in theirs if t.is_value}
    for t in mine:
        if t.is_value and (t.value_kind, t.key) not in their_keys:
            others = [
                s
                for s in theirs
                if s.is_value
                and s.value_kind == t.value_kind
                and (s.value_kind, s.key) not in my_keys
            ]
            if not others:
                continue
            near = _near(around, t)
            best = max(others, key=lambda s: _shared(near, _near(theirs, s)))
            return _cut(t.surface), _cut(best.surface)
    return None


VALUE_WINDOW = 4
"""Words on each side of a value that say what it is the value of (:func:`_value_clash`)."""


def _near(toks: Sequence[_Tok], tok: _Tok) -> tuple[set[str], set[str]]:
    """The keys of the :data:`VALUE_WINDOW` words (and names) before and after ``tok``
    in ``toks`` (empty when it is not there)."""
    at = next((i for i, t in enumerate(toks) if t is tok), None)
    if at is None:
        return set(), set()
    words = [(i, t) for i, t in enumerate(toks) if t.kind in ("word", "name")]
    left = {t.key for _, t in [w for w in words if w[0] < at][-VALUE_WINDOW:]}
    right = {t.key for _, t in [w for w in words if w[0] > at][:VALUE_WINDOW]}
    return left, right


def _shared(a: tuple[set[str], set[str]], b: tuple[set[str], set[str]]) -> int:
    """How much two values' neighbourhoods (:func:`_near`) share: the words before count
    twice (what precedes a value mostly says what it is of: "Kemper ... in 2 hours 31")."""
    return 2 * len(a[0] & b[0]) + len(a[1] & b[1])


def _names(toks: Sequence[_Tok]) -> list[tuple[int, int]]:
    """Runs ``[i, j)`` of consecutive names in ``toks``."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(toks):
        if toks[i].kind == "name":
            j = i
            while j < len(toks) and toks[j].kind == "name":
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def _slot(toks: Sequence[_Tok], i: int, j: int) -> tuple[set[str], set[str]]:
    """The two content words nearest before and after ``toks[i:j]`` (their keys)."""
    left = [t.key for t in toks[:i] if t.kind == "word"][-2:]
    right = [t.key for t in toks[j:] if t.kind == "word"][:2]
    return set(left), set(right)


def _name_clash(mine: Sequence[_Tok], theirs: Sequence[_Tok]) -> tuple[str, str] | None:
    """A name of the claim the sentence lacks and a name of the sentence the claim lacks,
    in the same slot: on each side where both have content words, they share one."""
    my_keys = {t.key for t in mine}
    their_keys = {t.key for t in theirs}
    for i, j in _names(mine):
        if any(t.key in their_keys for t in mine[i:j]):
            continue
        left, right = _slot(mine, i, j)
        for a, b in _names(theirs):
            if any(t.key in my_keys for t in theirs[a:b]):
                continue
            l2, r2 = _slot(theirs, a, b)
            sides = [(x, y) for x, y in ((left, l2), (right, r2)) if x and y]
            if sides and all(x & y for x, y in sides):
                return _name_text(mine[i:j]), _name_text(theirs[a:b])
    return None


def _name_text(toks: Sequence[_Tok]) -> str:
    return _cut(" ".join(t.surface for t in toks))


def _as_range(span: tuple[int, int] | _Ranged) -> tuple[int, int]:
    if isinstance(span, tuple):
        return int(span[0]), int(span[1])
    return int(span.start), int(span.end)


def find_all(
    passages: Sequence[str],
    answer: str,
    spans: Sequence[tuple[int, int] | _Ranged],
    *,
    attention: Sequence[Sequence[float] | None] | None = None,
) -> list[SpanFinding]:
    """:func:`find_evidence` for every span of one answer, the passages read and embedded
    once and the spans' texts embedded in one batch.

    Args:
        passages: The retrieved passages.
        answer: The answer.
        spans: Character ranges ``[start, end)`` of the answer (tuples, or objects with
            ``start`` and ``end``).
        attention: One per span: its per-sentence attention weights (see
            :func:`find_evidence`) or ``None``.

    Raises:
        ValueError: ``attention`` is not one per span, or a weight array is not one per
            passage sentence.
    """
    if attention is not None and len(attention) != len(spans):
        raise ValueError(f"attention has {len(attention)} entries for {len(spans)} spans")
    if not spans:
        return []
    answer = answer if isinstance(answer, str) else ""
    ix = _index(passages, answer)
    claims = [_claim(answer, *_as_range(s), ix.names) for s in spans]
    queries = [c.text.strip() or " " for c in claims]
    contexts = [c.context for c in claims if c.context is not None]
    vecs = (
        embed(_embeddable([*queries, *contexts]))
        if ix.units
        else np.zeros((len(queries) + len(contexts), 1))
    )
    qvecs: list[np.ndarray] = []
    cvecs: list[np.ndarray | None] = []
    k = len(queries)
    for i, c in enumerate(claims):
        q = np.asarray(vecs[i], dtype=np.float64)
        cv = None
        if c.context is not None:
            cv = np.asarray(vecs[k], dtype=np.float64)
            q = 0.5 * (q + cv)
            k += 1
        qvecs.append(q)
        cvecs.append(cv)
    return [
        _finding(ix, c, q, None if attention is None else attention[i], cvecs[i])
        for i, (c, q) in enumerate(zip(claims, qvecs, strict=True))
    ]


def find_evidence(
    passages: Sequence[str],
    answer: str,
    start: int,
    end: int,
    *,
    attention: Sequence[float] | None = None,
) -> SpanFinding:
    """The passage sentence the answer's span ``[start, end)`` most relies on, and
    whether the span is unsupported or contradicted, with a short reason (see the module
    docstring for the alignment, the combination with ``attention`` and the bounds).

    Args:
        passages: The retrieved passages (any text: empty, huge, odd unicode).
        answer: The answer the span belongs to.
        start, end: The span's character range (clamped to the answer).
        attention: One weight per sentence of
            :func:`~core.pipeline.word_spans.passage_sentences` of ``passages``, already
            normalised; with it the evidence is found ``how="attention+text"``. Ignored
            for passages over the reading bounds.

    Raises:
        ValueError: ``attention`` is not one weight per passage sentence.
    """
    return find_all(
        passages, answer, [(start, end)], attention=None if attention is None else [attention]
    )[0]
