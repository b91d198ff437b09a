"""Detectors: one module per detector, registered by name (see :mod:`core.detectors.base`)."""

from core.detectors.base import (
    Detector,
    DetectorConfig,
    Features,
    Run,
    Verdict,
    artifact_info,
    available_detectors,
    compare_artifacts,
    detector_class,
    load_shipped,
    make_detector,
    register_detector,
    runnable_detectors,
    seal_artifact,
    shipped_artifacts,
    shipped_dir,
)

__all__ = [
    "Detector",
    "DetectorConfig",
    "Features",
    "Run",
    "Verdict",
    "artifact_info",
    "available_detectors",
    "compare_artifacts",
    "detector_class",
    "load_shipped",
    "make_detector",
    "register_detector",
    "runnable_detectors",
    "seal_artifact",
    "shipped_artifacts",
    "shipped_dir",
]
