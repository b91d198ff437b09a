"""The Playground's detector verdicts (AppTest, tiny model) and the token-score alignment.

Real artifacts are made once per module: the baseline detectors fitted on the demo
examples with the tiny model (``core.evaluation.evaluate.evaluate`` saving artifacts), then
``RAGSCOPE_DETECTORS_DIR`` points the app at them (or at a broken or foreign copy).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app.components.heatmap import detector_scale
from app.components.playground_verdicts import training_caption
from app.state import estimates as app_estimates
from app.state.detectors import ArtifactCard
from app.state.playground import (
    ANSWER_PASTE,
    CALIBRATE_AUTO,
    CALIBRATE_POOLED,
    COLOR_SURPRISAL,
    KEY_ANALYSE,
    KEY_ANSWER_SOURCE,
    KEY_CALIBRATE_AS,
    KEY_COLOR_BY,
    KEY_EXAMPLE,
    KEY_FIXED_SCALE,
    KEY_PASTED,
)
from app.state.session import STATE_KEY
from app.state.verdicts import verdict_frame
from app.text import md
from core.base.errors import ModelError
from core.data import builtin_examples, make_splits
from core.detectors import load_shipped
from core.detectors.baselines import NLLDetector
from core.engine.model import LoadedModel
from core.evaluation.evaluate import EvalOptions, Splits, evaluate
from core.learning.artifact import artifact_info
from core.learning.calibration import DatasetCalibration, PlattCalibrator
from core.learning.contract import Verdict, align_token_scores, flag_threshold
from core.pipeline.extract import answer_tokens, run_example
from core.pipeline.judge import judge
from core.pipeline.sets import TrainedOn, load_set
from core.storage import Store

PLAYGROUND = "views/playground.py"
EXAMPLE = "demo-02-waggle-dance"  # a built-in example with one gold span
DETECTORS = ("nll", "context_gain", "lexical")
EMBEDDED_KEY = "SmolLM2-135M-Instruct|L30xH9/KV3|D576|V49152|float32"
TRAIN = "ragscope train --model tiny --dataset builtin --seed 0"


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def tiny_artifacts(tiny_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The baseline detectors fitted on the demo examples with the tiny model, saved.

    ``tiny_model`` (tests/conftest.py) has the app's seed, so the app's weights.
    """
    out = tmp_path_factory.mktemp("tiny-detectors")
    train_name, _, splits = make_splits("demo", limit=12)
    evaluate(
        tiny_model,
        DETECTORS,
        Splits.of(splits, train_name),
        EvalOptions(n_boot=0, save_artifacts=out),
    )
    assert sorted(p.name for p in out.iterdir()) == sorted(DETECTORS)
    return out


@pytest.fixture
def detectors_dir(monkeypatch: pytest.MonkeyPatch, app_env: Path) -> Callable[[Path], None]:
    """Point the app at an artifacts folder (after ``app_env`` pointed it at none)."""

    def use(folder: Path) -> None:
        monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(folder))

    return use


def _copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "detectors"
    shutil.copytree(src, dst)
    return dst


# --------------------------------------------------------------------------- helpers


def _no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _heatmap(at: AppTest) -> str:
    maps = [h.value for h in at.html if 'class="rs-heatmap"' in h.value]
    assert len(maps) == 1
    return maps[0]


def _hover_values(heatmap: str, value_name: str) -> list[str]:
    """The value each token's hover title shows, in token order."""
    return re.findall(re.escape(value_name) + r": ([-0-9.]+|n/a)", heatmap.split("</style>", 1)[1])


def _verdict_table(at: AppTest) -> pd.DataFrame:
    tables = [t.value for t in at.table if "verdict" in t.value.columns]
    assert len(tables) == 1, "expected exactly one verdict table"
    return tables[0]


def _colour_radios(at: AppTest) -> list:
    return [r for r in at.radio if r.key == KEY_COLOR_BY]


def _analysed(make_app: Callable[[], AppTest]) -> AppTest:
    at = make_app().run()
    at.switch_page(PLAYGROUND).run()
    at.selectbox(key=KEY_EXAMPLE).select(EXAMPLE).run()
    at.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_PASTE).run()
    at.button(key=KEY_ANALYSE).click().run()
    _no_exception(at)
    return at


def _direct_verdicts(model: LoadedModel, folder: Path) -> dict[str, object]:
    """The verdicts on the example from the artifacts, computed without the app."""
    example = next(e for e in builtin_examples() if e.id == EXAMPLE)
    dets = [load_shipped(n, model.info.key, folder) for n in DETECTORS]
    feats = run_example(model, example, dets)
    return {d.name: d.predict(feats[d.name]) for d in dets}


# --------------------------------------------------------------------------- tests


def test_verdict_table_matches_predict_and_cfg(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    tiny_artifacts: Path,
    tiny_model: LoadedModel,
) -> None:
    detectors_dir(tiny_artifacts)
    at = _analysed(make_app)
    assert not at.error, [e.value for e in at.error]
    assert "Detector verdicts" in [h.value for h in at.subheader]
    table = _verdict_table(at).set_index("detector")
    assert sorted(table.index) == sorted(DETECTORS)
    direct = _direct_verdicts(tiny_model, tiny_artifacts)
    for name, v in direct.items():
        row = table.loc[name]
        cfg = artifact_info(tiny_artifacts / name)
        assert row["score"] == pytest.approx(v.score, abs=1e-6)
        assert row["threshold"] == pytest.approx(cfg["threshold"])
        assert row["verdict"] == ("flagged" if v.hallucinated else "not flagged")
        assert cfg["trained_on"]["dataset"] == "demo"
        auroc = cfg["metrics"]["test"]["auroc"]
        assert (pd.isna(row["AUROC"]) and auroc is None) or row["AUROC"] == auroc
        assert auroc is None or row["AUROC from"] == "test split"
        assert not row["calibrated"]
    assert any("score from 0 to 1" in c.value for c in at.caption)
    # The set's training is named once, not per row; the overall verdict opens the table.
    recorded = artifact_info(tiny_artifacts / DETECTORS[0])["trained_on"]
    n_train = recorded["n"]["train"]
    label = " + ".join(recorded.get("datasets") or [recorded["dataset"]])
    checked = any(
        artifact_info(tiny_artifacts / n)["metrics"]["test"]["auroc"] is not None for n in DETECTORS
    )
    trained = [c.value for c in at.caption if c.value.startswith("Detector set")]
    assert trained == [
        f"Detector set **custom**: trained on {label} ({n_train:,} answers)"
        + (", AUROC from test split." if checked else ".")
    ]
    assert not any("trained on" in str(c).lower() for c in table.columns)


def test_colour_by_a_detector_shows_its_token_scores(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    tiny_artifacts: Path,
    tiny_model: LoadedModel,
) -> None:
    detectors_dir(tiny_artifacts)
    at = _analysed(make_app)
    radio = at.radio(key=KEY_COLOR_BY)
    assert radio.value == COLOR_SURPRISAL
    # Options show as labels; all three baselines score tokens.
    assert set(radio.options) == {"surprisal (bits)", *(f"{d} token score" for d in DETECTORS)}
    surprisal_map = _heatmap(at)
    surprisal = _hover_values(surprisal_map, "surprisal (bits)")
    assert len(surprisal) > 10

    radio.set_value("nll").run()
    _no_exception(at)
    heat = _heatmap(at)
    assert heat != surprisal_map
    assert "nll token score" in heat  # legend and hovers name the detector
    shown = _hover_values(heat, "nll token score")
    expected = _direct_verdicts(tiny_model, tiny_artifacts)["nll"].token_scores
    assert expected is not None
    assert shown == [f"{v:.2f}" for v in expected]
    assert shown != surprisal
    assert 'class="rs-tok rs-gold"' in heat  # the gold span stays underlined
    assert at.session_state[STATE_KEY].color_by == "nll"
    # The caption names the scale: this answer's own range when its scores are all low.
    det = load_shipped("nll", tiny_model.info.key, tiny_artifacts)
    want = detector_scale(np.asarray(expected), flag_threshold(det))
    assert any(want.note.split(";")[0] in c.value for c in at.caption)
    at.toggle(key=KEY_FIXED_SCALE).set_value(True).run()
    assert any("Scale: fixed, 0 to 1" in c.value for c in at.caption)
    at.toggle(key=KEY_FIXED_SCALE).set_value(False).run()

    # The choice survives a rerun; switching back restores surprisal.
    at.run()
    assert "nll token score" in _heatmap(at)
    at.radio(key=KEY_COLOR_BY).set_value(COLOR_SURPRISAL).run()
    assert _hover_values(_heatmap(at), "surprisal (bits)") == surprisal


def _verdict_line(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if "-background[" in m.value]


def test_the_verdict_line_opens_the_full_table(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    tiny_artifacts: Path,
    tiny_model: LoadedModel,
) -> None:
    detectors_dir(tiny_artifacts)
    at = _analysed(make_app)
    example = next(e for e in builtin_examples() if e.id == EXAMPLE)
    want = judge(tiny_model, example, load_set(tiny_model.info.key))
    colour = "red" if want.hallucinated else "green"
    # One line, the set's own summary (core.pipeline.judge), coloured by the overall verdict.
    assert _verdict_line(at) == [f"#### :{colour}-background[{md(want.summary)}]"]
    assert f"{want.n_flagged} of {len(DETECTORS)} detectors flag it" in want.summary
    # It comes before the table, which is static: every detector's row and every column
    # in view (no inner scroll), no per-row training text.
    blocks = [type(e).__name__ for e in at.main if type(e).__name__ in ("Markdown", "Table")]
    assert "Table" in blocks and blocks.index("Markdown") < blocks.index("Table")
    assert not [d for d in at.dataframe if "verdict" in d.value.columns]
    table = _verdict_table(at)
    assert list(table["detector"]) == list(want.verdicts)
    assert list(table.columns) == [
        "detector", "score", "threshold", "verdict", "calibrated", "calibrated for", "AUROC",
        "AUROC from",
    ]  # fmt: skip
    for _, row in table.iterrows():
        v = want.verdicts[row["detector"]]
        assert (row["score"], row["threshold"]) == (pytest.approx(v.score), v.threshold)
        assert row["verdict"] == ("flagged" if v.hallucinated else "not flagged")
    # The verdict column is coloured: red where flagged, green where not.
    styles = next(
        t for t in at.table if "verdict" in t.value.columns
    ).proto.arrow_data.styler.styles
    assert ("#b3261e" in styles) == any(v.hallucinated for v in want.verdicts.values())
    assert ("#1e7d32" in styles) == any(not v.hallucinated for v in want.verdicts.values())


def _platt(a: float, b: float, n: int = 60) -> PlattCalibrator:
    return PlattCalibrator.from_json({"kind": "platt", "a": a, "b": b, "n": n})


@pytest.fixture(scope="module")
def calibrated_artifacts(
    tiny_artifacts: Path, tiny_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny artifacts as a detector trained on two datasets keeps them: a pooled
    calibration and one of each dataset's own (with very different thresholds)."""
    out = tmp_path_factory.mktemp("calibrated")
    for n in DETECTORS:
        det = load_shipped(n, tiny_model.info.key, tiny_artifacts)
        det.calibration_ = _platt(1.0, 0.0)
        det.dataset_calibration_ = {
            "builtin": DatasetCalibration(
                calibrator=_platt(3.0, -1.0), threshold=0.95, n=46, n_positive=20
            ),
            "ragtruth_qa_dev": DatasetCalibration(
                calibrator=_platt(0.5, -2.0), threshold=0.01, n=80, n_positive=15
            ),
        }
        det.save(out / n)
    return out


def test_the_answer_can_be_judged_as_one_of_a_training_dataset(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    calibrated_artifacts: Path,
    tiny_model: LoadedModel,
) -> None:
    detectors_dir(calibrated_artifacts)
    at = _analysed(make_app)
    pick = at.selectbox(key=KEY_CALIBRATE_AS)
    assert pick.value == CALIBRATE_AUTO
    assert pick.options[1:] == ["all training data", "builtin", "ragtruth_qa_dev"]
    direct = _direct_verdicts(tiny_model, calibrated_artifacts)
    dets = {n: load_shipped(n, tiny_model.info.key, calibrated_artifacts) for n in DETECTORS}

    def table() -> pd.DataFrame:
        return _verdict_table(at).set_index("detector")

    auto = table()
    for choice, want_for in (("ragtruth_qa_dev", "ragtruth_qa_dev"), (CALIBRATE_POOLED, None)):
        at.selectbox(key=KEY_CALIBRATE_AS).set_value(choice).run()
        _no_exception(at)
        shown = table()
        for n, v in direct.items():
            raw = v.raw_score
            assert raw is not None
            if want_for is None:
                p, t = float(dets[n].calibration_.transform(raw)), dets[n].threshold_
                assert shown.loc[n, "calibrated for"] == "all its training data"
            else:
                cal = dets[n].dataset_calibration_[want_for]
                p, t = cal.apply(raw), cal.threshold
                assert shown.loc[n, "calibrated for"] == want_for
            assert shown.loc[n, "score"] == pytest.approx(p, abs=1e-6)
            assert shown.loc[n, "threshold"] == pytest.approx(t)
            assert shown.loc[n, "verdict"] == ("flagged" if p >= t else "not flagged")
        assert at.query_params["calibrate"] == choice
        # The verdict line is rebuilt from the same recalibrated verdicts.
        n = int((shown["verdict"] == "flagged").sum())
        (line,) = _verdict_line(at)
        assert f"{n} of {len(DETECTORS)} detectors flag it" in line
    # Back to automatic: the table as first shown, and the parameter leaves the URL.
    at.selectbox(key=KEY_CALIBRATE_AS).set_value(CALIBRATE_AUTO).run()
    pd.testing.assert_frame_equal(table(), auto)
    assert "calibrate" not in at.query_params
    assert at.session_state[STATE_KEY].calibrate_as == CALIBRATE_AUTO


def test_a_link_names_the_calibration_or_says_it_is_not_here(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    calibrated_artifacts: Path,
    tiny_artifacts: Path,
) -> None:
    detectors_dir(calibrated_artifacts)
    at = make_app()
    at.query_params["calibrate"] = "builtin"
    at.run()
    at.switch_page(PLAYGROUND).run()
    at.selectbox(key=KEY_EXAMPLE).select(EXAMPLE).run()
    at.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_PASTE).run()
    at.button(key=KEY_ANALYSE).click().run()
    _no_exception(at)
    assert at.selectbox(key=KEY_CALIBRATE_AS).value == "builtin"
    assert set(_verdict_table(at)["calibrated for"]) == {"builtin"}
    # Detectors without per-dataset calibrations: no control, a linked one is named missing.
    detectors_dir(tiny_artifacts)
    at2 = make_app()
    at2.query_params["calibrate"] = "builtin"
    at2.run()
    at2.switch_page(PLAYGROUND).run()
    at2.selectbox(key=KEY_EXAMPLE).select(EXAMPLE).run()
    at2.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_PASTE).run()
    at2.button(key=KEY_ANALYSE).click().run()
    _no_exception(at2)
    assert not [s for s in at2.selectbox if s.key == KEY_CALIBRATE_AS]
    assert any("builtin" in w.value and "calibration" in w.value for w in at2.warning)


def test_no_artifacts_says_how_to_make_them(make_app: Callable[[], AppTest]) -> None:
    at = _analysed(make_app)  # app_env points RAGSCOPE_DETECTORS_DIR at a missing folder
    assert not at.error
    info = " ".join(i.value for i in at.info)
    assert "No trained detectors for tiny-random-llama" in info
    assert f"{TRAIN} --detectors nll,context_gain,lexical --out " in info
    assert not _colour_radios(at)
    assert not [t for t in at.table if "verdict" in t.value.columns]
    assert "surprisal (bits)" in _heatmap(at)


def test_artifacts_for_another_model_are_not_used(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    tiny_artifacts: Path,
    tmp_path: Path,
) -> None:
    folder = _copy(tiny_artifacts, tmp_path)
    for name in DETECTORS:
        cfg_path = folder / name / "cfg.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["model"] = EMBEDDED_KEY
        cfg_path.write_text(json.dumps(cfg))
    detectors_dir(folder)
    at = _analysed(make_app)
    assert not at.error, [e.value for e in at.error]
    info = " ".join(i.value for i in at.info)
    assert "No trained detectors for tiny-random-llama" in info
    assert "trained for `SmolLM2-135M-Instruct`" in info
    assert f"{TRAIN} --detectors nll,context_gain,lexical --out {folder}" in info
    assert not _colour_radios(at)


def test_broken_artifacts_are_errors_and_the_rest_still_runs(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    tiny_artifacts: Path,
    tmp_path: Path,
) -> None:
    folder = _copy(tiny_artifacts, tmp_path)
    (folder / "nll" / "weights.json").write_text("{not json")
    (folder / "lexical" / "cfg.json").write_text("not json either")
    detectors_dir(folder)
    at = _analysed(make_app)
    errors = sorted(e.value for e in at.error)
    assert len(errors) == 2, errors
    lexical, nll = errors
    assert f"`{folder / 'nll'}`" in nll and "weights.json does not match the SHA-256" in nll
    assert f"`{folder / 'lexical'}`" in lexical and "cfg.json cannot be read" in lexical
    assert f"{TRAIN} --detectors nll --out {folder}" in nll
    # The page goes on: the working detector is judged, the rest of the analysis is drawn.
    assert list(_verdict_table(at)["detector"]) == ["context_gain"]
    assert at.radio(key=KEY_COLOR_BY).options == ["surprisal (bits)", "context_gain token score"]
    assert "surprisal (bits)" in _heatmap(at)
    assert at.get("plotly_chart"), "the segment strip is missing"


def test_an_artifact_that_would_run_code_is_refused_and_the_rest_still_runs(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    tiny_artifacts: Path,
    tiny_model: LoadedModel,
    tmp_path: Path,
    hostile_artifact,
) -> None:
    folder = _copy(tiny_artifacts, tmp_path)
    marker = hostile_artifact(folder, "interpdetect", model_key=tiny_model.info.key)
    detectors_dir(folder)
    at = _analysed(make_app)
    # the page shows the error as Markdown with its text escaped: read it unescaped
    errors = [re.sub(r"\\(.)", r"\1", e.value) for e in at.error]
    assert len(errors) == 1, errors
    assert "interpdetect" in errors[0] and "refusing to load" in errors[0]
    assert "numpy.full_like" in errors[0] or "assert_run_python_script" in errors[0]
    assert sorted(_verdict_table(at)["detector"]) == sorted(DETECTORS)
    assert not marker.exists()


def test_detectors_that_cannot_run_are_an_error_not_an_exception(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    tiny_artifacts: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(*args: object, **kwargs: object) -> dict:
        raise ModelError("the spaCy model is not installed")

    monkeypatch.setattr("core.pipeline.judge.judge_stream", fail)
    detectors_dir(_copy(tiny_artifacts, tmp_path))  # its own folder: no cached verdicts
    at = _analysed(make_app)
    assert len(at.error) == 1
    assert "could not judge this answer" in at.error[0].value
    assert "spaCy model is not installed" in at.error[0].value
    assert not _colour_radios(at)
    assert "surprisal (bits)" in _heatmap(at)


# --------------------------------------------------------------------------- alignment


def test_align_token_scores_same_tokens_is_the_identity() -> None:
    offsets = np.array([[0, 3], [3, 7], [7, 8]])
    scores = np.array([0.1, 0.9, 0.4])
    out = align_token_scores(scores, offsets, offsets.copy())
    assert out.tolist() == pytest.approx(scores.tolist())


def test_align_token_scores_takes_the_max_of_overlapping_tokens() -> None:
    src = np.array([[0, 3], [3, 7], [7, 8]])
    scores = np.array([0.1, 0.9, 0.4])
    tgt = np.array([[0, 2], [2, 5], [5, 8], [8, 10]])  # [8, 10) overlaps nothing
    out = align_token_scores(scores, src, tgt)
    assert out[:3].tolist() == pytest.approx([0.1, 0.9, 0.9])
    assert np.isnan(out[3])


def test_align_token_scores_refuses_mismatched_offsets() -> None:
    with pytest.raises(ValueError, match="2 scores for 3 token offsets"):
        align_token_scores(np.zeros(2), np.zeros((3, 2)), np.zeros((3, 2)))


def test_analyse_traces_once_for_surprisal_and_detectors_and_streams_verdicts(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    tiny_artifacts: Path,
    tiny_model: LoadedModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import app.state.analysis as analysis_mod
    import core.pipeline.extract as extract_mod
    from core.engine.layout import render
    from core.engine.trace import response_needs, token_surprisal, trace

    passes: list[str] = []
    batch, single = extract_mod.trace_batch, analysis_mod.trace

    def counted_batch(model, layouts, needs, **kw):  # noqa: ANN001, ANN202
        passes.extend("with" if lay.with_context else "without" for lay in layouts)
        return batch(model, layouts, needs, **kw)

    def counted_single(model, layout, needs):  # noqa: ANN001, ANN202
        passes.append("surprisal alone")
        return single(model, layout, needs)

    monkeypatch.setattr(extract_mod, "trace_batch", counted_batch)
    monkeypatch.setattr(analysis_mod, "trace", counted_single)
    detectors_dir(_copy(tiny_artifacts, tmp_path))  # its own folder: nothing known yet
    at = _analysed(make_app)
    # context_gain reads a no-context pass; everything else shares ONE pass with context.
    assert passes == ["with", "without"]
    labels = [s.label for s in at.status]
    assert any(re.fullmatch(r"3 detectors judged the answer in [0-9.]+ s", x) for x in labels)
    assert len(_verdict_table(at)) == 3  # the streamed table made way for the whole one
    example = next(e for e in builtin_examples() if e.id == EXAMPLE)
    want = token_surprisal(trace(tiny_model, render(example, tiny_model), response_needs()))
    shown = _hover_values(_heatmap(at), "surprisal (bits)")
    assert shown == [f"{v:.2f}" for v in want]
    passes.clear()
    at.radio(key=KEY_COLOR_BY).set_value("nll").run()  # a display control: nothing recomputed
    at.button(key=KEY_ANALYSE).click().run()  # the same input again: known
    _no_exception(at)
    assert passes == []


def test_loaded_detectors_are_warmed_up_once_in_the_background(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    tiny_artifacts: Path,
    tiny_model: LoadedModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The set is judged once on the warm-up answer, on its own thread; while that runs
    the Playground says what is still loading (held here on an event, so the page is
    seen in that state, not timed), and says nothing once it is done."""
    import threading

    import core.pipeline.judge as judge_mod
    from app.state.detectors import detector_set
    from app.state.verdicts import warm_detectors

    judged: list[tuple[str, tuple[str, ...], str]] = []
    real = judge_mod.judge_stream
    release = threading.Event()

    def spy(model, example, detectors, **kw):  # noqa: ANN001, ANN202
        judged.append(
            (example.id, tuple(d.name for d in detectors), threading.current_thread().name)
        )
        assert release.wait(60)
        return real(model, example, detectors, **kw)

    monkeypatch.setattr(judge_mod, "judge_stream", spy)
    monkeypatch.setenv("RAGSCOPE_WARM_DETECTORS", "1")
    detectors_dir(_copy(tiny_artifacts, tmp_path))
    at = make_app().run()
    _no_exception(at)
    at.switch_page("views/playground.py").run()
    _no_exception(at)
    notes = [c.value for c in at.caption if "still loading in the background" in c.value]
    assert notes and f"0 of {len(DETECTORS)} ready" in notes[0], [c.value for c in at.caption]
    release.set()
    warming = warm_detectors(tiny_model, detector_set(tiny_model))
    assert warming is not None and warming.thread is not None
    warming.thread.join(timeout=60)
    assert warming.failed is None and warming.ready == len(DETECTORS)
    assert warming.seconds is not None and warming.seconds > 0
    at.run()  # a rerun starts nothing new, and the note is gone
    assert not [c.value for c in at.caption if "still loading" in c.value]
    assert judged == [("warm-up", tuple(sorted(DETECTORS)), "ragscope-warm-detectors")]
    monkeypatch.setenv("RAGSCOPE_WARM_DETECTORS", "0")
    assert warm_detectors(tiny_model, detector_set(tiny_model)) is None


def test_verdict_table_says_which_calibration_judged_each_answer() -> None:
    # A detector trained on datasets a+b judges an answer of b by b's own calibration
    # and threshold, any other answer by the pooled ones; the table names which.
    det = NLLDetector(NLLDetector.Config())
    det.threshold_ = 0.5
    det.calibration_ = PlattCalibrator.from_json({"kind": "platt", "a": 1.0, "b": 0.0, "n": 90})
    own = DatasetCalibration(
        calibrator=PlattCalibrator.from_json({"kind": "platt", "a": 2.0, "b": -1.0, "n": 46}),
        threshold=0.3,
        n=46,
        n_positive=20,
    )
    det.dataset_calibration_ = {"b": own}
    in_b = Verdict(detector="nll", example_id="x", score=0.4, hallucinated=True, calibrated_for="b")
    elsewhere = Verdict(detector="nll", example_id="x", score=0.4, hallucinated=False)
    shipped = ArtifactCard(
        name="nll",
        folder=Path("nll"),
        detector=det,
        model="m",
        training=TrainedOn(datasets=("a", "b"), counts={"a": 44, "b": 46}, n_train=90),
        threshold=det.threshold_,
        token_threshold=None,
        calibrated=True,
        calibrations=("b",),
        auroc=None,
        auroc_from=None,
        metrics={},
    )
    frame = verdict_frame([shipped, shipped], [in_b, elsewhere])
    assert frame["calibrated for"].tolist() == ["b", "all its training data"]
    assert frame["threshold"].tolist() == pytest.approx([0.3, 0.5])
    assert frame["verdict"].tolist() == ["flagged", "not flagged"]
    uncalibrated = dataclasses.replace(shipped, calibrated=False)
    assert verdict_frame([uncalibrated], [elsewhere])["calibrated for"].tolist() == [""]


def test_the_training_caption_names_the_datasets_an_ensemble_reads_with_their_own_stacker():
    def card(name, own=()):
        return SimpleNamespace(
            name=name, trained_on="a_dev + b", n_train=120, auroc_from="5-fold CV", own_stackers=own
        )

    plain = SimpleNamespace(
        name="default", trained_on=["a_dev + b"], detectors=[card("nll")], deferred_from=None
    )
    assert training_caption(plain) == (
        "Detector set **default**: trained on a\\_dev + b (120 answers), AUROC from 5-fold CV."
    )
    expert = SimpleNamespace(
        name="rt", trained_on=["a_dev"], detectors=[card("nll")], deferred_from="default"
    )
    assert training_caption(expert).startswith(
        "Judged by the **rt** set, the default set's expert for answers of its training data: "
    )
    shipped = SimpleNamespace(
        name="default",
        trained_on=["a_dev + b"],
        detectors=[card("nll"), card("ensemble", ("a_dev",))],
        deferred_from=None,
    )
    text = training_caption(shipped)
    assert text.endswith(
        "Its ensemble reads answers of a\\_dev with a stacker of that dataset's own, fitted "
        "on its answers alone."
    )


def test_analyse_says_how_long_it_will_take_paced_on_the_last_one(
    make_app: Callable[[], AppTest],
    detectors_dir: Callable[[Path], None],
    tiny_artifacts: Path,
    tiny_model: LoadedModel,
) -> None:
    detectors_dir(tiny_artifacts)

    def estimates(at: AppTest) -> list[str]:
        return [c.value for c in at.caption if c.value.startswith("Estimated time")]

    at = make_app().run()
    at.switch_page(PLAYGROUND).run()
    at.selectbox(key=KEY_EXAMPLE).select(EXAMPLE).run()
    # Nothing is timed just to estimate: before any Analyse here it is not known.
    assert [e.split(";")[0] for e in estimates(at)] == ["Estimated time: not known yet"]
    # An answer no other test analysed in this process (verdicts are kept per answer).
    at.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_PASTE).run()
    at.text_area(key=KEY_PASTED).input("An answer only the estimate test reads.").run()
    at.button(key=KEY_ANALYSE).click().run()
    _no_exception(at)
    assert not estimates(at)  # this answer is analysed: nothing to estimate
    shipped = load_set(tiny_model.info.key)
    with Store() as store:  # per answer token, under the features the set reads
        pace = store.get_pace(
            model=tiny_model.instance_key, detectors=app_estimates._answers_key(shipped, "analyse")
        )
    assert pace is not None and pace > 0  # the Analyse's own pace was recorded
    other = next(e for e in builtin_examples() if e.id != EXAMPLE)
    at.selectbox(key=KEY_EXAMPLE).select(other.id).run()
    (said,) = estimates(at)
    assert said.startswith("Estimated time on this machine: **") and "last Analyse here" in said
    assert ("a few seconds" in said) == (answer_tokens(tiny_model, other) * pace < 5.0)
