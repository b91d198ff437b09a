"""A set's CV quality as it judges answers with its experts (core.evaluation.deferred), on the
shipped default set and its ragtruth expert: each dataset's numbers are those of the
run of the set that judges it, answer by answer (issue 37)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from core.base.errors import DataError
from core.base.paths import assets_dir, shipped_runs_dir
from core.evaluation.cv_run import CVRun
from core.evaluation.deferred import deferred_quality, set_quality
from core.pipeline.sets import load_set

KEY = json.loads((assets_dir() / "detectors" / "nll" / "cfg.json").read_text())["model"]


@pytest.fixture
def shipped(monkeypatch: pytest.MonkeyPatch):
    for var in ("RAGSCOPE_DETECTORS_DIR", "RAGSCOPE_DETECTOR_SET", "RAGSCOPE_SHIPPED_RUNS_DIR"):
        monkeypatch.delenv(var, raising=False)
    return load_set(KEY)


def test_the_default_set_reads_ragtruth_as_its_expert_does_and_the_rest_as_before(
    shipped,
) -> None:
    q = set_quality(shipped, n_boot=200)
    assert q is not None and q.detector == "ensemble"
    own = shipped.card("ensemble").metrics["cv"]["by_dataset"]
    expert = shipped.experts["ragtruth_qa_dev"].card("ensemble").metrics["cv"]["by_dataset"]
    parts = {p.dataset: p for p in q.parts}
    assert set(parts) == set(own)
    rt = parts["ragtruth_qa_dev"]
    assert rt.judged_by == "ragtruth" and (rt.n, rt.n_positive) == (420, 77)
    assert rt.auroc == pytest.approx(expert["ragtruth_qa_dev"]["auroc"])
    assert rt.balanced_accuracy == pytest.approx(expert["ragtruth_qa_dev"]["balanced_accuracy"])
    assert rt.alone_auroc == pytest.approx(own["ragtruth_qa_dev"]["auroc"])
    # Issue 37: at least the ragtruth set's AUROC on RAGTruth, nothing else lost.
    assert rt.auroc >= rt.alone_auroc
    for ds, p in parts.items():
        if ds != "ragtruth_qa_dev":
            assert p.judged_by == "default"
            assert p.auroc == pytest.approx(own[ds]["auroc"]) == p.alone_auroc
    assert q.alone["auroc"] == pytest.approx(shipped.card("ensemble").auroc)
    assert q.pooled["n"] == sum(p.n for p in q.parts)
    lo, hi = q.pooled["auroc_ci"]
    assert lo < q.pooled["auroc"] < hi
    assert [r["dataset"] for r in q.to_rows()][-1] == "all"


def test_an_expert_run_of_other_answers_is_refused(shipped) -> None:
    own = CVRun.load(shipped_runs_dir() / f"{shipped.card('ensemble').cv_run}.json")
    run = CVRun.load(
        shipped_runs_dir() / f"{shipped.experts['ragtruth_qa_dev'].card('ensemble').cv_run}.json"
    )
    other = dataclasses.replace(run, ids=("someone-else", *run.ids[1:]))
    with pytest.raises(DataError, match="did not read answer 'ragtruth_qa_dev-00001"):
        deferred_quality(
            own, {"ragtruth_qa_dev": ("ragtruth", other)}, "ensemble", set_name="default", n_boot=0
        )


def test_a_set_without_experts_is_described_by_its_own_run(shipped) -> None:
    q = set_quality(dataclasses.replace(shipped, experts={}), n_boot=0)
    own = shipped.card("ensemble").metrics["cv"]["by_dataset"]
    assert not q.deferred and set(q.runs) == {"default"}
    for p in q.parts:
        assert p.judged_by == "default"
        assert p.auroc == pytest.approx(own[p.dataset]["auroc"]) == p.alone_auroc
    assert q.pooled["auroc"] == pytest.approx(shipped.card("ensemble").auroc)
    assert q.measured_on.startswith("5-fold source-grouped cross-validation")
    assert f"{q.pooled['n']:,} answers" in q.measured_on


def test_the_benchmark_shows_the_set_with_its_experts(shipped) -> None:
    """The Benchmark's section (app.components.set_quality) renders the core's rows."""
    from streamlit.testing.v1 import AppTest

    def page() -> None:
        import json

        from app.components.set_quality import show_set_quality
        from core.base.paths import assets_dir
        from core.pipeline.sets import load_set

        cfg = (assets_dir() / "detectors" / "nll" / "cfg.json").read_text()
        show_set_quality(load_set(json.loads(cfg)["model"]))

    at = AppTest.from_function(page, default_timeout=120).run()
    assert not at.exception
    assert [s.value for s in at.subheader] == ["The default set, as it judges answers"]
    frame, members = [d.value for d in at.dataframe]
    want = set_quality(shipped)
    assert list(members["detector"]) == list(shipped.names)
    assert members["recorded AUROC"].tolist() == pytest.approx(
        [c.auroc for c in shipped.detectors], nan_ok=True
    )
    assert any(c.value.startswith("Measured on: 5-fold") for c in at.caption)
    assert list(frame["dataset"]) == [r["dataset"] for r in want.to_rows()]
    assert list(frame["judged by"]) == [
        "default",
        "ragtruth",
        "default",
        "default",
        "default + ragtruth",
    ]
    assert frame["AUROC [95% CI]"].tolist() == [
        f"{r['AUROC']:.3f} [{r['AUROC low']:.3f}, {r['AUROC high']:.3f}]" for r in want.to_rows()
    ]
    assert any(
        "defers the answers of ragtruth\\_qa\\_dev to the **ragtruth** set" in c.value
        for c in at.caption
    )
