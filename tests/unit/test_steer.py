"""SAE steering on the tiny model: the exact residual edit at one position, hooks removed
after use, continuations per value, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.base.errors import DataError
from core.engine.layout import render
from core.engine.trace import Needs, trace
from core.interventions.steer import steer_continuation, steer_values, steered

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _logits(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        return model.bridge(torch.as_tensor([ids])).float()


def test_steering_edits_only_that_position_and_is_removed_after(
    tiny_model, tiny_sae, toy_example
) -> None:
    layout = render(toy_example, tiny_model)
    ids = layout.token_ids.tolist()
    p = int(layout.response_positions[2])
    k = 3
    before = _logits(tiny_model, ids)
    needs = Needs.of(["resid_post"], layers=[tiny_sae.layer], positions="all")
    plain = trace(tiny_model, layout, needs).get("resid_post", tiny_sae.layer)
    with steered(tiny_model, tiny_sae, k, p, 20.0):
        edited = trace(tiny_model, layout, needs).get("resid_post", tiny_sae.layer)
        inside = _logits(tiny_model, ids)
    after = _logits(tiny_model, ids)
    torch.testing.assert_close(after, before, rtol=0, atol=0)  # the hook is gone
    assert not torch.allclose(inside[0, p:], before[0, p:])
    torch.testing.assert_close(inside[0, :p], before[0, :p])  # causal: earlier tokens as before
    z = tiny_sae.encode(plain[p][None], "post")[0, k]
    w = tiny_sae.sae.W_dec[k].detach().float()
    np.testing.assert_allclose(edited[p].numpy(), (plain[p] + (20.0 - z) * w).numpy(), atol=1e-4)
    others = [i for i in range(len(layout)) if i != p]
    torch.testing.assert_close(edited[others], plain[others])


def test_hooks_are_removed_when_the_block_raises(tiny_model, tiny_sae, toy_example) -> None:
    ids = render(toy_example, tiny_model).token_ids.tolist()
    before = _logits(tiny_model, ids)
    with pytest.raises(RuntimeError, match="boom"), steered(tiny_model, tiny_sae, 0, 5, 20.0):
        raise RuntimeError("boom")
    torch.testing.assert_close(_logits(tiny_model, ids), before, rtol=0, atol=0)


def test_continuations_per_value(tiny_model, tiny_sae, toy_example) -> None:
    ref = steer_continuation(
        tiny_model, tiny_sae, toy_example, feature=1, position=1, value=None, max_new_tokens=5
    )
    runs = steer_values(
        tiny_model,
        tiny_sae,
        toy_example,
        feature=1,
        position=1,
        values=(-200.0, 200.0),
        max_new_tokens=5,
    )
    assert [r.value for r in runs] == [-200.0, 200.0]
    assert all(r.prefix == ref.prefix for r in runs)
    assert toy_example.response.startswith(ref.prefix)
    assert len({ref.token_ids, *(r.token_ids for r in runs)}) > 1  # steering changes the text


def test_bad_steering_input_is_refused(tiny_model, tiny_sae, toy_example) -> None:
    with pytest.raises(DataError, match="outside"):
        steer_continuation(tiny_model, tiny_sae, toy_example, feature=10**6, position=0, value=1.0)
    with pytest.raises(DataError, match="not an answer token"):
        steer_continuation(tiny_model, tiny_sae, toy_example, feature=0, position=999, value=1.0)
