"""The detector contract, fitted artifacts, learners, metrics, calibration.

What fitting needs below the detectors: gold labels, learners, mutual information,
metrics, calibration, the detector contract (features, verdicts, configs) and fitted
artifact folders."""
