"""Adapting a set to a dataset from its reviews, on the tiny model: the derived set
calibrates each detector from the answers reviewed in the random order, leaves the base
set untouched, judges the dataset's answers from then on (judge(), the CLI), refuses
too few reviews with how many more, runs as a background job, and is refused when
tampered with."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from core.base.errors import DataError
from core.base.paths import adapted_sets_dir
from core.cli import main
from core.data import load_builtin
from core.engine.model import LoadedModel
from core.evaluation.adapt import (
    MIN_ADAPT_ANSWERS,
    Reviewed,
    fit_adaptation,
    fit_review_calibration,
    missing_reviews,
)
from core.learning.contract import Verdict
from core.pipeline.judge import judge
from core.pipeline.sets import ADAPTED_FILE, adapted_set_name, load_set
from core.review import AnswerBook
from core.services.adapting import adapt_set
from core.services.jobs import AdaptSpec, job_view, start_adapt_job
from core.storage import Store

DATASET = "mine"
QUEUE = "stored:mine"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def env(
    calibrated_tiny_set: tuple[Path, Path], adapt_env: Callable[..., tuple[Store, list]]
) -> tuple[Store, list]:
    """The calibrated set as the app's detectors and the dataset ``mine`` (40 answers)."""
    return adapt_env(calibrated_tiny_set, 40)


def _review(store: Store, examples: list, n: int, drawn_by: str = "random") -> None:
    book = AnswerBook(store)
    for ex in examples[:n]:
        book.mark(QUEUE, ex, "ann", "hallucinated" if ex.label else "faithful", drawn_by=drawn_by)


def test_too_few_reviews_say_how_many_more_and_write_nothing(
    tiny_model: LoadedModel, env: tuple[Store, list]
) -> None:
    store, examples = env
    _review(store, examples, 30, drawn_by="uncertainty")  # never calibrates
    _review(store, examples, 6)  # six random ones
    with pytest.raises(DataError, match="more") as e:
        adapt_set(
            store,
            tiny_model,
            load_set(tiny_model.info.key),
            QUEUE,
            examples,
            adapted_sets_dir(tiny_model.info.key),
        )
    assert "random order" in str(e.value)
    assert not adapted_sets_dir(tiny_model.info.key).exists()


def test_the_derived_set_judges_the_dataset_and_the_base_stays_untouched(
    tiny_model: LoadedModel,
    env: tuple[Store, list],
    calibrated_tiny_set: tuple[Path, Path],
    tree_digest: Callable[[Path], str],
) -> None:
    store, examples = env
    before = tree_digest(calibrated_tiny_set[0])
    _review(store, examples, 30)
    key = tiny_model.info.key
    base = load_set(key)
    assert all(c.detector.calibration_ is not None for c in base.detectors)
    result = adapt_set(store, tiny_model, base, QUEUE, examples, adapted_sets_dir(key))
    assert tree_digest(calibrated_tiny_set[0]) == before  # the base set is untouched
    assert result.folder.name == adapted_set_name("custom", DATASET)
    assert (result.folder / ADAPTED_FILE).is_file()
    got = {a.name: a for a in result.detectors}
    assert set(got) == {"nll", "context_gain"}
    # A detector fits the dataset's calibration, or (its scores ranking the reviewed
    # answers no better than chance on this random tiny model) keeps its base one.
    fitted = {n: a.calibration for n, a in got.items() if a.calibration is not None}
    assert fitted and all(
        a.reason and a.reason.startswith("no signal") for n, a in got.items() if n not in fitted
    )
    for name, cal in fitted.items():
        cfg = json.loads((result.folder / name / "cfg.json").read_text())
        assert cfg["calibration_by_dataset"][DATASET]["threshold"] == cal.threshold
        assert cfg["adapted"]["reviews_hash"] == result.record.reviews_hash
        assert cfg["adapted"]["n_random"] == 30
        # the threshold is the reviewed answers' share of hallucinated ones
        share = sum(e.label for e in examples[:30]) / 30
        assert cal.threshold == pytest.approx(share)

    routed = load_set(key)  # a fresh read of the folders: the derived set is an expert
    assert routed.for_dataset(DATASET).name == result.folder.name
    judged = judge(tiny_model, examples[35], routed)
    assert judged.set_name == result.folder.name and judged.deferred_from == "custom"
    for name, v in judged.verdicts.items():  # each detector at the dataset's own calibration
        if name not in fitted:  # no signal: the base calibration judges it
            assert v.calibrated_for != DATASET
            continue
        assert v.calibrated_for == DATASET
        assert v.threshold == pytest.approx(fitted[name].threshold)
        assert v.hallucinated == (v.score >= fitted[name].threshold)
    # another dataset's answers still go to the base set
    other = load_builtin()[0]
    assert judge(tiny_model, other, routed).set_name == "custom"

    # ragscope judge reads the same routing
    assert (
        main(["judge", QUEUE, "--model", "tiny", "--out", str(result.folder.parent / "v.jsonl")])
        == 0
    )


def test_a_tampered_derived_set_is_not_used_and_says_why(
    tiny_model: LoadedModel, env: tuple[Store, list]
) -> None:
    store, examples = env
    _review(store, examples, 30)
    key = tiny_model.info.key
    result = adapt_set(store, tiny_model, load_set(key), QUEUE, examples, adapted_sets_dir(key))
    weights = result.folder / "nll" / "weights.json"
    weights.write_text(weights.read_text().replace("0", "1", 1))
    routed = load_set(key)
    assert DATASET not in routed.experts
    assert any("cannot be used" in p for p in routed.expert_problems)
    (result.folder / ADAPTED_FILE).write_text('{"base_set": "../../etc", "dataset": 1}')
    routed = load_set(key)
    assert DATASET not in routed.experts
    assert any(ADAPTED_FILE in p or "base_set" in p for p in routed.expert_problems)


def test_the_adaptation_runs_as_a_background_job(
    tiny_model: LoadedModel, env: tuple[Store, list]
) -> None:
    import time

    store, examples = env
    _review(store, examples, 30)
    key = tiny_model.info.key
    spec = AdaptSpec(model="tiny", device="cpu", dataset=QUEUE, queue=QUEUE)
    job = start_adapt_job(store, spec, model_key=key)
    deadline = time.monotonic() + 180
    while (view := job_view(store.get_job(job))).active and time.monotonic() < deadline:
        time.sleep(0.2)
    assert view.state == "done", view.row.error
    folder = adapted_sets_dir(key) / adapted_set_name("custom", DATASET)
    assert (folder / ADAPTED_FILE).is_file()
    result = view.row.result
    assert {*result["calibrated"], *result["not_calibrated"]} == {"nll", "context_gain"}
    assert "nll" in result["calibrated"]
    assert all(r.startswith("no signal") for r in result["not_calibrated"].values())
    assert [p.name for p in adapted_sets_dir(key).iterdir()] == [folder.name]  # no staging
    assert view.command() == spec.command(view.row.out)
    with pytest.raises(DataError, match="by name"):
        AdaptSpec(model="tiny", dataset="/etc/passwd", queue=QUEUE)
    with pytest.raises(DataError):
        AdaptSpec.from_dict({"model": "tiny", "dataset": QUEUE, "queue": QUEUE, "x": 1})


def _verdicts(raw: np.ndarray, with_raw: bool = True) -> list[Verdict]:
    return [
        Verdict(
            detector="d",
            example_id=f"e{i}",
            score=float(r),
            raw_score=float(r) if with_raw else None,
        )
        for i, r in enumerate(raw)
    ]


def test_fit_adaptation_uses_only_the_random_reviews_and_names_what_it_cannot_fit() -> None:
    from core.base.examples import RAGExample

    rng = np.random.default_rng(0)
    n = 60
    y = rng.random(n) < 0.3
    raw = np.clip(np.where(y, 0.7, 0.4) + rng.normal(0, 0.15, n), 0.01, 0.99)
    reviewed = [
        Reviewed(
            example=RAGExample(id=f"e{i}", question="q", passages=("p",), response="r"),
            label=bool(y[i]),
            random=i < 40,
        )
        for i in range(n)
    ]
    got = fit_adaptation(
        {"calibrated": _verdicts(raw), "plain": _verdicts(raw, with_raw=False)},
        reviewed,
        "ds",
    )
    cal = got[0].calibration
    assert cal is not None and cal.n == 40 and cal.n_positive == int(y[:40].sum())
    direct = fit_review_calibration(raw[:40], y[:40].astype(int))
    assert cal.threshold == direct.threshold == pytest.approx(y[:40].mean())
    assert got[1].calibration is None and "not calibrated" in (got[1].reason or "")
    with pytest.raises(DataError, match="one per reviewed answer"):
        fit_adaptation({"d": _verdicts(raw[:5])}, reviewed, "ds")
    assert missing_reviews([True] * 5 + [False] * (MIN_ADAPT_ANSWERS - 5)) is None
    assert "3 more hallucinated" in (missing_reviews([True, True] + [False] * 30) or "")


def test_fit_adaptation_keeps_the_base_calibration_where_the_reviews_carry_no_signal() -> None:
    """Issue 67: reviews that a detector's scores rank the wrong way round (or that it
    scores all alike) gave a flat calibration at the base rate, equal to its threshold,
    so it flagged every answer. It now gets no calibration of the dataset's own and says
    why; the detector with a signal is calibrated as before."""
    from core.base.examples import RAGExample

    rng = np.random.default_rng(1)
    n = 24
    y = np.arange(n) % 2 == 0  # 12 of each
    good = np.clip(np.where(y, 0.7, 0.3) + rng.normal(0, 0.1, n), 0.01, 0.99)
    reviewed = [
        Reviewed(
            example=RAGExample(id=f"e{i}", question="q", passages=("p",), response="r"),
            label=bool(y[i]),
            random=True,
        )
        for i in range(n)
    ]
    got = {
        a.name: a
        for a in fit_adaptation(
            {
                "good": _verdicts(good),
                "reversed": _verdicts(1.0 - good),
                "constant": _verdicts(np.full(n, 0.4)),
            },
            reviewed,
            "ds",
        )
    }
    assert got["good"].calibration is not None and not got["good"].calibration.calibrator.flat
    for name in ("reversed", "constant"):
        assert got[name].calibration is None, name
        assert got[name].reason is not None and got[name].reason.startswith("no signal"), name
        assert "keeps its base calibration" in got[name].reason
    assert "AUROC 0.00" in (got["reversed"].reason or "")
    assert "all equal" in (got["constant"].reason or "")


def test_an_adaptation_without_signal_for_a_detector_flags_no_faithful_answer_by_it(
    tiny_model: LoadedModel, env: tuple[Store, list]
) -> None:
    """Reviews built so that nll's scores rank them the wrong way round (every answer
    nll scores highest is marked faithful): the adapted set keeps nll's base
    calibration, no verdict of the adapted set comes from a flat calibration, and no
    faithful-marked answer is flagged by nll at a constant score."""
    store, examples = env
    key = tiny_model.info.key
    base = load_set(key)
    raw = {
        v.example_id: v.verdicts["nll"].raw_score
        for v in (judge(tiny_model, e, base) for e in examples[:20])
    }
    cut = float(np.median(list(raw.values())))
    book = AnswerBook(store)
    marked = {}
    for ex in examples[:20]:
        marked[ex.id] = raw[ex.id] < cut  # high nll score -> marked faithful
        label = "hallucinated" if marked[ex.id] else "faithful"
        book.mark(QUEUE, ex, "ann", label, drawn_by="random")
    result = adapt_set(store, tiny_model, base, QUEUE, examples, adapted_sets_dir(key))
    nll = next(a for a in result.detectors if a.name == "nll")
    assert nll.calibration is None and (nll.reason or "").startswith("no signal")
    cfg = json.loads((result.folder / "nll" / "cfg.json").read_text())
    assert DATASET not in (cfg.get("calibration_by_dataset") or {})
    routed = load_set(key)
    for ex in examples[:20]:
        av = judge(tiny_model, ex, routed)
        assert av.set_name == result.folder.name
        for v in av.verdicts.values():
            # a calibration with no signal (on this random model, a pooled one may be
            # flat too) makes no call; a flag never comes from a score at a constant
            assert v.no_signal is None or v.hallucinated is None
            assert not (v.hallucinated and v.score == v.threshold), (ex.id, v.detector)
        assert av.verdicts["nll"].calibrated_for != DATASET
