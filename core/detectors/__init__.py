"""Detectors: one module per detector, and the registry of them all by name.

Every detector implements :class:`core.learning.contract.Detector`. :data:`DETECTORS` is built
here by explicit imports: the single detectors (:data:`core.detectors.registry.MEMBERS`)
plus the ensemble, which combines them. Shipped artifacts (``assets/detectors``) are
listed, loaded and sealed through it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.base.errors import DataError
from core.base.paths import shipped_dir
from core.base.safeio import json_default, read_bounded
from core.detectors.ensemble import EnsembleDetector
from core.detectors.registry import MEMBERS, Registry
from core.engine.model import LoadedModel
from core.learning.artifact import (
    ARTIFACT_JSON_LIMIT,
    artifact_files,
    artifact_hashes,
    artifact_info,
    read_artifact_cfg,
)
from core.learning.contract import Detector, DetectorClass

DETECTORS: Registry = MEMBERS.extended(EnsembleDetector)
"""Every detector by name."""


def detector_class(name: str) -> DetectorClass:
    """The class registered as ``name`` (:class:`DataError` naming the others if none)."""
    return DETECTORS.get(name)


def available_detectors() -> list[str]:
    return DETECTORS.names()


def make_detector(name: str, **config: Any) -> Detector:
    """A fresh, unfitted detector with ``config`` overriding the defaults."""
    return DETECTORS.make(name, **config)


def runnable_detectors(model: LoadedModel) -> list[str]:
    """The detectors that can read ``model`` with their default config."""
    return DETECTORS.runnable(model)


def shipped_artifacts(
    model_key: str | None = None, folder: str | Path | None = None
) -> dict[str, Path]:
    """Detector name -> artifact folder, for the registered detectors shipped in ``folder``.

    Args:
        model_key: Keep only artifacts trained on this model (``ModelInfo.key``).
        folder: Where to look (default :func:`shipped_dir`).
    """
    root = Path(folder) if folder is not None else shipped_dir()
    names = set(DETECTORS.names())
    out: dict[str, Path] = {}
    if not root.is_dir():
        return out
    for sub in sorted(root.iterdir()):
        if sub.name not in names or not (sub / "cfg.json").is_file():
            continue
        try:
            cfg = artifact_info(sub)
        except DataError:
            continue
        if model_key is None or cfg.get("model") == model_key:
            out[sub.name] = sub
    return out


def load_shipped(name: str, model_key: str, folder: str | Path | None = None) -> Detector:
    """The shipped, fitted detector ``name`` for the model ``model_key``.

    Raises:
        DataError: Nothing shipped under that name.
        ModelError: The shipped artifact was trained on another model.
    """
    root = Path(folder) if folder is not None else shipped_dir()
    return DETECTORS.get(name).load(root / name, model_key=model_key)


def seal_artifact(folder: str | Path) -> list[Path]:
    """Record the SHA-256 of every file in an artifact folder's ``cfg.json`` (and in its
    members', for an ensemble), for artifacts written before ragscope recorded them.

    Sealing does not vouch for a file by itself: after recording, the detector is
    loaded in full (skops files under their exact allowlists, every check of
    ``load``); if that fails the old ``cfg.json`` is put back and the error raised.

    Returns:
        The folders sealed, members first.

    Raises:
        DataError: Not an artifact folder, a symbolic link anywhere in it (refused
            before anything is written), or it does not load safely.
    """
    path = Path(folder)
    cfg_path = path / "cfg.json"
    # Before anything is written: no link anywhere in the tree (a member's folder or a
    # cfg.json linked elsewhere would have that target rewritten), within the size cap.
    artifact_files(path)
    cfg = read_artifact_cfg(cfg_path)
    name = cfg.get("detector")
    if not isinstance(name, str) or name not in DETECTORS.names():
        raise DataError(f"cfg.json names no known detector ({name!r})", source=str(path))
    sealed: list[Path] = []
    members = path / "members"
    if members.is_dir() and not members.is_symlink():
        for sub in sorted(members.iterdir()):
            if (sub / "cfg.json").is_file():
                sealed += seal_artifact(sub)
    old = read_bounded(cfg_path, ARTIFACT_JSON_LIMIT)
    cfg["files"] = artifact_hashes(path)
    cfg_path.write_text(json.dumps(cfg, indent=2, default=json_default) + "\n")
    try:
        DETECTORS.get(name).load(path, model_key=None)
    except BaseException:
        cfg_path.write_bytes(old)
        raise
    return [*sealed, path]
