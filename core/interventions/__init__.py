"""Changing what the model says.

Changing what the model says: AARF reweighting, counterfactual passages, steering and
mitigation."""
