"""Deep links: a view's choices in the URL, so a copied link reopens the same view.

The pages are URL paths already (``st.navigation``); each page also puts its main
choices into the URL's query parameters, as stable ids rather than display labels (the
dataset spec the CLI takes, the example id, the detector name, ``F12`` for an SAE
feature, ``L3H5`` for a head), under one name per concept shared by every page
(:data:`P_DATASET`, :data:`P_EXAMPLE`, :data:`P_HEAD`, ...). Around each widget:

1. :func:`follow` before it: when the URL holds a value this session did not write
   there (a link was opened, or the browser went back), the value is parsed; one that
   names something here becomes the widget's value (over the remembered choice), one
   that does not is returned as missing;
2. :func:`publish` after it: the value shown goes into the URL (dropped when it is the
   fresh session's default), and a missing one is reported with a warning naming what
   the link asked for and what is shown instead (kept while that is still shown).

:func:`bind` does both around one widget in one call (the page passes the widget as a
function that draws it).

Streamlit's own ``bind="query-params"`` is not used: it writes a select box's formatted
label (not the option) into the URL, drops a value it does not know without a word,
and does not write a value seeded from ``st.session_state`` (the pages' remembered
choices), so the URL would not describe a view reopened after a page switch.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Generic, TypeVar

import streamlit as st

from app.state.datasets import (
    BUILTIN,
    BUILTIN_ANSWERS,
    KEY_DATASET,
    DatasetRef,
    dataset_choices,
)
from app.state.heads import HEADS_FROM_CORPUS, HEADS_FROM_HOME
from app.state.runs import CORPUS
from app.state.session import app_state, seed_widget
from app.text import code
from core.base.errors import DataError, RagscopeError
from core.base.examples import TASKS, RAGExample

T = TypeVar("T")
V = TypeVar("V")

# Query parameter names, one per concept, the same on every page.
P_DATASET = "dataset"
P_SPLIT = "split"
P_LIMIT = "n"
P_ANSWER = "answer"
P_EXAMPLE = "example"
P_DETECTOR = "detector"
P_DETECTORS = "detectors"
P_FEATURE = "feature"
P_HEAD = "head"
P_TOP = "top"
P_UNIT = "unit"
P_GRID = "grid"
P_BY_POS = "by_pos"
P_P_STAY = "p_stay"
P_THRESHOLD = "threshold"
P_SMOOTH_ALL = "smooth_all"
P_ONLY_FLAGGED = "only_flagged"
P_MODE = "mode"
P_METHOD = "method"
P_RUN = "run"
P_CV = "cv"
P_MATRIX = "matrix"
P_METRIC = "metric"
P_ITEM = "item"
P_INPUT = "input"
P_HIDE = "hide"
P_CALIBRATE = "calibrate"
P_WALK = "walk"
P_STEP = "step"
P_ORDER = "order"
P_SPAN = "span"
P_GROUP = "group"

WRITTEN_KEY = "ragscope.links.written"
"""Session key: parameter -> the value this session last wrote into the URL."""

NOTICES_KEY = "ragscope.links.notices"
"""Session key: parameter -> (warning, the value shown instead) of a missing link value."""

PAGE_KEY = "ragscope.links.page"
"""Session key: the URL path of the page the last run showed."""

HOME_DATASETS_HERE = (
    "among the datasets Home offers here (the built-in ones, the shared dev sets found, "
    "the imported ones)"
)
DATASETS_HERE = "among the datasets here (the built-in corpus and the datasets Home offers)"


@dataclass(frozen=True, kw_only=True)
class Followed(Generic[T]):
    """What an opened link names for one parameter.

    Attributes:
        value: The parsed value, when the link names something that is here.
        missing: The link's text, when it names something that is not here (or
            cannot be read); both are set when a list is partly here.
    """

    value: T | None = None
    missing: str | None = None


def _written() -> dict[str, str | None]:
    return st.session_state.setdefault(WRITTEN_KEY, {})


def _notices() -> dict[str, tuple[str, str | None]]:
    return st.session_state.setdefault(NOTICES_KEY, {})


def on_page(path: str) -> None:
    """Note the page this run shows (``app/main.py``); a new page drops the warnings
    about the previous page's link."""
    if st.session_state.get(PAGE_KEY) != path:
        st.session_state[PAGE_KEY] = path
        _notices().clear()


def linked(param: str) -> str | None:
    """The URL's value for ``param`` when this session did not write it there, else ``None``."""
    url = st.query_params.get(param)
    if url is None or _written().get(param) == url:
        return None
    return url


def follow(param: str, parse: Callable[[str], T | None]) -> Followed[T]:
    """Read ``param`` of an opened link (:func:`linked`) with ``parse`` (``None``: not here)."""
    raw = linked(param)
    if raw is None:
        return Followed()
    value = parse(raw)
    return Followed(value=value) if value is not None else Followed(missing=raw)


def follow_widget(param: str, key: str, parse: Callable[[str], T | None]) -> Followed[T]:
    """:func:`follow`, and the value found becomes widget ``key``'s value (call before the
    widget is drawn; the remembered value is seeded only when none is set)."""
    link = follow(param, parse)
    if link.value is not None:
        st.session_state[key] = link.value
    return link


def publish(
    param: str,
    shown: str | None,
    *,
    default: str | None = None,
    missing: str | None = None,
    what: str | None = None,
    where: str = "here",
    instead: str | None = None,
) -> None:
    """Put the value shown into the URL, and report a link's missing value.

    Args:
        param: The query parameter.
        shown: The id of what the page shows (``None``: the parameter is not part of
            the view, it leaves the URL).
        default: What a fresh session shows without the parameter (left out of the URL).
        missing: The link's value that is not here (:attr:`Followed.missing`).
        what: What the parameter names, for the warning (default: ``param``).
        where: Where the missing value was looked for: "which is not ``where``".
        instead: How what is shown is named in the warning (Markdown; default:
            ``shown`` as code).
    """
    notices = _notices()
    if missing is not None:
        shown_text = instead if instead is not None else (code(shown) if shown else "nothing")
        notices[param] = (
            f"This link names the {what or param} {code(missing, max_len=80)}, which is not "
            f"{where}; "
            f"showing {shown_text} instead.",
            shown,
        )
    notice = notices.get(param)
    if notice is not None:
        if notice[1] == shown:
            st.warning(notice[0], icon=":material/link_off:")
        else:
            del notices[param]
    target = None if shown == default else shown
    if st.query_params.get(param) != target:
        if target is None:
            del st.query_params[param]
        else:
            st.query_params[param] = target
    _written()[param] = target


def bind(
    param: str,
    key: str,
    widget: Callable[[], V],
    *,
    parse: Callable[[str], V | None],
    to_id: Callable[[V], str | None] = str,
    seed: V | None = None,
    default: str | None = None,
    what: str | None = None,
    where: str = "here",
    instead: Callable[[V], str] | None = None,
) -> V:
    """Tie one widget to one URL parameter, and return what the widget shows.

    This does the three steps around a widget in one call: it reads an opened link's
    value for ``param`` and makes it the value of widget ``key`` (:func:`follow_widget`),
    gives the widget its remembered value ``seed`` when it has none yet, draws the widget
    by calling ``widget()``, then puts the id of the value shown into the URL and warns
    when the link named something that is not here (:func:`publish`).

    Example::

        name = bind(
            P_DATASET,
            KEY_DATASET,
            lambda: st.selectbox("Dataset", names, key=KEY_DATASET),
            parse=one_of(names),
            what="dataset",
        )

    Args:
        param: The query parameter.
        key: The widget's key (``widget`` must draw the widget under this key, without
            a ``value=`` or ``index=`` of its own).
        widget: Draws the widget and returns its value (call a column's method, e.g.
            ``col.radio(...)``, to draw it in a column).
        parse: Reads the link's text into a widget value (``None``: not here).
        to_id: The id the URL shows for a value (default: ``str``).
        seed: The widget's remembered value, set when the widget has none (``None``:
            nothing is seeded).
        default: The id a fresh session shows; it is left out of the URL.
        what: What the parameter names, for the warning (default: ``param``).
        where: Where the missing value was looked for: "which is not ``where``".
        instead: How the value shown is named in the warning (Markdown; default: its
            id as code).
    """
    link = follow_widget(param, key, parse)
    if seed is not None:
        seed_widget(key, seed)
    value = widget()
    publish(
        param,
        to_id(value),
        default=default,
        missing=link.missing,
        what=what,
        where=where,
        instead=None if instead is None else instead(value),
    )
    return value


# --------------------------------------------------------------------------- values


def one_of(options: Collection[str]) -> Callable[[str], str | None]:
    """A parser accepting exactly ``options``."""
    return lambda raw: raw if raw in options else None


def number(lo: float, hi: float) -> Callable[[str], float | None]:
    """A parser of a number from ``lo`` to ``hi``."""

    def parse(raw: str) -> float | None:
        try:
            v = float(raw)
        except ValueError:
            return None
        return v if math.isfinite(v) and lo <= v <= hi else None

    return parse


def integer(lo: int, hi: int) -> Callable[[str], int | None]:
    """A parser of a whole number from ``lo`` to ``hi``."""

    def parse(raw: str) -> int | None:
        return int(raw) if re.fullmatch(r"\d{1,9}", raw) and lo <= int(raw) <= hi else None

    return parse


TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def flag(raw: str) -> bool | None:
    """A parser of a yes/no value (``1``/``0``, ``true``/``false``, ``yes``/``no``, ``on``/``off``)."""
    low = raw.lower()
    return True if low in TRUE else False if low in FALSE else None


def flag_id(value: bool) -> str:
    return "1" if value else "0"


def number_id(value: float, digits: int) -> str:
    """A number as the URL shows it: at most ``digits`` decimals, no trailing zeros."""
    return f"{round(value, digits):.{digits}f}".rstrip("0").rstrip(".")


def head_id(head: tuple[int, int]) -> str:
    """``L3H5`` for layer 3, head 5."""
    return f"L{head[0]}H{head[1]}"


def parse_head(n_layers: int, n_heads: int) -> Callable[[str], tuple[int, int] | None]:
    """A parser of ``L3H5`` (any case) naming one of the model's heads."""

    def parse(raw: str) -> tuple[int, int] | None:
        m = re.fullmatch(r"[Ll](\d{1,4})[Hh](\d{1,4})", raw.strip())
        if m is None:
            return None
        layer, head = int(m[1]), int(m[2])
        return (layer, head) if layer < n_layers and head < n_heads else None

    return parse


def feature_id(k: int) -> str:
    """``F12`` for SAE feature 12."""
    return f"F{k}"


def feature_number(raw: str) -> int | None:
    """The feature number of ``F12`` or ``12``."""
    s = raw.strip()
    s = s[1:] if s[:1] in "Ff" else s
    return int(s) if re.fullmatch(r"\d{1,9}", s) else None


def follow_list(param: str, parse: Callable[[str], T | None]) -> Followed[list[T]]:
    """A link's comma-separated list: the items here (in order, once each), and the others."""
    raw = linked(param)
    if raw is None:
        return Followed()
    found: list[T] = []
    bad: list[str] = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        v = parse(part)
        if v is None:
            bad.append(part)
        elif v not in found:
            found.append(v)
    return Followed(value=found or None, missing=",".join(bad) or None)


def follow_features(param: str, known: Callable[[int], bool]) -> Followed[list[int]]:
    """A link's features (``F12,F40``): those ``known``, and the others."""

    def parse(part: str) -> int | None:
        k = feature_number(part)
        return k if k is not None and known(k) else None

    return follow_list(param, parse)


# --------------------------------------------------------------------------- datasets


def dataset_spec(ref: DatasetRef) -> str:
    """The dataset's spec as the CLI takes it: ``demo``, ``builtin-answers``,
    ``shared:NAME`` or an imported dataset's name."""
    if ref == BUILTIN:
        return "demo"
    if ref == BUILTIN_ANSWERS:
        return "builtin-answers"
    if ref.kind == "shared":
        return "shared:" + ref.name.removesuffix(".jsonl")
    return ref.name


def find_dataset(spec: str) -> DatasetRef | None:
    """The dataset Home offers under ``spec`` (:func:`dataset_spec`), if any."""
    try:
        choices = dataset_choices()
    except RagscopeError:
        return None
    return next((ref for ref in choices if dataset_spec(ref) == spec), None)


def use_home_dataset(ref: DatasetRef) -> None:
    """Make ``ref`` the session's Home dataset (a link names it)."""
    state = app_state()
    if state.dataset != ref:
        state.dataset = ref
        st.session_state.pop(KEY_DATASET, None)


def follow_home_dataset() -> Followed[DatasetRef]:
    """A link's dataset for the pages that read Home's: found, it becomes Home's."""
    link = follow(P_DATASET, find_dataset)
    if link.value is not None:
        use_home_dataset(link.value)
    return link


def page_dataset(raw: str) -> str | None:
    """The page's dataset choice (:data:`HEADS_FROM_CORPUS` or :data:`HEADS_FROM_HOME`)
    for a dataset spec; a Home dataset becomes the session's Home dataset."""
    if raw == CORPUS:
        return HEADS_FROM_CORPUS
    ref = find_dataset(raw)
    if ref is None:
        return None
    use_home_dataset(ref)
    return HEADS_FROM_HOME


def page_dataset_spec(source: str, home: DatasetRef) -> str:
    """The spec of a page's dataset choice: the corpus, or Home's dataset."""
    return CORPUS if source == HEADS_FROM_CORPUS else dataset_spec(home)


# --------------------------------------------------------------------------- own input


MAX_INPUT_LINK = 24_000
"""The longest ``input`` value a link carries (characters): longer inputs get no link
(browsers and servers cut URLs at 32-64 KB)."""

MAX_INPUT_JSON = 256_000
"""The most bytes an ``input`` value may inflate to (a zip bomb stops here)."""

MAX_INPUT_PASSAGES = 32
"""The most passages an ``input`` value may carry."""


@dataclass(frozen=True, kw_only=True)
class OwnInput:
    """An input written in the Playground, as a link carries it.

    Attributes:
        task: One of :data:`core.base.examples.TASKS`.
        question: The question (empty when there is none).
        passages: The passages.
        answer: The answer analysed.
    """

    task: str
    question: str
    passages: tuple[str, ...]
    answer: str


OWN_ID = "your-example"
"""The id of an answer written in the Playground (and of one a link's ``input`` carries)."""


def own_example(x: OwnInput) -> RAGExample:
    """The example a link's ``input`` carries (id :data:`OWN_ID`).

    Raises:
        DataError: It is not a valid example (an empty answer, no passage).
    """
    return RAGExample(
        id=OWN_ID,
        task=x.task,  # type: ignore[arg-type]
        question=x.question or None,
        passages=x.passages,
        response=x.answer,
    )


def example_input(example: RAGExample) -> str | None:
    """``example`` as a link's ``input`` value (:func:`input_id`); ``None`` when it is too
    long for a link or carries a verbatim prompt (which a link does not carry)."""
    if example.prompt is not None:
        return None
    return input_id(
        OwnInput(
            task=example.task,
            question=example.question or "",
            passages=example.passages,
            answer=example.response,
        )
    )


def pack_input(doc: bytes) -> str:
    """An ``input`` value carrying the JSON ``doc``: ``1.`` + URL-safe base64 of it
    deflated (what :func:`input_id` writes and :func:`parse_input` reads)."""
    return "1." + base64.urlsafe_b64encode(zlib.compress(doc, 9)).decode().rstrip("=")


def input_id(x: OwnInput) -> str | None:
    """``x`` as the URL carries it (:func:`pack_input` of its JSON); ``None`` when that
    is longer than :data:`MAX_INPUT_LINK`."""
    doc = {"t": x.task, "q": x.question, "p": list(x.passages), "a": x.answer}
    out = pack_input(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode())
    return out if len(out) <= MAX_INPUT_LINK else None


def _lone_surrogate(text: str) -> int | None:
    """The position of the first lone surrogate in ``text`` (a JSON ``\\ud800`` escape
    decodes to one; no UTF-8 text, so no widget, URL or tokenizer, can carry it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def read_input(raw: str) -> OwnInput:
    """The input an ``input`` value carries.

    Raises:
        DataError: When it is not one this page wrote, naming what is wrong: a wrong
            version, bad base64 or deflate data, more than :data:`MAX_INPUT_JSON` bytes
            inflated, not the exact JSON shape, an unknown task, a lone surrogate.
    """
    if len(raw) > MAX_INPUT_LINK:
        raise DataError(f"it is {len(raw):,} characters long, over {MAX_INPUT_LINK:,}")
    if not raw.startswith("1."):
        raise DataError("it does not start with version 1.")
    body = raw[2:]
    inflater = zlib.decompressobj()
    try:
        packed = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        data = inflater.decompress(packed, MAX_INPUT_JSON)
    except (ValueError, binascii.Error, zlib.error):
        raise DataError("it is not base64 of deflated data") from None
    if inflater.unconsumed_tail:
        raise DataError(f"it inflates to more than {MAX_INPUT_JSON:,} bytes")
    if not inflater.eof:
        raise DataError("its deflated data is cut short")
    try:
        doc = json.loads(data.decode())
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise DataError("it does not inflate to JSON") from None
    if not isinstance(doc, dict) or set(doc) != {"t", "q", "p", "a"}:
        raise DataError("its JSON is not an object of t, q, p and a")
    task, question, passages, answer = doc["t"], doc["q"], doc["p"], doc["a"]
    if not (isinstance(task, str) and task in TASKS):
        raise DataError("its task is not one of " + ", ".join(TASKS))
    if not (isinstance(question, str) and isinstance(answer, str) and answer.strip()):
        raise DataError("its question or answer is not text, or the answer is empty")
    if not isinstance(passages, list) or not 1 <= len(passages) <= MAX_INPUT_PASSAGES:
        raise DataError(f"it does not hold 1 to {MAX_INPUT_PASSAGES} passages")
    if not all(isinstance(p, str) and p.strip() for p in passages):
        raise DataError("a passage is not text, or empty")
    texts = [("the question", question), ("the answer", answer)]
    texts += [(f"passage {k}", p) for k, p in enumerate(passages, 1)]
    for name, text in texts:
        at = _lone_surrogate(text)
        if at is not None:
            raise DataError(
                f"{name} holds a lone surrogate, U+{ord(text[at]):04X} at character {at + 1}, "
                "which no text can carry"
            )
    return OwnInput(task=task, question=question, passages=tuple(passages), answer=answer)


def input_problem(raw: str) -> str | None:
    """What is wrong with an ``input`` value (:func:`read_input`), ``None`` if nothing."""
    try:
        read_input(raw)
    except DataError as e:
        return str(e)
    return None


def parse_input(raw: str) -> OwnInput | None:
    """The input an ``input`` value carries, or ``None`` when it is not one this page
    wrote (:func:`read_input` says why)."""
    try:
        return read_input(raw)
    except DataError:
        return None
