"""The numbers the Learn page teaches with: the logit lens over an answer ends exactly at
the model's own probabilities, jumps are where the lens rises most, and CORTEX's walk
agrees with the detector's own verdict."""

from __future__ import annotations

import numpy as np
import pytest

from core.analysis.teach import LensCurve, lens_curve
from core.data import builtin_examples
from core.engine.trace import token_surprisal

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_lens_after_the_last_block_is_the_model(tiny_model) -> None:
    ex = builtin_examples()[0]
    curve = lens_curve(tiny_model, ex)
    assert curve.probs.shape == (tiny_model.info.n_layers, len(curve.tokens))
    np.testing.assert_allclose(curve.probs[-1], curve.final, atol=1e-9)
    # the final probabilities are the surprisal the trace engine reports, in bits
    from core.engine.layout import render
    from core.engine.trace import response_needs, trace

    tr = trace(tiny_model, render(ex, tiny_model), response_needs())
    np.testing.assert_allclose(-np.log2(curve.final), token_surprisal(tr), rtol=1e-4, atol=1e-5)
    assert "".join(curve.tokens) == ex.response[: len("".join(curve.tokens))]


def test_jump_layer_is_the_largest_rise() -> None:
    probs = np.array([[0.1, 0.5], [0.15, 0.6], [0.9, 0.62]])
    c = LensCurve(tokens=("a", "b"), offsets=np.zeros((2, 2)), probs=probs, final=probs[-1])
    assert c.jump_layer(0) == 2  # +0.75 at block 2
    assert c.jump_layer(1) == 0  # +0.5 from nothing at block 0
    assert list(c.jump_layers()) == [2, 0]


@pytest.fixture(scope="module")
def demo_cortex(tiny_model):
    from core.data import resolve_dataset
    from core.detectors import make_detector
    from core.pipeline.extract import extract_features

    builtin = resolve_dataset("builtin")[1]
    train = [e for e in builtin if e.label and e.spans][:8] + [
        e for e in builtin if e.label is False
    ][:8]
    det = make_detector("cortex", epochs=2)
    return det.fit(list(extract_features(tiny_model, train, [det]).features["cortex"]), train)


def test_cortex_walk_matches_the_detectors_verdict(tiny_model, demo_cortex) -> None:
    from core.analysis.teach import cortex_walk
    from core.pipeline.extract import run_example

    ex = next(e for e in builtin_examples() if e.spans)
    walk = cortex_walk(tiny_model, demo_cortex, ex)
    v = demo_cortex.predict(run_example(tiny_model, ex, [demo_cortex])["cortex"])
    np.testing.assert_allclose(
        walk.smoothed(demo_cortex.config.p_stay_token), v.token_scores, atol=1e-6
    )
    assert float(walk.smoothed(walk.answer_p_stay).max()) == pytest.approx(v.score, abs=1e-6)
    assert walk.dh_norm.shape == walk.c_norm.shape == walk.raw.shape == (len(walk.tokens),)
