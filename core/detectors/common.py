"""What several detectors read the same way: head and layer feature names, the
per-run PKS matrix shared between ReDeEP and InterpDetect (computed once per run), and
the answers whose token labels are known (token-level training sets).

Not a detector: detectors import it, never each other (the ensemble goes through the
registry).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from core.base.examples import RAGExample
from core.engine.model import LoadedModel
from core.learning.contract import Features, Run
from core.signals.lens import pks_from_trace


def head_name(layer: int, head: int) -> str:
    return f"ECS_L{layer}H{head}"


def layer_name(layer: int) -> str:
    return f"PKS_L{layer}"


def parse_head(name: str) -> tuple[int, int]:
    """``"ECS_L3H7"`` -> ``(3, 7)``."""
    body = name.removeprefix("ECS_L")
    layer, head = body.split("H")
    return int(layer), int(head)


def shared_pks(run: Run, model: LoadedModel, *, final_norm: bool) -> np.ndarray:
    """``[layer, resp]`` PKS of the run, computed once for every detector that asks."""

    def compute() -> np.ndarray:
        assert run.trace is not None
        # float32 divergences: 3x faster, error < 1e-6 bits (see core.signals.lens.jsd_bits).
        return pks_from_trace(model, run.trace, final_norm=final_norm, precision="float32")

    return run.shared(("pks", final_norm), compute)


def known_token_labels(features: Features, example: RAGExample) -> np.ndarray | None:
    """Gold label per token of ``features``, where it is known: gold spans label their
    tokens, a faithful answer without spans is all faithful, and a hallucinated answer
    without spans (which of its tokens are wrong is unknown) gives ``None``."""
    if features.token_offsets is None:
        return None
    lab = features.token_labels(example)
    if lab is None and example.label is False:
        lab = np.zeros(features.token_offsets.shape[0], dtype=np.int8)
    return lab


def token_training_set(
    features: Sequence[Features], examples: Sequence[RAGExample]
) -> tuple[list[int], list[np.ndarray], list[np.ndarray]]:
    """The answers with token features and known token labels (:func:`known_token_labels`):
    their indices, token feature matrices and token labels."""
    idx, xs, ys = [], [], []
    for i, (f, ex) in enumerate(zip(features, examples, strict=True)):
        if f.tokens is None:
            continue
        lab = known_token_labels(f, ex)
        if lab is not None:
            idx.append(i)
            xs.append(f.tokens)
            ys.append(lab)
    return idx, xs, ys
