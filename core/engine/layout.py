"""Layout: the exact token sequence the model reads, and where each part sits.

``render(example, model)`` builds the prompt (ragscope's own wording per task,
or the record's verbatim prompt), wraps it in the chat template when the model
has one, appends the response, and records the token range of every segment:
template, instruction, question, each passage, response. Each piece is
tokenized on its own, so segment boundaries are exact token boundaries and the
response's token ids do not depend on the context (the no-context variant has
the same response ids, which :func:`render` asserts).

Every detector asks the Layout for positions; nothing re-tokenizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from core.base.errors import DataError
from core.base.examples import RAGExample, Span
from core.engine.chat_template import chat_frame_text, content_mark, special_tokens, template_of
from core.engine.model import LoadedModel, decode

if TYPE_CHECKING:
    import pandas as pd

SegmentKind = Literal["template", "instruction", "question", "passage", "response"]
SEGMENT_KINDS: tuple[SegmentKind, ...] = (
    "template",
    "instruction",
    "question",
    "passage",
    "response",
)


INSTRUCTIONS: dict[str, str] = {
    "qa": (
        "Answer the question using only the passages below. If the passages do not "
        "contain the answer, say that you cannot answer from them."
    ),
    "summary": "Summarize the following text in a few sentences, using only what it says.",
    "data2txt": (
        "Write an objective overview of the following structured data in plain prose, "
        "using only the facts it contains."
    ),
    "other": "Respond using only the passages below.",
}


@dataclass(frozen=True, kw_only=True)
class Segment:
    """A token range ``[start, end)`` of the layout with one role.

    Attributes:
        kind: template, instruction, question, passage or response.
        start: First token (absolute position).
        end: One past the last token.
        index: Passage number (0-based) for passages, else ``None``.
    """

    kind: SegmentKind
    start: int
    end: int
    index: int | None = None

    @property
    def label(self) -> str:
        return (
            f"passage {self.index + 1}"
            if self.kind == "passage" and self.index is not None
            else self.kind
        )

    def __len__(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, kw_only=True)
class Piece:
    """A prompt text piece before tokenization."""

    kind: SegmentKind
    text: str
    index: int | None = None


@dataclass(frozen=True, kw_only=True, eq=False)
class Layout:
    """The tokens one forward pass reads, with segment ranges and response maps.

    Attributes:
        example_id: The example this layout renders.
        token_ids: All token ids, shape ``[pos]``.
        segments: Contiguous, covering segments in position order.
        response_offsets: ``[n_response_tokens, 2]`` character range of each
            response token in the response text.
        response_text: The response as analysed.
        with_context: False for the no-context variant (passages removed).
        spans: The example's labelled spans (character offsets).
        passage_texts: The passages' text by passage index (empty without context).
        passage_offsets: Per passage, ``[n_passage_tokens, 2]`` character range
            of each of its tokens in its text (covering, like the response's).
    """

    example_id: str
    token_ids: np.ndarray
    segments: tuple[Segment, ...]
    response_offsets: np.ndarray
    response_text: str
    with_context: bool = True
    spans: tuple[Span, ...] = ()
    passage_texts: tuple[str, ...] = ()
    passage_offsets: tuple[np.ndarray, ...] = field(default=(), repr=False)
    _tokens: tuple[str, ...] = field(default=(), repr=False)

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def response(self) -> Segment:
        return self.segments[-1]

    @property
    def response_positions(self) -> np.ndarray:
        """Absolute positions ``p_j`` of the response tokens."""
        r = self.response
        return np.arange(r.start, r.end)

    @property
    def generation_positions(self) -> np.ndarray:
        """Positions ``g_j = p_j - 1`` whose next-token distribution produced ``y_j``."""
        return self.response_positions - 1

    @property
    def response_ids(self) -> np.ndarray:
        r = self.response
        return self.token_ids[r.start : r.end]

    @property
    def passage_segments(self) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.kind == "passage")

    def context_positions(self) -> np.ndarray:
        """Positions of the retrieved passages' tokens (not template/instruction/question)."""
        parts = [np.arange(s.start, s.end) for s in self.passage_segments]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def segment_at(self, pos: int) -> Segment:
        for s in self.segments:
            if s.start <= pos < s.end:
                return s
        raise IndexError(f"position {pos} is outside the layout (0..{len(self) - 1})")

    def segment_labels(self) -> list[str]:
        """One segment label per position (``template``, ``passage 2``, ``response``, ...)."""
        out: list[str] = []
        for s in self.segments:
            out.extend([s.label] * len(s))
        return out

    # -- response characters <-> tokens -----------------------------------------

    def char_to_token(self, char: int) -> int:
        """Index (within the response) of the token covering response character ``char``."""
        if not 0 <= char < len(self.response_text):
            raise IndexError(
                f"character {char} is outside the response (0..{len(self.response_text) - 1})"
            )
        o = self.response_offsets
        hits = np.nonzero((o[:, 0] <= char) & (char < o[:, 1]))[0]
        if hits.size:
            return int(hits[0])
        # A character no token claims (offsets trimmed whitespace): the next token.
        after = np.nonzero(o[:, 0] > char)[0]
        return int(after[0]) if after.size else int(o.shape[0] - 1)

    def chars_to_tokens(self, start: int, end: int) -> tuple[int, int]:
        """Response-token range ``[a, b)`` of tokens overlapping characters ``[start, end)``."""
        if not 0 <= start < end <= len(self.response_text):
            raise IndexError(f"character range [{start}, {end}) is outside the response")
        o = self.response_offsets
        hit = np.nonzero((o[:, 0] < end) & (start < o[:, 1]))[0]
        if hit.size == 0:
            a = self.char_to_token(start)
            return a, a + 1
        return int(hit[0]), int(hit[-1]) + 1

    def tokens_to_chars(self, a: int, b: int) -> tuple[int, int]:
        """Character range covered by response tokens ``[a, b)``."""
        if not 0 <= a < b <= self.response_offsets.shape[0]:
            raise IndexError(f"token range [{a}, {b}) is outside the response")
        o = self.response_offsets[a:b]
        return int(o[:, 0].min()), int(o[:, 1].max())

    # -- passage characters -> tokens -------------------------------------------

    def passage_segment(self, index: int) -> Segment:
        """The segment of passage ``index`` (0-based)."""
        for s in self.passage_segments:
            if s.index == index:
                return s
        raise IndexError(
            f"passage {index} is not in this layout "
            f"({len(self.passage_segments)} passage segment(s))"
        )

    def passage_chars_to_positions(self, index: int, start: int, end: int) -> tuple[int, int]:
        """Absolute positions ``[a, b)`` of passage ``index``'s tokens overlapping ``[start, end)``.

        Args:
            index: Passage number (0-based).
            start: First character in the passage text.
            end: One past the last character.
        """
        seg = self.passage_segment(index)
        if index >= len(self.passage_offsets):
            raise IndexError(f"this layout carries no character offsets for passage {index}")
        text = self.passage_texts[index]
        if not 0 <= start < end <= len(text):
            raise IndexError(
                f"character range [{start}, {end}) is outside passage {index} "
                f"({len(text)} characters)"
            )
        o = self.passage_offsets[index]
        hit = np.nonzero((o[:, 0] < end) & (start < o[:, 1]))[0]
        # Offsets are widened to cover every character, so some token always overlaps.
        assert hit.size, f"no token of passage {index} covers [{start}, {end})"
        return seg.start + int(hit[0]), seg.start + int(hit[-1]) + 1

    def response_chars_to_positions(self, start: int, end: int) -> tuple[int, int]:
        """Absolute positions ``[a, b)`` of response tokens overlapping characters ``[start, end)``."""
        a, b = self.chars_to_tokens(start, end)
        return self.response.start + a, self.response.start + b

    def token_labels(self) -> np.ndarray | None:
        """Per response token: 1 when its characters overlap a labelled span, else 0.

        ``None`` when the example carries no span labels.
        """
        if not self.spans:
            return None
        o = self.response_offsets
        lab = np.zeros(o.shape[0], dtype=np.int8)
        for s in self.spans:
            lab |= ((o[:, 0] < s.end) & (s.start < o[:, 1])).astype(np.int8)
        return lab

    def token_strings(self) -> tuple[str, ...]:
        """Readable text of every token (as decoded one by one)."""
        return self._tokens

    def response_token_strings(self) -> tuple[str, ...]:
        r = self.response
        return self._tokens[r.start : r.end]

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(
            {
                "position": np.arange(len(self)),
                "token_id": self.token_ids,
                "token": list(self._tokens),
                "segment": self.segment_labels(),
            }
        )


# ----------------------------------------------------------------------------- prompts


def prompt_pieces(
    *,
    task: str,
    question: str | None,
    passages: Sequence[str],
    prompt: str | None = None,
    with_context: bool = True,
    source: str = "example",
) -> list[Piece]:
    """The user-message text split into labelled pieces.

    With ``prompt`` (a record's verbatim prompt) the question and each passage
    are located inside it; the text around them is ``instruction``. Otherwise
    ragscope's own wording for the task is used.
    """
    if prompt is not None:
        return _verbatim_pieces(prompt, question, passages, with_context, source)
    pieces: list[Piece] = [
        Piece(kind="instruction", text=INSTRUCTIONS.get(task, INSTRUCTIONS["other"]))
    ]
    if with_context:
        for k, p in enumerate(passages):
            label = (
                "Text"
                if task == "summary" and len(passages) == 1
                else ("Data" if task == "data2txt" and len(passages) == 1 else f"Passage {k + 1}")
            )
            pieces.append(Piece(kind="instruction", text=f"\n\n{label}:\n"))
            pieces.append(Piece(kind="passage", text=p, index=k))
    if question is not None:
        pieces.append(Piece(kind="instruction", text="\n\nQuestion: "))
        pieces.append(Piece(kind="question", text=question))
    return pieces


def _verbatim_pieces(
    prompt: str, question: str | None, passages: Sequence[str], with_context: bool, source: str
) -> list[Piece]:
    found: list[tuple[int, int, SegmentKind, int | None]] = []
    cursor = 0
    targets: list[tuple[str, SegmentKind, int | None]] = []
    if question is not None:
        targets.append((question, "question", None))
    targets += [(p, "passage", k) for k, p in enumerate(passages)]
    for text, kind, idx in targets:
        # Prefer the first occurrence after what was already placed; texts in the
        # record usually appear in order, and repeated snippets must not collide.
        at = prompt.find(text, cursor)
        if at < 0:
            at = prompt.find(text)
        if at < 0:
            what = "the question" if kind == "question" else f"passage {idx}"
            raise DataError(
                f"{what} does not occur verbatim in the prompt", source=source, field="prompt"
            )
        span = (at, at + len(text))
        if any(span[0] < e and s < span[1] for s, e, _, _ in found):
            raise DataError(
                f"{kind} {idx if idx is not None else ''} overlaps another part of the prompt",
                source=source,
                field="prompt",
            )
        found.append((span[0], span[1], kind, idx))
        cursor = span[1]
    found.sort()
    pieces: list[Piece] = []
    prev = 0
    for s, e, kind, idx in found:
        if s > prev:
            pieces.append(Piece(kind="instruction", text=prompt[prev:s]))
        if kind != "passage" or with_context:
            pieces.append(Piece(kind=kind, text=prompt[s:e], index=idx))
        prev = e
    if prev < len(prompt):
        pieces.append(Piece(kind="instruction", text=prompt[prev:]))
    return pieces


def chat_frame(tokenizer: object, source: str | None = None) -> tuple[str, str]:
    """Template text before and after the user message (with the assistant header),
    rendered under limits (:mod:`core.engine.chat_template`: a template is code from the
    model file); empty strings when the tokenizer has no chat template.

    Raises:
        ModelError: The template is over a rendering limit, fails, or does not place
            the user message verbatim.
    """
    template = template_of(tokenizer)
    if template is None:
        return "", ""
    frame = chat_frame_text(
        template, ("user",), special_tokens(tokenizer), add_generation_prompt=True, source=source
    )
    before, after = frame.split(content_mark(0))
    return before, after


# ----------------------------------------------------------------------------- render


def _encode(tokenizer: object, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]  # the tokenizer is typed object (a model or a tokenizer)


def _bos(tokenizer: object) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    return [bos] if bos is not None else []


def encode_prompt(tokenizer: object, pieces: Sequence[Piece]) -> tuple[list[int], list[Segment]]:
    """Token ids and segments of the prompt (template + user pieces + assistant header)."""
    before, after = chat_frame(tokenizer)
    ids: list[int] = []
    segs: list[Segment] = []

    def add(kind: SegmentKind, toks: list[int], index: int | None = None) -> None:
        if not toks:
            return
        start = len(ids)
        ids.extend(toks)
        if (
            segs
            and segs[-1].kind == kind
            and kind in ("template", "instruction")
            and segs[-1].end == start
        ):
            segs[-1] = Segment(kind=kind, start=segs[-1].start, end=len(ids))
        else:
            segs.append(Segment(kind=kind, start=start, end=len(ids), index=index))

    # A chat template writes its own BOS (or deliberately none); plain models get one.
    add("template", _encode(tokenizer, before) if before else _bos(tokenizer))
    for p in pieces:
        add(p.kind, _encode(tokenizer, p.text), p.index)
    add("template", _encode(tokenizer, after) if after else _encode(tokenizer, "\n\nAnswer: "))
    return ids, segs


def response_encoding(
    tokenizer: object, response: str, response_ids: Sequence[int] | None = None
) -> tuple[list[int], np.ndarray]:
    """Token ids of the response and each token's character range in it.

    With ``response_ids`` (a response the analysing model generated itself) the
    model's own tokens are kept, and offsets come from incremental decoding.
    """
    if response_ids is None:
        enc = tokenizer(response, add_special_tokens=False, return_offsets_mapping=True)  # type: ignore[operator]  # the tokenizer is typed object
        ids = list(enc["input_ids"])
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        return ids, _widen_offsets(offsets, len(response))
    ids = list(response_ids)
    offsets = np.zeros((len(ids), 2), dtype=np.int64)
    prev = 0
    for j in range(len(ids)):
        text = decode(tokenizer, ids[: j + 1], clean_up_tokenization_spaces=False)
        n = len(text.rstrip("\ufffd")) if j + 1 < len(ids) else len(text)
        n = min(max(n, prev), len(response))
        # A token ending in part of a multibyte character also covers that
        # character (as the tokenizer's offset mapping does); the next token
        # starts on it.
        partial = j + 1 < len(ids) and text.endswith("\ufffd")
        offsets[j] = (prev, min(n + 1, len(response)) if partial else n)
        prev = n
    return ids, _widen_offsets(offsets, len(response))


def _widen_offsets(offsets: np.ndarray, n_chars: int) -> np.ndarray:
    """Give every token a non-empty character range and every character a token.

    Byte-level tokenizers trim leading spaces from offsets (gaps) and split a
    multibyte character across tokens (repeated or empty ranges); labels and
    heatmaps need a covering, non-empty range per token.
    """
    o = offsets.copy()
    prev_end = 0
    for j in range(o.shape[0]):
        a, b = int(o[j, 0]), int(o[j, 1])
        if a > prev_end:  # a gap: the following token owns it
            a = prev_end
        b = max(b, a + 1)
        o[j] = (min(a, n_chars - 1), min(b, n_chars))
        prev_end = max(prev_end, int(o[j, 1]))
    if o.shape[0]:
        o[-1, 1] = n_chars
    return o


def render(
    example: RAGExample,
    model: LoadedModel | object,
    *,
    with_context: bool = True,
    response_ids: Sequence[int] | None = None,
    max_tokens: int | None = None,
) -> Layout:
    """Render an example into the exact token layout the model reads.

    Args:
        example: The RAG example.
        model: A :class:`~core.engine.model.LoadedModel` (or a bare tokenizer).
        with_context: False drops the passages (the no-context variant).
        response_ids: The response's own token ids when the analysing model
            generated it; must decode to ``example.response``.
        max_tokens: Refuse layouts longer than this (default: the model's n_ctx).

    Raises:
        DataError: the prompt cannot be laid out, the response does not
            round-trip through the tokenizer, or the layout is too long.
    """
    tokenizer: Any = getattr(model, "tokenizer", model)
    src = example.provenance.source or f"record {example.id!r}"
    pieces = prompt_pieces(
        task=example.task,
        question=example.question,
        passages=example.passages,
        prompt=example.prompt,
        with_context=with_context,
        source=src,
    )
    ids, segs = encode_prompt(tokenizer, pieces)
    passage_offsets = _passage_offsets(tokenizer, pieces, ids, segs, src)
    if response_ids is not None:
        decoded = decode(tokenizer, response_ids, clean_up_tokenization_spaces=False)
        if decoded != example.response:
            raise DataError(
                "response_ids do not decode to the response text", source=src, field="response"
            )
    r_ids, offsets = response_encoding(tokenizer, example.response, response_ids)
    if not r_ids:
        raise DataError("the response has no tokens", source=src, field="response")
    if response_ids is None:
        decoded = decode(tokenizer, r_ids, clean_up_tokenization_spaces=False)
        if decoded != example.response:
            # Byte-level vocabularies can lack rare bytes (SmolLM2 has no token for
            # some control characters or for code points above U+3FFFF).
            lost = sorted({c for c in example.response if c not in decoded})
            raise DataError(
                "the response does not round-trip through the tokenizer (characters "
                f"{', '.join(f'U+{ord(c):04X}' for c in lost[:5]) or 'unknown'} cannot be "
                "encoded); remove them from the response",
                source=src,
                field="response",
            )
    start = len(ids)
    ids.extend(r_ids)
    segs.append(Segment(kind="response", start=start, end=len(ids)))
    limit = max_tokens or getattr(getattr(model, "info", None), "n_ctx", None)
    if limit is not None and len(ids) > limit:
        raise DataError(
            f"the layout has {len(ids)} tokens, more than the model's {limit}; "
            "shorten the passages or the response",
            source=src,
        )
    tokens = tuple(
        tokenizer.convert_tokens_to_string([t]) if t is not None else ""
        for t in tokenizer.convert_ids_to_tokens(ids)
    )
    layout = Layout(
        example_id=example.id,
        token_ids=np.asarray(ids, dtype=np.int64),
        segments=tuple(segs),
        response_offsets=offsets,
        response_text=example.response,
        with_context=with_context,
        spans=example.spans,
        passage_texts=example.passages if with_context else (),
        passage_offsets=passage_offsets,
        _tokens=tokens,
    )
    return layout


def _passage_offsets(
    tokenizer: object,
    pieces: Sequence[Piece],
    ids: Sequence[int],
    segs: Sequence[Segment],
    source: str,
) -> tuple[np.ndarray, ...]:
    """Character range of every passage token in its passage, by passage index.

    Each passage is tokenized on its own (see :func:`encode_prompt`), so its
    offsets come from tokenizing the same text again with an offset mapping.
    """
    texts = {p.index: p.text for p in pieces if p.kind == "passage" and p.index is not None}
    out: list[np.ndarray] = []
    for k in range(len(texts)):
        seg = next((s for s in segs if s.kind == "passage" and s.index == k), None)
        if seg is None:
            raise DataError(
                f"passage {k + 1} encodes to no token for this tokenizer (only control "
                f"characters?): {texts[k][:40]!r}; remove it or give it readable text",
                source=source,
                field="passages",
            )
        p_ids, offsets = response_encoding(tokenizer, texts[k])
        if p_ids != list(ids[seg.start : seg.end]):
            raise DataError(
                f"passage {k} tokenizes differently with offsets", source=source, field="passages"
            )
        out.append(offsets)
    return tuple(out)


def render_pair(
    example: RAGExample, model: LoadedModel | object, **kw: object
) -> tuple[Layout, Layout]:
    """The layout with context and its no-context variant (same response ids)."""
    full = render(example, model, **kw)  # type: ignore[arg-type]  # render's own keywords
    bare = render(example, model, with_context=False, **kw)  # type: ignore[arg-type]  # render's own keywords
    assert np.array_equal(full.response_ids, bare.response_ids), (
        "response ids differ without context"
    )
    return full, bare
