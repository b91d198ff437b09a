"""The Python API as docs/judge.md shows it (the README's example), run as written on
the embedded model with the shipped default set: load the set, judge one answer, judge
an iterable of answers, read the verdict object."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import core.engine.model
from core.base.examples import Provenance
from core.base.paths import assets_dir
from core.data import builtin_examples
from core.engine.model import LoadedModel
from core.pipeline.judge import AnswerVerdict, judge, judge_many
from core.pipeline.sets import EXPERTS_FILE, load_set

DOC = Path(__file__).resolve().parents[2] / "docs" / "judge.md"


def _snippet() -> str:
    """The Python example of docs/judge.md (its one ``python`` block)."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1, "docs/judge.md should hold exactly one Python example"
    return blocks[0]


def test_the_documented_python_example_judges_answers_on_the_embedded_model(
    embedded_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("RAGSCOPE_DETECTORS_DIR", "RAGSCOPE_DETECTOR_SET"):
        monkeypatch.delenv(var, raising=False)  # the shipped default set
    # the example's load_model("embedded") gets the session's copy (loaded once)
    monkeypatch.setattr(core.engine.model, "load_model", lambda *a, **k: embedded_model)
    scope: dict[str, object] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_snippet(), str(DOC), "exec"), scope)  # noqa: S102  # our own docs
    dset = scope["dset"]
    verdict = scope["verdict"]
    answer = scope["answer"]
    assert dset.name == "default" and "ensemble" in dset.names and len(dset.names) >= 10
    assert isinstance(verdict, AnswerVerdict) and verdict.judge == "ensemble"
    assert verdict.hallucinated == (verdict.probability >= verdict.threshold)
    assert 0.0 <= verdict.probability <= 1.0
    assert list(verdict.verdicts) == list(dset.names)
    assert verdict.summary.startswith(("Hallucinated: ensemble p = ", "Faithful: ensemble p = "))
    assert f"of {len(dset.names)} detectors flag it" in verdict.summary
    assert verdict.span_decision is not None and verdict.span_decision.judge == "ensemble"
    assert bool(verdict.spans) or verdict.span_decision.note
    for span in verdict.spans:
        assert span.text == answer.response[span.start : span.end]
        assert any(c.isalnum() for c in span.text) and span.score >= span.threshold
        assert span.type in ("unsupported", "contradicted") and span.reason
        assert span.evidence is None or span.evidence.text in answer.passages[span.evidence.passage]
    lines = printed.getvalue().splitlines()
    assert lines[0] == verdict.summary
    # judge_many over the two answers: in order, the first the same as judge()'s
    many = scope["verdicts"]
    assert [v.example_id for v in many] == ["q1", "q2"]
    assert all(isinstance(v, AnswerVerdict) for v in many)
    first = many[0]
    for name, v in verdict.verdicts.items():
        assert first.verdicts[name].score == pytest.approx(v.score, abs=1e-4)
        assert first.verdicts[name].threshold == v.threshold
    assert lines[-2:] == [f"q1 {many[0].summary}", f"q2 {many[1].summary}"]
    # the example's own judge() is the one imported here
    assert scope["judge"] is judge


def test_the_fast_set_judges_with_a_stacker_of_its_cheap_members(
    embedded_model: LoadedModel,
) -> None:
    """``judge --set fast``'s set: the ensemble over saplma, lookback_lens and lexical (no
    vocabulary-wide lens products), loaded whole, judging the demo answers on the
    embedded model with its own verdict line, its cross-validation on record."""
    fast = load_set(embedded_model.info.key, "fast")
    assert fast.name == "fast" and not fast.broken and fast.error is None
    assert sorted(fast.names) == ["ensemble", "lexical", "lookback_lens", "saplma"]
    ensemble = fast.card("ensemble")
    assert list(ensemble.detector.config.members) == ["saplma", "lookback_lens", "lexical"]
    cv = ensemble.metrics["cv"]
    assert set(cv["by_dataset"]) == {
        "builtin",
        "ragtruth_qa_dev",
        "dolly_ac_dev",
        "finqa_qwen3_interpdetect",
    }
    assert 0.5 < cv["pooled"]["auroc"] <= 1.0
    demo = [e for e in builtin_examples() if e.id.startswith("demo-")][:2]
    for example in demo:
        verdict = judge(embedded_model, example, fast)
        assert verdict.judge == "ensemble" and list(verdict.verdicts) == list(fast.names)
        assert verdict.hallucinated == (verdict.probability >= verdict.threshold)
        assert f"of {len(fast.names)} detectors flag it" in verdict.summary
        for span in verdict.spans:
            assert span.text == example.response[span.start : span.end]


def test_an_answer_of_an_experts_dataset_is_judged_by_the_expert_on_the_same_features(
    embedded_model: LoadedModel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A set naming the ``ragtruth`` set as its expert: a RAGTruth QA answer (any split)
    gets the expert's verdicts, through judge() and judge_many() alike, and says so;
    any other answer gets the set's own."""
    folder = Path(shutil.copytree(assets_dir() / "detectors", tmp_path / "custom"))
    (folder / EXPERTS_FILE).write_text('{"experts": ["ragtruth"]}', encoding="utf-8")
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(folder))
    key = embedded_model.info.key
    dset = load_set(key).subset(["nll", "lexical"])
    expert = load_set(key, "ragtruth").subset(["nll", "lexical"])
    mine = load_set(key, "default").subset(["nll", "lexical"])
    demo = next(e for e in builtin_examples() if e.id.startswith("demo-"))
    rt = replace(demo, id="rt", provenance=Provenance(dataset="ragtruth_qa_test"))
    other = replace(demo, id="other", provenance=Provenance(dataset="builtin"))
    got = {v.example_id: v for v in judge_many(embedded_model, [rt, other], dset)}
    one = judge(embedded_model, rt, dset)
    for v in (got["rt"], one):
        assert (v.set_name, v.deferred_from) == ("ragtruth", "custom")
        assert "the custom set's expert for this answer's dataset" in v.summary
        assert v.to_record()["deferred_from"] == "custom"
    own = judge(embedded_model, rt, expert)
    assert own.deferred_from is None
    for name in ("nll", "lexical"):
        assert one.verdicts[name].score == pytest.approx(own.verdicts[name].score, abs=1e-6)
        assert one.verdicts[name].threshold == own.verdicts[name].threshold
        assert got["rt"].verdicts[name].score == pytest.approx(own.verdicts[name].score, abs=1e-4)
    plain = judge(embedded_model, other, mine)
    assert (got["other"].set_name, got["other"].deferred_from) == ("custom", None)
    for name in ("nll", "lexical"):
        assert got["other"].verdicts[name].score == pytest.approx(
            plain.verdicts[name].score, abs=1e-4
        )
    # The two sets' detectors really differ: deferring changes the verdict.
    assert one.verdicts["lexical"].score != pytest.approx(plain.verdicts["lexical"].score)
