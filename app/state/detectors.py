"""The shipped detectors for the loaded model (loaded once; reloaded when their files change)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import streamlit as st

from core.artifact import artifact_info
from core.detectors import available_detectors, load_shipped, shipped_artifacts
from core.errors import DataError, RagscopeError
from core.paths import (
    DEFAULT_SET,
    TRAINED_SET,
    detector_set_dir,
    detector_set_name,
    model_detectors_dir,
    shipped_dir,
)

if TYPE_CHECKING:
    from core.contract import Detector
    from core.model import LoadedModel


@dataclass(frozen=True, kw_only=True, eq=False)
class ShippedDetector:
    """A fitted detector loaded from a shipped artifact, with what its ``cfg.json`` says.

    Attributes:
        name: Detector name (also the artifact's folder name).
        folder: The artifact folder.
        detector: The fitted detector.
        threshold: Score at or above which the detector flags an answer.
        trained_on: Name of the dataset(s) it was trained on, when recorded.
        n_train: Training examples, when recorded.
        auroc: Its recorded AUROC: cross-validated (pooled out of fold) for artifacts
            trained with ``ragscope train --cv``, else on the held-out test split.
        auroc_from: Where :attr:`auroc` comes from (``"5-fold CV"``, ``"test split"``).
        calibrated: Whether its scores are calibrated probabilities.
    """

    name: str
    folder: Path
    detector: Detector
    threshold: float
    trained_on: str | None
    n_train: int | None
    auroc: float | None
    auroc_from: str | None = None
    calibrated: bool = False


@dataclass(frozen=True, kw_only=True)
class BrokenArtifact:
    """A shipped artifact folder that could not be loaded.

    Attributes:
        name: Detector name (the folder's name).
        folder: The artifact folder.
        reason: Why loading failed.
    """

    name: str
    folder: Path
    reason: str


@dataclass(frozen=True, kw_only=True, eq=False)
class ShippedDetectors:
    """The shipped detectors for one model, as found in one artifacts folder.

    Attributes:
        folder: Where the artifacts were looked for (:func:`core.detectors.shipped_dir`).
        model_key: ``ModelInfo.key`` of the model they were loaded for.
        detectors: The loaded detectors trained on that model, by name.
        broken: Artifacts that could not be read or loaded.
        other_models: Model keys that the readable artifacts of other models were made for.
        stamp: :func:`_artifacts_stamp` of the folder when they were loaded.
        set_name: The detector set they come from (:func:`core.paths.detector_set_name`).
        set_error: Why the requested set could not be used (the default set was loaded).
    """

    folder: Path
    model_key: str
    detectors: tuple[ShippedDetector, ...]
    broken: tuple[BrokenArtifact, ...]
    other_models: tuple[str, ...]
    stamp: str
    set_name: str = DEFAULT_SET
    set_error: str | None = None

    @property
    def trained_on(self) -> tuple[str, ...]:
        """The distinct training-data names the loaded detectors record, in order."""
        return tuple(dict.fromkeys(d.trained_on for d in self.detectors if d.trained_on))

    @property
    def cache_id(self) -> str:
        """Identifies this set of detectors, for the verdict cache."""
        return f"{self.model_key}|{self.folder}|{self.stamp}"


def _artifacts_stamp(root: Path) -> str:
    """Changes whenever an artifact file under ``root`` is added, removed or rewritten."""
    parts: list[str] = []
    for path in sorted(root.glob("*/*.json")) if root.is_dir() else ():
        try:
            stat = path.stat()
        except OSError:  # removed while listing: the next rerun sees the new state
            continue
        parts.append(f"{path.relative_to(root)}:{stat.st_mtime_ns}:{stat.st_size}")
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:16]


def _cfg_value(cfg: dict[str, Any], *path: str) -> object:
    """``cfg[path[0]][path[1]]...``, or ``None`` where a level is missing."""
    node: object = cfg
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _artifact_cfg(folder: Path) -> dict[str, Any]:
    """An artifact's ``cfg.json``, or ``{}`` when it cannot be read."""

    try:
        return artifact_info(folder)
    except DataError:
        return {}


def _shipped_detector(name: str, folder: Path, detector: Detector) -> ShippedDetector:
    """Wrap a loaded detector with the facts of its ``cfg.json``."""
    cfg = _artifact_cfg(folder)
    dataset = _cfg_value(cfg, "trained_on", "dataset")
    sets = _cfg_value(cfg, "trained_on", "datasets")
    if isinstance(sets, list) and sets and all(isinstance(x, str) for x in sets):
        dataset = " + ".join(sets)
    n_train = _cfg_value(cfg, "trained_on", "n", "train")
    counts = _cfg_value(cfg, "trained_on", "n")
    if n_train is None and isinstance(sets, list) and isinstance(counts, dict):
        n_train = sum(v for v in counts.values() if isinstance(v, int)) or None
    if n_train is None:
        n_train = _cfg_value(cfg, "train", "n_train")
    auroc = _cfg_value(cfg, "metrics", "cv", "pooled", "auroc")
    k = _cfg_value(cfg, "metrics", "cv", "k")
    auroc_from = f"{k}-fold CV" if auroc is not None else None
    if auroc is None:
        auroc = _cfg_value(cfg, "metrics", "test", "auroc")
        auroc_from = "test split" if auroc is not None else None
    threshold = getattr(detector, "threshold_", None)
    if threshold is None:
        threshold = _cfg_value(cfg, "threshold")
    return ShippedDetector(
        name=name,
        folder=folder,
        detector=detector,
        threshold=float(threshold) if isinstance(threshold, int | float) else 0.5,
        trained_on=str(dataset) if dataset is not None else None,
        n_train=int(n_train) if isinstance(n_train, int | float) else None,
        auroc=float(auroc) if isinstance(auroc, int | float) else None,
        auroc_from=auroc_from if isinstance(auroc, int | float) else None,
        calibrated=detector.calibration_ is not None,
    )


@st.cache_resource(show_spinner="Loading the trained detectors…", max_entries=8)
def _shipped_detectors(model_key: str, folder: str, stamp: str) -> ShippedDetectors:
    """Load every artifact in ``folder`` made for ``model_key``; ``stamp`` keys the cache."""

    root = Path(folder)
    readable = shipped_artifacts(folder=root)
    matching = shipped_artifacts(model_key, folder=root)
    loaded: list[ShippedDetector] = []
    broken: list[BrokenArtifact] = []
    registered = set(available_detectors())
    for sub in sorted(root.iterdir()) if root.is_dir() else ():
        if sub.name in registered and sub.name not in readable and (sub / "cfg.json").exists():
            broken.append(
                BrokenArtifact(name=sub.name, folder=sub, reason="its cfg.json cannot be read")
            )
    for name, path in matching.items():
        try:
            loaded.append(_shipped_detector(name, path, load_shipped(name, model_key, root)))
        except RagscopeError as e:
            broken.append(BrokenArtifact(name=name, folder=path, reason=str(e)))
        except (KeyError, TypeError, ValueError) as e:
            # Well-formed JSON with the wrong content: the loaders index into it directly.
            reason = f"malformed artifact ({type(e).__name__}: {e})"
            broken.append(BrokenArtifact(name=name, folder=path, reason=reason))
    models = {_cfg_value(_artifact_cfg(path), "model") for path in readable.values()}
    return ShippedDetectors(
        folder=root,
        model_key=model_key,
        detectors=tuple(loaded),
        broken=tuple(sorted(broken, key=lambda b: b.name)),
        other_models=tuple(sorted(str(m) for m in models if m and m != model_key)),
        stamp=stamp,
    )


def shipped_detectors(model: LoadedModel) -> ShippedDetectors:
    """The shipped detectors trained on ``model`` (cached; reloaded when the files change).

    Artifacts come from :func:`core.detectors.shipped_dir` (``RAGSCOPE_DETECTORS_DIR``,
    else ``assets/detectors``). When that set has none for ``model`` (neither loaded nor
    broken), the detectors trained on this machine for it are loaded instead
    (:func:`core.paths.model_detectors_dir`, set name ``trained``): a training job's
    artifacts appear on the next rerun, as the folder's stamp changes. A broken artifact
    does not raise: it is listed in :attr:`ShippedDetectors.broken` and the others
    still load.
    """

    set_name, set_error = detector_set_name(), None
    try:
        root = shipped_dir()
    except DataError as e:
        set_name, set_error, root = DEFAULT_SET, str(e), detector_set_dir(DEFAULT_SET)
    found = _shipped_detectors(model.info.key, str(root), _artifacts_stamp(root))
    if not found.detectors and not found.broken:
        own = model_detectors_dir(model.info.key)
        if own.is_dir():
            trained = _shipped_detectors(model.info.key, str(own), _artifacts_stamp(own))
            if trained.detectors or trained.broken:
                return replace(
                    trained,
                    other_models=found.other_models,
                    set_name=TRAINED_SET,
                    set_error=set_error,
                )
    return replace(found, set_name=set_name, set_error=set_error)
