"""Analyses of fitted detectors over many answers.

Analyses of fitted detectors over many answers: detector agreement, heads and layers,
SHAP values and the teaching walkthroughs' numbers."""
