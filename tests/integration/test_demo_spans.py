"""The spans a set shows on the demo, on the embedded model (issue 51): a faithful answer is
never covered wholesale, every span is whole words with its evidence, type and reason,
and an answer the set calls hallucinated without a span says why.

The fast set judges all twelve demo answers (its members cost about one plain forward
each); the default set, whose twelve detectors cost eight, judges three (demo-08 among
them: the faithful answer the union of twelve detectors' spans once covered end to end)
and two built-in answers. Both sets' verdicts must equal the ones kept in
``tests/fixtures/golden_verdicts.json`` (``tools/golden_verdicts.py``; issue 53).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from core.base.paths import DEFAULT_SET
from core.data import builtin_examples
from core.engine.model import LoadedModel
from core.pipeline.judge import AnswerVerdict, judge
from core.pipeline.sets import load_set
from tools.golden_verdicts import GOLDEN, TOLERANCE, default_examples, record

pytestmark = pytest.mark.embedded

WHOLESALE = 0.5
"""A faithful answer with at least this share of its characters flagged is covered
wholesale."""


def _demo() -> list:
    return [e for e in builtin_examples() if e.id.startswith("demo-")]


def _share(v: AnswerVerdict, response: str) -> float:
    return sum(s.end - s.start for s in v.spans) / max(len(response), 1)


@pytest.fixture(scope="module")
def fast_verdicts(embedded_model: LoadedModel) -> dict[str, AnswerVerdict]:
    fast = load_set(embedded_model.info.key, "fast")
    return {e.id: judge(embedded_model, e, fast) for e in _demo()}


def test_no_faithful_demo_answer_is_covered_wholesale_and_every_span_says_where_from(
    fast_verdicts: dict[str, AnswerVerdict],
) -> None:
    demo = {e.id: e for e in _demo()}
    faithful = [i for i, e in demo.items() if e.label is False]
    assert len(faithful) >= 6
    shares = {i: _share(fast_verdicts[i], demo[i].response) for i in faithful}
    assert all(s < WHOLESALE for s in shares.values()), shares
    assert sum(shares.values()) / len(shares) <= 0.10, shares
    for i, v in fast_verdicts.items():
        d = v.span_decision
        assert d is not None and d.judge == "ensemble" and d.rule is not None
        response, passages = demo[i].response, demo[i].passages
        for s in v.spans:
            assert s.text == response[s.start : s.end] and s.text == s.text.strip()
            assert s.start == 0 or not (response[s.start - 1].isalnum() and s.text[0].isalnum())
            assert s.score >= s.threshold and s.type in ("unsupported", "contradicted")
            assert s.reason and len(s.reason) <= 200
            ev = s.evidence
            assert ev is None or passages[ev.passage][ev.start : ev.end] == ev.text
        if v.hallucinated and not v.spans:
            assert d.note, i  # it says why it cannot say where
        if not v.hallucinated and d.rule.gate:
            assert v.spans == () and "faithful" in d.note


@pytest.fixture(scope="module")
def default_verdicts(embedded_model: LoadedModel) -> dict[str, AnswerVerdict]:
    dset = load_set(embedded_model.info.key, DEFAULT_SET)
    return {e.id: judge(embedded_model, e, dset) for e in default_examples()}


def _differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where two verdict records differ: numbers by more than TOLERANCE, anything else
    at all."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{where}: keys {sorted(set(got) ^ set(want))}"] if set(got) != set(want) else []
        for k in sorted(set(got) & set(want)):
            out += _differences(got[k], want[k], f"{where}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items, {len(want)} kept"]
        return [
            d
            for i, (g, w) in enumerate(zip(got, want, strict=True))
            for d in _differences(g, w, f"{where}[{i}]")
        ]
    floats = (int, float)
    if isinstance(want, float) and isinstance(got, floats) and not isinstance(got, bool):
        same = math.isclose(got, want, abs_tol=TOLERANCE) or (math.isnan(got) and math.isnan(want))
        return [] if same else [f"{where}: {got!r}, kept {want!r}"]
    return [] if got == want else [f"{where}: {got!r}, kept {want!r}"]


def test_verdicts_equal_the_kept_ones(
    fast_verdicts: dict[str, AnswerVerdict], default_verdicts: dict[str, AnswerVerdict]
) -> None:
    """Issue 53: a speed change leaves every verdict as it was. Both shipped sets judge
    the answers of ``tools/golden_verdicts.py`` as they did when it wrote them: each flag,
    span, type and evidence the same, each probability within its tolerance."""
    kept = json.loads(GOLDEN.read_text(encoding="utf-8"))
    for name, got in (("fast", fast_verdicts), ("default", default_verdicts)):
        assert set(got) == set(kept[name]), name
        for i, v in got.items():
            # through JSON, as kept (tuples become lists)
            now = json.loads(json.dumps(record(v.to_record())))
            diffs = _differences(now, kept[name][i], f"{name}:{i}")
            assert not diffs, diffs[:10]


def test_the_default_set_no_longer_covers_demo_08_end_to_end(
    default_verdicts: dict[str, AnswerVerdict],
) -> None:
    ex = next(e for e in _demo() if e.id.startswith("demo-08"))
    assert ex.label is False
    v = default_verdicts[ex.id]
    assert _share(v, ex.response) < WHOLESALE
    record = v.to_record()
    assert record["span_judge"] == "ensemble" and record["span_rule"]
    assert record["spans"] == [] or all(s["type"] for s in record["spans"])
