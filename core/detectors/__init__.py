"""Detectors: one module per detector, registered by name (see :mod:`core.detectors.base`)."""

from core.detectors.base import (
    Detector,
    DetectorConfig,
    Features,
    Run,
    Verdict,
    available_detectors,
    detector_class,
    make_detector,
    register_detector,
)

__all__ = [
    "Detector",
    "DetectorConfig",
    "Features",
    "Run",
    "Verdict",
    "available_detectors",
    "detector_class",
    "make_detector",
    "register_detector",
]
