"""Every registered detector behaves as the contract says (issue 38, item 6; in the
manner of scikit-learn's ``parametrize_with_checks``): fitted on a small labelled set
with the tiny model it predicts, saves, loads back to identical predictions, refits to
the same predictions (pinned seeds), round-trips its config, and refuses its artifact
once a file of it is tampered with.

A detector added to the registry is checked here without a line of this file changing
(its small options below are only speed-ups; without them it runs with its defaults).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.base.errors import DataError
from core.base.safeio import CHECKED_TYPES, fitted_parts
from core.data import load_builtin, stratified_head
from core.detectors import available_detectors, detector_class, make_detector
from core.engine.model import LoadedModel
from core.learning.contract import Detector, Features, Verdict, scores_tokens
from core.pipeline.extract import extract_features

N_ANSWERS = 32  # half hallucinated: enough for every detector's inner folds
N_HELD = 6

FAST: Mapping[str, Mapping[str, Any]] = {
    "cortex": {"epochs": 3},
    "spad": {"n_iter": 3, "cv": 2},
    "raglens": {"top_k": 8, "max_rounds": 100},
    "ensemble": {"members": ["nll", "lexical", "saplma"], "stack_folds": 2},
    "interpdetect": {"classifiers": ("lr",)},
}
"""Smaller options for the slow fits (a speed-up, not a requirement)."""


def _options(name: str, sae_path: Path) -> dict[str, Any]:
    opts = dict(FAST.get(name, {}))
    if name == "raglens":
        opts["sae"] = str(sae_path)
    return opts


@pytest.fixture(scope="module")
def read(tiny_model: LoadedModel, tiny_sae) -> tuple[list, list, dict[str, list[Features]]]:
    """A fitting part and a held-out part of the built-in corpus, and every registered
    detector's features of them (one pass per answer for all)."""
    examples = stratified_head(load_builtin(), N_ANSWERS + N_HELD)
    dets = [make_detector(n, **_options(n, Path(tiny_sae.path))) for n in available_detectors()]
    ext = extract_features(tiny_model, examples, dets)
    return examples[:N_ANSWERS], examples[N_ANSWERS:], {n: list(f) for n, f in ext.features.items()}


def _same(a: Verdict, b: Verdict) -> None:
    """Two verdicts on one answer agree: score, raw score, flag, token scores."""
    assert a.score == pytest.approx(b.score, abs=1e-9)
    assert (a.raw_score is None) == (b.raw_score is None)
    if a.raw_score is not None:
        assert a.raw_score == pytest.approx(b.raw_score, abs=1e-9)
    assert a.hallucinated == b.hallucinated and a.threshold == b.threshold
    assert (a.token_scores is None) == (b.token_scores is None)
    if a.token_scores is not None:
        np.testing.assert_allclose(a.token_scores, b.token_scores, atol=1e-9)


_PLAIN = (int, float, str, bool, type(None), np.ndarray, np.generic)


def _unchecked(parts: Mapping[str, tuple[Any, int | None]]) -> list[str]:
    """Where a fitted part lies that :func:`core.base.safeio.check_fitted` would pass
    unchecked: not a plain value, not a container it walks, not a checked type (a
    composite's members are loaded, and checked, as detectors of their own)."""
    out: list[str] = []

    def walk(obj: Any, where: str) -> None:
        if isinstance(obj, _PLAIN) or isinstance(obj, Detector):
            return
        if type(obj).__name__ in CHECKED_TYPES:
            return
        inner = fitted_parts(obj)
        if not inner and not isinstance(obj, dict | list | tuple):
            out.append(f"{where}: {type(obj).__module__}.{type(obj).__name__}")
        for label, part in inner:
            walk(part, f"{where}{label}")

    for label, (model, _) in parts.items():
        walk(model, label)
    return out


def _fit(name: str, opts: Mapping[str, Any], feats: list[Features], examples: list) -> Any:
    return make_detector(name, **opts).fit(feats, examples)


@pytest.mark.parametrize("name", available_detectors())
def test_every_detector_fits_predicts_persists_and_refits_alike(
    name: str,
    tiny_model: LoadedModel,
    tiny_sae,
    read,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    train, held, features = read
    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(Path(tiny_sae.path).parent))
    opts = _options(name, Path(tiny_sae.path))
    det = make_detector(name, **opts)
    # The config round-trips, and its hash with it.
    config = type(det.config).from_dict(det.config.to_dict())
    assert config == det.config and config.config_hash() == det.config.config_hash()
    by_id = {f.example_id: f for f in features[name]}
    tr_f = [by_id[e.id] for e in train if e.id in by_id]
    tr_e = [e for e in train if e.id in by_id]
    te_f = [by_id[e.id] for e in held if e.id in by_id]
    assert len(tr_f) == len(train) and len(te_f) == len(held), "every answer is read"

    det.fit(tr_f, tr_e)
    before = [det.predict(f) for f in te_f]
    assert all(0.0 <= v.score <= 1.0 and v.detector == name for v in before)
    # What the class declares about token scores holds for its verdicts.
    assert scores_tokens(det) == all(v.token_scores is not None for v in before)

    # Saved and loaded back: the same verdicts.
    folder = det.save(tmp_path / name)
    loaded = detector_class(name).load(folder, model_key=tiny_model.info.key)
    assert loaded.config == det.config
    for a, b in zip(before, (loaded.predict(f) for f in te_f), strict=True):
        _same(a, b)
    # Every fitted part it holds, however deep, is of a type the load-time check checks.
    assert _unchecked(loaded.fitted_models()) == [], f"{name}: fitted parts never checked"

    # Refitted from scratch on the same answers: the same verdicts (seeds are pinned).
    again = _fit(name, opts, tr_f, tr_e)
    for a, b in zip(before, (again.predict(f) for f in te_f), strict=True):
        _same(a, b)

    # A tampered file of the artifact is refused.
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name != "cfg.json")
    target = files[0] if files else Path(folder) / "cfg.json"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(DataError):
        detector_class(name).load(folder, model_key=tiny_model.info.key)
