"""Logit lens and copying heads on the real embedded model (SmolLM2-135M-Instruct)."""

from __future__ import annotations

import numpy as np
import pytest

from core.engine.layout import render
from core.engine.trace import Needs, trace
from core.signals.copying_heads import copying_scores
from core.signals.lens import lens_logits, pks_from_trace

pytestmark = pytest.mark.embedded


def test_lens_equals_logits_and_pks_is_bounded(embedded_model, toy_example):
    m = embedded_model
    layout = render(toy_example, m)
    n = m.info.n_layers
    tr = trace(
        m,
        layout,
        Needs.of(["resid_mid", "resid_post", "logits"], n_layers=n, positions="generation"),
    )
    last = tr.get("resid_post", n - 1)
    assert (lens_logits(m, last) - tr.get("logits")).abs().max().item() < 1e-3
    pks = pks_from_trace(m, tr)
    assert pks.shape == (n, len(layout.generation_positions))
    assert (pks >= 0).all() and (pks <= 1).all() and pks.max() > 1e-3


def test_copying_scores_cover_every_head(embedded_model, tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path))
    res = copying_scores(embedded_model)
    info = embedded_model.info
    assert res.scores.shape == (info.n_layers, info.n_heads)
    assert (np.abs(res.scores) <= 1).all() and np.ptp(res.scores) > 0.1
    assert len(res.top_heads()) == 32
    assert res.kv_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
