"""Chunking: splitter offsets (property tests), sentence splitting, token ranges, labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from langchain_text_splitters import RecursiveCharacterTextSplitter

from core.base.errors import DataError
from core.base.examples import RAGExample, Span
from core.data import load_dataset
from core.engine.layout import render
from core.signals.chunking import (
    Chunk,
    chunk_example,
    chunk_labels,
    split_recursive,
    split_sentences,
    split_sentences_many,
    split_text,
)

PAIR = Path(__file__).resolve().parents[1] / "fixtures" / "ragtruth_pair"

PROPS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Few distinct pieces, so generated texts repeat sentences and words a lot (the
# case where locating a chunk by its first occurrence goes wrong).
_PIECES = [
    "The bridge was built in 1820.",
    "It is made of grey limestone.",
    "Ada",
    "Lovell",
    "x" * 37,
    "ab.",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "é",
]
repetitive = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=120).map("".join)
spaced = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=120).map(" ".join)
any_text = st.one_of(repetitive, spaced, st.text(max_size=300))


def _assert_recursive_spans(text: str, spans, chunk_size: int, overlap: int) -> None:
    splitter = RecursiveCharacterTextSplitter(chunk_size=chunk_size, chunk_overlap=overlap)
    assert [text[a:b] for a, b in spans] == splitter.split_text(text)
    for a, b in spans:
        assert 0 <= a < b <= len(text)
        assert b - a <= chunk_size
        assert text[a:b] == text[a:b].strip(), "no leading/trailing whitespace"
    for (a0, b0), (a1, _) in zip(spans, spans[1:], strict=False):
        assert a1 >= a0, "chunks in text order"
        assert b0 - a1 <= overlap, "consecutive chunks share at most `overlap` characters"
    covered = np.zeros(len(text), dtype=bool)
    for a, b in spans:
        covered[a:b] = True
    ink = np.array([not c.isspace() for c in text], dtype=bool)
    assert not (ink & ~covered).any(), "every non-whitespace character is in a chunk"


# -- recursive splitter ----------------------------------------------------------------


@PROPS
@given(text=any_text, size=st.sampled_from([(512, 20), (40, 10), (25, 20), (8, 0), (3, 2)]))
@example(text=("Alpha beta gamma. " * 80), size=(512, 20))
@example(text=("a" * 2000), size=(512, 20))
def test_recursive_offsets_property(text: str, size: tuple[int, int]) -> None:
    spans = split_recursive(text, chunk_size=size[0], chunk_overlap=size[1])
    _assert_recursive_spans(text, spans, *size)


def test_recursive_defaults_paper_settings() -> None:
    text = " ".join(f"Sentence number {k} says something about the bridge." for k in range(80))
    spans = split_recursive(text)
    assert len(spans) > 5
    _assert_recursive_spans(text, spans, 512, 20)
    assert max(b - a for a, b in spans) > 400, "chunks fill up towards 512 characters"


def test_recursive_repeated_text_gets_true_offsets() -> None:
    # LangChain's own add_start_index places both chunks at 2 (it searches from
    # an estimated offset that stripped whitespace throws off).
    text = "\n ab \n \n ab"
    spans = split_recursive(text, chunk_size=10, chunk_overlap=3)
    assert spans == [(2, 4), (9, 11)]
    _assert_recursive_spans(text, spans, 10, 3)
    splitter = RecursiveCharacterTextSplitter(chunk_size=10, chunk_overlap=3, add_start_index=True)
    theirs = [d.metadata["start_index"] for d in splitter.create_documents([text])]
    assert theirs == [2, 2], "the case still exercises what add_start_index gets wrong"
    # A sentence repeated many times: every copy found in its own place.
    text = "The bridge was built in 1820. " * 60
    spans = split_recursive(text)
    _assert_recursive_spans(text, spans, 512, 20)
    assert len({a for a, _ in spans}) == len(spans) > 3


def test_recursive_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="chunk_overlap"):
        split_recursive("some text", chunk_size=10, chunk_overlap=10)
    with pytest.raises(ValueError, match="unknown chunk method"):
        split_text("some text", "words")  # type: ignore[arg-type]


def test_recursive_whitespace_only_gives_no_chunks() -> None:
    assert split_recursive("  \n\n \t ") == []
    assert split_recursive("") == []


# -- sentence splitter -----------------------------------------------------------------


def test_sentences_abbreviations() -> None:
    text = "Dr. Smith arrived at 5 p.m. on Monday. He left."
    spans = split_sentences(text)
    assert [text[a:b] for a, b in spans] == ["Dr. Smith arrived at 5 p.m. on Monday.", "He left."]


def test_sentences_trimmed_and_paragraphs_split() -> None:
    text = "  First one here. Second one follows!\n\n  A new paragraph without a stop\n \nLast."
    spans = split_sentences(text)
    got = [text[a:b] for a, b in spans]
    assert got == [
        "First one here.",
        "Second one follows!",
        "A new paragraph without a stop",
        "Last.",
    ]
    for a, b in spans:
        assert text[a:b] == text[a:b].strip() and b > a


@PROPS
@given(texts=st.lists(any_text, min_size=1, max_size=3))
def test_sentences_offsets_property(texts: list[str]) -> None:
    for text, spans in zip(texts, split_sentences_many(texts), strict=True):
        prev_end = 0
        for a, b in spans:
            assert prev_end <= a < b <= len(text), "sentences are in order and disjoint"
            assert text[a:b].strip() == text[a:b]
            prev_end = b
        ink = "".join(c for c in text if not c.isspace())
        assert "".join(c for a, b in spans for c in text[a:b] if not c.isspace()) == ink


# -- chunks of a layout ----------------------------------------------------------------


def _decode(tok, ids) -> str:
    return tok.decode([int(i) for i in ids], clean_up_tokenization_spaces=False)


def _check_chunkset(cs, layout, tok, passages, *, decode: bool = True) -> None:
    r = layout.response
    assert cs.response, "a non-empty response has chunks"
    for c in cs.response:
        assert c.source == "response" and c.passage is None
        assert c.text == layout.response_text[c.start : c.end]
        assert r.start <= c.tok_start < c.tok_end <= r.end
        if decode:
            assert c.text in _decode(tok, layout.token_ids[c.tok_start : c.tok_end])
    for c in cs.context:
        seg = layout.passage_segment(c.passage)
        assert seg.kind == "passage"
        assert c.text == passages[c.passage][c.start : c.end]
        assert seg.start <= c.tok_start < c.tok_end <= seg.end, "context chunks lie in passages"
        if decode:
            assert c.text in _decode(tok, layout.token_ids[c.tok_start : c.tok_end])
    assert {c.passage for c in cs.context} == set(range(len(passages)))
    # Tight: the range is exactly the tokens overlapping the chunk's characters.
    for c in cs.response:
        a, b = c.tok_start - r.start, c.tok_end - r.start
        o = layout.response_offsets
        assert o[a, 0] < c.end and c.start < o[a, 1]
        assert o[b - 1, 0] < c.end and c.start < o[b - 1, 1]


@pytest.mark.parametrize("method", ["recursive", "sentence"])
def test_chunk_toy_example(tiny_model, toy_example, method) -> None:
    layout = render(toy_example, tiny_model)
    cs = chunk_example(layout, method)
    _check_chunkset(cs, layout, tiny_model.tokenizer, toy_example.passages)
    assert cs.method == method and cs.example_id == toy_example.id
    # One short sentence per passage and one in the response: one chunk each way.
    assert [c.text for c in cs.context] == list(toy_example.passages)
    assert [c.text for c in cs.response] == [toy_example.response]
    (c,) = cs.response
    assert (c.tok_start, c.tok_end) == (layout.response.start, layout.response.end)
    assert cs.labels().tolist() == [1]
    frame = cs.to_frame()
    assert len(frame) == 3 and frame["source"].tolist() == ["response", "passage 1", "passage 2"]


def test_chunk_labels_from_gold_spans(tiny_model) -> None:
    response = (
        "The Old Bridge was built by Ada Lovell in 1820. It is made of red granite. "
        "It spans the river Wend."
    )
    start = response.index("red granite")
    ex = RAGExample(
        id="lab",
        question="What is the bridge made of?",
        passages=("The Old Bridge was built by Ada Lovell in 1820 from grey limestone.",),
        response=response,
        spans=(Span(start=start, end=start + len("red granite")),),
    )
    layout = render(ex, tiny_model)
    cs = chunk_example(layout, "sentence")
    assert [c.text for c in cs.response] == [
        "The Old Bridge was built by Ada Lovell in 1820.",
        "It is made of red granite.",
        "It spans the river Wend.",
    ]
    assert cs.labels().tolist() == [0, 1, 0]
    assert chunk_labels(ex.spans, cs.response_offsets).tolist() == [0, 1, 0]
    assert chunk_labels([(0, 1)], cs.response_offsets).tolist() == [1, 0, 0]
    assert chunk_labels([], cs.response_offsets).tolist() == [0, 0, 0]
    # Recursive chunks of 30 characters: exactly those touching the span are positive.
    small = chunk_example(layout, "recursive", chunk_size=30, chunk_overlap=5)
    want = [int(c.overlaps(start, start + len("red granite"))) for c in small.response]
    assert small.labels().tolist() == want and 0 < sum(want) < len(want)
    # Spans on a chunk's first or last token only.
    first_stop = response.index("1820.") + 4
    it = response.index("It is")
    for (a, b), want in (
        ((0, 3), [1, 0, 0]),
        ((first_stop, first_stop + 1), [1, 0, 0]),
        ((it, it + 2), [0, 1, 0]),
        ((len(response) - 1, len(response)), [0, 0, 1]),
    ):
        edge = render(
            RAGExample(
                id="edge",
                question=ex.question,
                passages=ex.passages,
                response=response,
                spans=(Span(start=a, end=b),),
            ),
            tiny_model,
        )
        assert chunk_example(edge, "sentence").labels().tolist() == want, response[a:b]
    # Without spans (and a faithful label) there are no gold chunk labels, like tokens.
    bare = render(ex.with_response(response), tiny_model)
    assert chunk_example(bare, "sentence").labels() is None


def test_chunk_many_recursive_chunks_map_to_tokens(tiny_model) -> None:
    passages = (
        " ".join(f"Fact {k}: the bridge has {k} arches." for k in range(40)),
        "Short second passage. " * 30,
    )
    response = "The bridge has 3 arches. " * 12 + "It was painted blue."
    ex = RAGExample(id="many", question="How many arches?", passages=passages, response=response)
    layout = render(ex, tiny_model)
    cs = chunk_example(layout, "recursive", chunk_size=60, chunk_overlap=20)
    assert len(cs.response) > 3 and len(cs.context) > 10
    _check_chunkset(cs, layout, tiny_model.tokenizer, passages)
    offs = cs.context_offsets
    assert offs.shape == (len(cs.context), 2) and (offs[:, 1] > offs[:, 0]).all()


def test_chunk_no_context_layout(tiny_model, toy_example) -> None:
    bare = render(toy_example, tiny_model, with_context=False)
    cs = chunk_example(bare, "sentence")
    assert cs.context == () and len(cs.response) == 1


@pytest.mark.parametrize("method", ["recursive", "sentence"])
def test_chunk_ragtruth_verbatim_prompt(tiny_model, method) -> None:
    rep = load_dataset(PAIR)
    for ex in rep.examples:
        assert ex.prompt is not None
        layout = render(ex, tiny_model)
        cs = chunk_example(layout, method)
        _check_chunkset(cs, layout, tiny_model.tokenizer, ex.passages)
        # The passages' chunks never reach into the prompt's other text.
        other = [s for s in layout.segments if s.kind != "passage"]
        for c in cs.context:
            assert not any(s.start < c.tok_end and c.tok_start < s.end for s in other)
        q = ex.question
        if q is not None:
            assert all(q not in c.text for c in cs.context)
        labels = cs.labels()
        if ex.spans:
            assert labels is not None and labels.any()
            span = ex.spans[0]
            assert all(
                labels[k] == 1
                for k, c in enumerate(cs.response)
                if c.overlaps(span.start, span.end)
            )


def test_ragtruth_qa_sentences_in_passage(tiny_model) -> None:
    ex = next(e for e in load_dataset(PAIR).examples if e.id == "r2")
    cs = chunk_example(render(ex, tiny_model), "sentence")
    assert [c.text for c in cs.context] == [
        "The Tamsin Observatory sits on a hill west of Rellen.",
        "Its copper roof turned green decades ago.",
        "Visitors may use the main telescope on clear Friday nights.",
    ]
    assert [c.passage for c in cs.context] == [0, 0, 1]


_WORDS = st.sampled_from(
    [
        "The",
        "bridge",
        "was",
        "built",
        "in",
        "1820.",
        "Ada",
        "said:",
        "yes!",
        "It",
        "is",
        "grey",
        "\n",
    ]
)
_SENTENCE = st.lists(_WORDS, min_size=1, max_size=25).map(" ".join).filter(str.strip)


@PROPS
@given(
    passages=st.lists(_SENTENCE, min_size=1, max_size=3),
    response=_SENTENCE,
    method=st.sampled_from(["recursive", "sentence"]),
)
def test_chunk_token_ranges_property(tiny_model, passages, response, method) -> None:
    ex = RAGExample(id="p", question="Q?", passages=tuple(passages), response=response)
    layout = render(ex, tiny_model)
    cs = chunk_example(layout, method, chunk_size=30, chunk_overlap=8)
    _check_chunkset(cs, layout, tiny_model.tokenizer, ex.passages)


@PROPS
@given(passages=st.lists(any_text.filter(str.strip), min_size=1, max_size=2))
@example(passages=["\x16"])
def test_passage_char_maps_cover_segments(tiny_model, passages) -> None:
    # Arbitrary text (multibyte included): whole passage = whole segment; ranges nest.
    ex = RAGExample(id="m", question="Q?", passages=tuple(passages), response="Yes.")
    if not all(tiny_model.tokenizer.encode(p, add_special_tokens=False) for p in passages):
        # A passage the tokenizer drops entirely (e.g. "\x16") is refused with the fix.
        with pytest.raises(DataError, match="encodes to no token"):
            render(ex, tiny_model)
        return
    layout = render(ex, tiny_model)
    for k, text in enumerate(passages):
        seg = layout.passage_segment(k)
        assert layout.passage_chars_to_positions(k, 0, len(text)) == (seg.start, seg.end)
        for a, b in split_recursive(text, chunk_size=10, chunk_overlap=3):
            lo, hi = layout.passage_chars_to_positions(k, a, b)
            assert seg.start <= lo < hi <= seg.end
    with pytest.raises(IndexError):
        layout.passage_chars_to_positions(0, 0, len(passages[0]) + 1)


def test_chunk_validates() -> None:
    with pytest.raises(ValueError, match="passage index"):
        Chunk(source="passage", start=0, end=2, text="ab", tok_start=1, tok_end=2)
    with pytest.raises(ValueError, match="does not fit"):
        Chunk(source="response", start=0, end=3, text="ab", tok_start=1, tok_end=2)
    c = Chunk(source="passage", passage=1, start=4, end=6, text="ab", tok_start=7, tok_end=9)
    assert c.label == "passage 2" and c.positions.tolist() == [7, 8]
    assert c.generation_positions.tolist() == [6, 7]
