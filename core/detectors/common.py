"""What several detectors read the same way: head and layer feature names, and the
per-run PKS matrix shared between ReDeEP and InterpDetect (computed once per run).

Not a detector: detectors import it, never each other (the ensemble goes through the
registry).
"""

from __future__ import annotations

import numpy as np

from core.contract import Run
from core.lens import pks_from_trace
from core.model import LoadedModel


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
        # float32 divergences: 3x faster, error < 1e-6 bits (see core.lens.jsd_bits).
        return pks_from_trace(model, run.trace, final_norm=final_norm, precision="float32")

    return run.shared(("pks", final_norm), compute)
