"""Layout on the tiny model's tokenizer: segments, offsets, span mapping (property tests)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.base.errors import DataError
from core.base.examples import RAGExample, Span
from core.engine.layout import prompt_pieces, render, render_pair

PROPS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Arbitrary unicode plus the awkward cases on purpose: whitespace runs, emoji
# (with modifiers / ZWJ), CJK, combining marks, Cyrillic. SmolLM2's byte-level
# vocabulary lacks a few bytes (some control characters, lead bytes of code
# points above U+3FFFF): those are excluded here and tested on their own.
_AWKWARD = list(" \t\n\r\u00a0\u3000中文字日本語😀👍🏽👩‍💻e\u0301éАда-.,'\"?!0123")
_CHARS = st.one_of(
    st.characters(exclude_categories=("Cs", "Cc"), max_codepoint=0x3FFFF),
    st.sampled_from(_AWKWARD),
)
texts = st.text(alphabet=_CHARS, min_size=1, max_size=40).filter(lambda s: s.strip())
passage_lists = st.lists(texts, min_size=1, max_size=3)


@pytest.fixture(scope="module")
def tok(tiny_model):
    return tiny_model.tokenizer


def _decode(tok, ids) -> str:
    return tok.decode([int(i) for i in ids], clean_up_tokenization_spaces=False)


def _example(response: str, passages=("The Old Bridge was built in 1820.",), **kw) -> RAGExample:
    kw.setdefault("question", "When was the Old Bridge built?")
    return RAGExample(id=kw.pop("id", "ex"), passages=tuple(passages), response=response, **kw)


def _check_segments(layout, n_passages: int, *, question: bool = True) -> None:
    segs = layout.segments
    assert segs[0].start == 0
    assert segs[-1].end == len(layout)
    for a, b in zip(segs, segs[1:], strict=False):
        assert a.end == b.start, "segments are contiguous"
    assert all(len(s) > 0 for s in segs)
    kinds = [s.kind for s in segs]
    assert kinds[0] == "template"
    assert kinds[-1] == "response" and kinds.count("response") == 1
    assert "instruction" in kinds
    assert kinds.count("question") == (1 if question else 0)
    assert [s.index for s in layout.passage_segments] == list(range(n_passages))
    assert len(layout.segment_labels()) == len(layout) == len(layout.token_strings())


# --------------------------------------------------------------------------- segments


@PROPS
@given(question=texts, passages=passage_lists, response=texts)
def test_segments_cover_the_layout_and_decode_back(tok, question, passages, response):
    ex = _example(response, passages, question=question)
    layout = render(ex, tok)
    _check_segments(layout, len(passages))
    ids = layout.token_ids
    for seg in layout.passage_segments:
        assert _decode(tok, ids[seg.start : seg.end]) == passages[seg.index]
    (q,) = [s for s in layout.segments if s.kind == "question"]
    assert _decode(tok, ids[q.start : q.end]) == question
    assert _decode(tok, layout.response_ids) == response
    # Passages come before the question, in order, and the response is last.
    starts = [s.start for s in layout.passage_segments]
    assert starts == sorted(starts) and starts[-1] < q.start < layout.response.start


def test_toy_layout_positions(tok, toy_example):
    layout = render(toy_example, tok)
    r = layout.response
    assert np.array_equal(layout.response_positions, np.arange(r.start, r.end))
    assert np.array_equal(layout.generation_positions, layout.response_positions - 1)
    assert np.array_equal(layout.response_ids, layout.token_ids[r.start : r.end])
    ctx = layout.context_positions()
    assert len(ctx) == sum(len(s) for s in layout.passage_segments)
    assert all(layout.segment_at(int(p)).kind == "passage" for p in ctx)
    assert layout.segment_at(r.start).kind == "response"
    with pytest.raises(IndexError):
        layout.segment_at(len(layout))
    assert "".join(layout.response_token_strings()) == toy_example.response
    frame = layout.to_frame()
    assert list(frame["segment"])[-1] == "response"
    assert "passage 2" in set(frame["segment"])
    assert len(frame) == len(layout)


# --------------------------------------------------------------------------- response


@PROPS
@given(response=texts)
def test_response_round_trips_and_offsets_cover(tok, response):
    layout = render(_example(response), tok)
    assert layout.response_text == response
    assert _decode(tok, layout.response_ids) == response
    o = layout.response_offsets
    n = len(response)
    assert o.shape == (len(layout.response_ids), 2)
    assert np.all(o[:, 0] >= 0) and np.all(o[:, 1] <= n)
    assert np.all(o[:, 1] > o[:, 0]), "every token has a non-empty range"
    assert np.all(np.diff(o[:, 0]) >= 0) and np.all(np.diff(o[:, 1]) >= 0)
    covered = np.zeros(n, dtype=bool)
    for a, b in o:
        covered[a:b] = True
    assert covered.all(), "every character belongs to a token"


@PROPS
@given(data=st.data(), response=texts)
def test_chars_to_tokens_round_trip(tok, data, response):
    layout = render(_example(response), tok)
    n = len(response)
    s = data.draw(st.integers(0, n - 1), label="start")
    e = data.draw(st.integers(s + 1, n), label="end")
    a, b = layout.chars_to_tokens(s, e)
    assert 0 <= a < b <= len(layout.response_ids)
    cs, ce = layout.tokens_to_chars(a, b)
    assert cs <= s and e <= ce, "the token range covers the characters"
    o = layout.response_offsets
    # Tight: the first and last tokens do overlap the characters.
    for j in (a, b - 1):
        assert o[j, 0] < e and s < o[j, 1]
    c = data.draw(st.integers(0, n - 1), label="char")
    j = layout.char_to_token(c)
    assert o[j, 0] <= c < o[j, 1]


def test_span_mapping_bounds(tok, toy_example):
    layout = render(toy_example, tok)
    n = len(toy_example.response)
    for bad in [(0, 0), (-1, 2), (3, n + 1)]:
        with pytest.raises(IndexError):
            layout.chars_to_tokens(*bad)
    with pytest.raises(IndexError):
        layout.char_to_token(n)
    with pytest.raises(IndexError):
        layout.tokens_to_chars(0, len(layout.response_ids) + 1)


@PROPS
@given(data=st.data(), response=texts)
def test_token_labels_mark_exactly_the_overlapping_tokens(tok, data, response):
    n = len(response)
    spans = []
    for _ in range(data.draw(st.integers(1, 3), label="n_spans")):
        s = data.draw(st.integers(0, n - 1))
        spans.append(Span(start=s, end=data.draw(st.integers(s + 1, n))))
    layout = render(_example(response, spans=tuple(spans)), tok)
    want = np.zeros(len(layout.response_ids), dtype=np.int8)
    for sp in spans:
        a, b = layout.chars_to_tokens(sp.start, sp.end)
        want[a:b] = 1
    assert np.array_equal(layout.token_labels(), want)


def test_token_labels_on_toy(tok, toy_example):
    layout = render(toy_example, tok)
    lab = layout.token_labels()
    marked = np.flatnonzero(lab)
    assert marked.size and np.all(np.diff(marked) == 1)
    text = _decode(tok, layout.response_ids[marked])
    assert "red granite" in text and "Ada" not in text
    assert render(toy_example.with_response(toy_example.response), tok).token_labels() is None


# --------------------------------------------------------------------------- variants


@PROPS
@given(passages=passage_lists, response=texts)
def test_render_pair_drops_only_the_context(tok, passages, response):
    full, bare = render_pair(_example(response, passages), tok)
    assert full.with_context and not bare.with_context
    assert np.array_equal(full.response_ids, bare.response_ids)
    assert np.array_equal(full.response_offsets, bare.response_offsets)
    assert bare.passage_segments == () and bare.context_positions().size == 0
    assert len(bare) < len(full)
    _check_segments(bare, 0)
    q_full = [s for s in full.segments if s.kind == "question"][0]
    q_bare = [s for s in bare.segments if s.kind == "question"][0]
    assert np.array_equal(
        full.token_ids[q_full.start : q_full.end], bare.token_ids[q_bare.start : q_bare.end]
    )


@PROPS
@given(response=texts)
@example(response=" Ã")  # a token holding the space and half of a 2-byte character
@example(response="x 👩‍💻 中文 e\u0301")
def test_response_ids_path_matches_plain_path(tok, response):
    ex = _example(response)
    plain = render(ex, tok)
    ids = tok(response, add_special_tokens=False)["input_ids"]
    own = render(ex, tok, response_ids=ids)
    assert np.array_equal(own.token_ids, plain.token_ids)
    assert np.array_equal(own.response_offsets, plain.response_offsets)


@pytest.mark.parametrize("bad", ["a\x06b", "plane 4: \U00040000"])
def test_unencodable_response_is_a_data_error(tok, bad):
    assert _decode(tok, tok(bad, add_special_tokens=False)["input_ids"]) != bad
    with pytest.raises(DataError, match=r"'bad-1'.*does not round-trip.*U\+"):
        render(_example(bad, id="bad-1"), tok)


def test_response_ids_must_decode_to_the_response(tok):
    ex = _example("Ada Lovell built it.")
    other = tok("Someone else built it.", add_special_tokens=False)["input_ids"]
    with pytest.raises(DataError, match="response_ids do not decode"):
        render(ex, tok, response_ids=other)


# --------------------------------------------------------------------------- verbatim prompts


def test_verbatim_prompt_locates_question_and_passages(tok):
    p1 = "The Old Bridge was built by Ada Lovell in 1820."
    p2 = "It is made of grey limestone 🪨 and spans 40 m."
    q = "Who built the Old Bridge?"
    prompt = f"Briefly answer.\n\nQ: {q}\n\nContext:\n[1] {p1}\n[2] {p2}\n\nAnswer:"
    ex = RAGExample(
        id="verb-1", question=q, passages=(p1, p2), response="Ada Lovell.", prompt=prompt
    )
    full, bare = render_pair(ex, tok)
    _check_segments(full, 2)
    _check_segments(bare, 0)
    ids = full.token_ids
    (qs,) = [s for s in full.segments if s.kind == "question"]
    assert _decode(tok, ids[qs.start : qs.end]) == q
    for seg, text in zip(full.passage_segments, (p1, p2), strict=True):
        assert _decode(tok, ids[seg.start : seg.end]) == text
    # The question comes first here: segments follow the prompt's order.
    assert qs.start < full.passage_segments[0].start
    # The whole user message is the prompt verbatim (template excluded).
    user = [s for s in full.segments if s.kind not in ("template", "response")]
    assert _decode(tok, ids[user[0].start : user[-1].end]) == prompt


def test_verbatim_prompt_with_repeated_passages(tok):
    p = "Same snippet."
    prompt = f"Docs:\n{p}\n{p}\nQuestion: what?"
    pieces = prompt_pieces(task="qa", question="what?", passages=[p, p], prompt=prompt)
    passages = [x for x in pieces if x.kind == "passage"]
    assert [x.index for x in passages] == [0, 1]
    assert "".join(x.text for x in pieces) == prompt


def test_passage_absent_from_prompt_names_the_record(tok):
    with pytest.raises(DataError, match="verb-2") as exc:
        RAGExample(
            id="verb-2",
            question="Who?",
            passages=("not in the prompt",),
            response="Ada.",
            prompt="Who? Context: something else",
        )
    assert exc.value.field == "passages"
    with pytest.raises(DataError, match=r"data\.jsonl:7.*passage 0 does not occur verbatim"):
        prompt_pieces(
            task="qa",
            question="Who?",
            passages=["not in the prompt"],
            prompt="Who? Context: something else",
            source="data.jsonl:7",
        )


# --------------------------------------------------------------------------- limits and templates


def test_layout_longer_than_max_tokens(tok, toy_example):
    n = len(render(toy_example, tok))
    assert len(render(toy_example, tok, max_tokens=n)) == n
    with pytest.raises(DataError, match=f"{n} tokens, more than the model's {n - 1}"):
        render(toy_example, tok, max_tokens=n - 1)
    # Without max_tokens the model's context length is the limit.
    small_ctx = SimpleNamespace(tokenizer=tok, info=SimpleNamespace(n_ctx=n - 1))
    with pytest.raises(DataError, match="toy-1"):
        render(toy_example, small_ctx)


def test_tokenizer_without_chat_template(tok, toy_example):
    plain = copy.deepcopy(tok)
    plain.chat_template = None
    assert tok.chat_template, "the shared tokenizer is untouched"
    layout = render(toy_example, plain)
    assert layout.token_ids[0] == tok.bos_token_id
    assert layout.segments[0].kind == "template" and len(layout.segments[0]) == 1
    _check_segments(layout, 2)
    assert _decode(tok, layout.response_ids) == toy_example.response
    head = layout.segments[-2]
    assert head.kind == "template"
    assert _decode(tok, layout.token_ids[head.start : head.end]) == "\n\nAnswer: "
    # Only the BOS is special (SmolLM2's BOS is <|im_start|>): no chat roles.
    assert _decode(tok, layout.token_ids).count("<|im_start|>") == 1
    assert "<|im_end|>" not in _decode(tok, layout.token_ids)
    chat = render(toy_example, tok)
    assert len(chat) > len(layout)
    assert "<|im_start|>assistant" in _decode(tok, chat.token_ids[: chat.response.start])
