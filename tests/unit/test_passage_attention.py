"""Context attribution from attention (core.signals.passage_attention) and its ablation
check (core.evaluation.attribution_check), on hand-made attention and the tiny model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.data import builtin_examples
from core.engine.layout import render
from core.engine.model import LoadedModel
from core.engine.trace import trace
from core.evaluation.attribution_check import (
    AblationRow,
    ablation_rows,
    answer_logprobs,
    attribution_markdown,
    attribution_report,
    attribution_run,
    check_rows,
    check_span,
    read_progress,
    row_from_json,
)
from core.pipeline.word_spans import passage_sentences
from core.signals.passage_attention import (
    context_reading,
    head_groups,
    read_context,
    reading_needs,
)

EXAMPLE = "demo-02-waggle-dance"


@pytest.fixture(scope="module")
def example() -> RAGExample:
    return next(e for e in builtin_examples() if e.id == EXAMPLE)


def test_head_groups_split_layers_in_thirds_and_mark_copying_heads() -> None:
    g = head_groups(6, 2, [(5, 1)])
    assert list(g) == ["all", "early", "middle", "late", "copying"]
    assert g["early"][:2].all() and not g["early"][2:].any()
    assert g["late"][4:].all() and not g["late"][:4].any()
    assert g["copying"].sum() == 1 and g["copying"][5, 1]
    assert "early" not in head_groups(1, 2)  # one layer: no empty thirds
    with pytest.raises(ValueError, match="outside"):
        head_groups(2, 2, [(2, 0)])


def test_shares_follow_hand_made_attention(tiny_model: LoadedModel, example: RAGExample) -> None:
    layout = render(example, tiny_model)
    units = passage_sentences(layout.passage_texts)
    ctx = layout.context_positions()
    n_t = len(layout.generation_positions)
    att = np.zeros((2, 4, n_t, ctx.size), dtype=np.float32)
    a, b = layout.passage_chars_to_positions(*units[1])
    col = int(np.searchsorted(ctx, a))
    att[1, :, :, col] = 0.6  # every late head looks at one token of sentence 2
    att[0, :, :, 0] = 0.2  # early heads at the first passage token (sentence 1)
    r = context_reading(layout, att, ctx, units)
    late = r.unit_shares("late", slice(0, 3))
    assert late.argmax() == 1 and late[1] == pytest.approx(1.0)
    mixed = r.unit_shares("all", slice(0, n_t))
    assert mixed[1] == pytest.approx(0.75) and mixed[0] == pytest.approx(0.25)
    assert r.mass("all", slice(0, n_t)) == pytest.approx(0.4)
    assert r.token_shares("early", [0]).sum() == pytest.approx(1.0)
    assert not r.unit_shares("early", slice(0, 0)).any()
    prompt = np.arange(layout.response.start)  # a prompt-wide context keeps its passages
    wide = np.zeros((2, 4, n_t, prompt.size), dtype=np.float32)
    wide[..., ctx] = att
    wide[..., 0] = 0.5  # attention on BOS is not the passages'
    r2 = context_reading(layout, wide, prompt, units)
    np.testing.assert_array_equal(r2.context, ctx)
    np.testing.assert_allclose(r2.weights, r.weights)
    with pytest.raises(KeyError, match="no head group"):
        r.unit_shares("copying", slice(0, 1))
    with pytest.raises(ValueError, match="expected"):
        context_reading(layout, att[..., :-1], ctx, units)
    with pytest.raises(ValueError, match="outside the layout"):
        context_reading(layout, att, ctx, [(0, 0, 10**6)])


def test_read_context_equals_the_traced_attention(
    tiny_model: LoadedModel, example: RAGExample
) -> None:
    layout = render(example, tiny_model)
    tr = trace(tiny_model, layout, reading_needs(tiny_model.info.n_layers))
    r = read_context(tr, passage_sentences(layout.passage_texts))
    g, ctx = layout.generation_positions, layout.context_positions()
    want = np.mean([tr.at("pattern", ly, g)[:, :, ctx].numpy() for ly in (0, 1)], axis=(0, 1))
    np.testing.assert_allclose(r.weights[r.groups.index("all")], want, rtol=1e-5, atol=1e-7)


def test_removing_prompt_tokens_changes_only_what_follows(
    tiny_model: LoadedModel, example: RAGExample
) -> None:
    layout = render(example, tiny_model)
    base = answer_logprobs(tiny_model, layout)
    assert base.shape == (len(layout.generation_positions),) and (base < 0).all()
    a, b = layout.passage_chars_to_positions(0, 0, 20)
    cut = answer_logprobs(tiny_model, layout, (a, b))
    assert cut.shape == base.shape and not np.allclose(cut, base)
    with pytest.raises(ValueError, match="only prompt tokens"):
        answer_logprobs(tiny_model, layout, (layout.response.start, layout.response.start + 1))


def test_ablation_rows_resume_and_report(tiny_model: LoadedModel, tmp_path: Path) -> None:
    examples = builtin_examples()[:3]
    progress = tmp_path / "p.jsonl"
    first = [
        (ex.id, rows, new)
        for ex, rows, new, _ in check_rows(tiny_model, examples, progress=progress)
    ]
    assert all(new for _, _, new in first)
    rows = [r for _, rs, _ in first for r in rs]
    assert rows and all(r.n_tokens >= 3 and r.top_unit != r.random_unit for r in rows)
    again = list(check_rows(tiny_model, examples, progress=progress))
    assert not any(new for _, _, new, _ in again)
    assert [r for _, rs, _, _ in again for r in rs] == rows
    long = dataclasses.replace(examples[1], id="too-long", passages=("word " * 20_000,))
    ((_, got, new, error),) = check_rows(tiny_model, [long], progress=progress)
    assert got == [] and new and error and len(read_progress(progress)) == 3  # not recorded
    direct = ablation_rows(tiny_model, examples[0])
    assert direct == first[0][1]

    rep = attribution_report(rows, n_boot=50)
    att = rep["attention"]
    diff = np.mean([r.drop_top - r.drop_random for r in rows])
    assert att["n"] == len(rows) and att["mean_difference"] == pytest.approx(diff)
    assert att["win_rate"] == pytest.approx(np.mean([r.drop_top > r.drop_random for r in rows]))
    assert rep["text"]["n"] == sum(r.text_unit is not None for r in rows) > 0
    assert rep["both"]["n"] == sum(r.both_unit is not None for r in rows) > 0
    # Every other head group (copying heads included) picks its own top sentence; its
    # report pairs each pick's drop with its own random sentence's.
    picks = [p for r in rows for p in r.by_group]
    info = tiny_model.info
    groups = set(head_groups(info.n_layers, info.n_heads, [(0, 0)])) - {"all"}
    assert {p.group for p in picks} == groups and "copying" in groups
    for r in rows:
        for p in r.by_group:
            assert p.top_unit != p.random_unit
            if p.top_unit == r.top_unit:  # the same top: the same random, the same passes
                assert (p.random_unit, p.drop_top, p.drop_random) == (
                    r.random_unit,
                    r.drop_top,
                    r.drop_random,
                )
    assert rep["by_group"]["all"] == att
    copy = [p for p in picks if p.group == "copying"]
    assert rep["by_group"]["copying"]["n"] == len(copy)
    assert rep["by_group"]["copying"]["win_rate"] == pytest.approx(
        np.mean([p.drop_top > p.drop_random for p in copy])
    )
    md = attribution_markdown(attribution_run(rep, "builtin", "tiny"))
    assert "alignment re-ranked by attention" in md
    assert "| copying heads | " in md and "| late layers' heads | " in md
    assert "an anecdote, not an estimate" in md  # a few spans say so


def test_check_span_matches_the_rows_drops(tiny_model: LoadedModel, example: RAGExample) -> None:
    layout = render(example, tiny_model)
    r = read_context(
        trace(tiny_model, layout, reading_needs(tiny_model.info.n_layers)),
        passage_sentences(layout.passage_texts),
    )
    res = check_span(tiny_model, r, (0, 4))
    assert res is not None
    base = answer_logprobs(tiny_model, layout)
    cut = answer_logprobs(tiny_model, layout, r.unit_positions(res.top_unit))
    assert res.drop_top == pytest.approx(float(base[:4].sum() - cut[:4].sum()))
    assert res.faithful == (res.drop_top > res.drop_random)
    with pytest.raises(ValueError, match="outside"):
        check_span(tiny_model, r, (0, 10**6))


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", "invalid JSON"),
        ('{"key": 3, "rows": []}', "not an object with a key"),
        ('{"key": "k", "rows": {}}', "rows is not a list"),
        ('{"key": "k", "rows": [{"example_id": "x"}]}', "missing field"),
        ('{"key": "k", "rows": [7]}', "missing field"),
    ],
)
def test_a_broken_progress_file_names_the_line_and_the_fix(
    tmp_path: Path, line: str, match: str
) -> None:
    p = tmp_path / "p.jsonl"
    good = AblationRow(
        example_id="a",
        source="s",
        start=0,
        end=5,
        n_tokens=3,
        top_unit=0,
        top_share=0.5,
        random_unit=1,
        text_unit=None,
        logprob=-3.0,
        drop_top=1.0,
        drop_random=0.5,
        drop_text=None,
        both_unit=None,
        drop_both=None,
    )
    p.write_text(json.dumps({"key": "g", "rows": [good.to_json()]}) + "\n" + line + "\n")
    with pytest.raises(DataError, match=match) as e:
        read_progress(p)
    assert ":2" in str(e.value) and (
        "delete the file" in str(e.value) or "invalid JSON" in str(e.value)
    )


PICK = {
    "group": "copying",
    "top_unit": 2,
    "top_share": 0.4,
    "random_unit": 0,
    "drop_top": 0.5,
    "drop_random": 0.25,
}


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"start": "0"}, "start is not an integer"),
        ({"start": True}, "start is not an integer"),
        ({"drop_top": float("nan")}, "drop_top is not a finite number"),
        ({"text_unit": 2}, "both given or both null"),
        ({"text_unit": "2", "drop_text": 1.0}, "text_unit is not an integer"),
        ({"both_unit": 1, "drop_both": True}, "drop_both is not a finite number"),
        ({"by_group": {}}, "by_group is not a list"),
        ({"by_group": [{"group": "nope"}]}, "naming one of"),
        ({"by_group": [{**PICK, "top_unit": 1.5}]}, "by_group top_unit is not an integer"),
        ({"by_group": [{**PICK, "drop_top": float("inf")}]}, "by_group drop_top is not a"),
        ({"by_group": [PICK] * 6}, "at most 5 picks"),
    ],
)
def test_row_from_json_is_strict(patch: dict, match: str) -> None:
    d = {
        "example_id": "a",
        "source": "s",
        "start": 0,
        "end": 5,
        "n_tokens": 3,
        "top_unit": 0,
        "top_share": 0.5,
        "random_unit": 1,
        "text_unit": None,
        "logprob": -3.0,
        "drop_top": 1.0,
        "drop_random": 0.5,
        "drop_text": None,
        "both_unit": None,
        "drop_both": None,
    }
    assert row_from_json(d).drop_top == 1.0
    assert row_from_json({**d, "by_group": [PICK]}).by_group[0].drop_random == 0.25
    with pytest.raises(ValueError, match=match):
        row_from_json({**d, **patch})
