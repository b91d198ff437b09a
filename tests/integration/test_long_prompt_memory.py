"""A long prompt's peak memory, measured in a subprocess (issue 68): the fast set's trace
of a 2,048-token prompt with a 630-token answer (real passages, chunked) peaks under
the estimate the budget check makes before the work, and far under what keeping every
layer's attention rows would take. The full sizes (1k-8k) are a benchmark:
``ragscope bench --long 1024,2048,4096,8192``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.embedded,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's peak counters"),
]

CHILD = r"""
import json, resource
from core.engine.layout import render
from core.engine.memory import process_bytes
from core.engine.model import load_model
from core.engine.trace import Needs, trace, trace_cost
from core.pipeline.sets import load_set
from core.services.longbench import long_example

model = load_model("embedded")
info = model.info
fast = load_set(info.key, "fast")
needs = Needs.union([n for d in fast.fitted if (n := d.needs(info)) is not None])
layout = render(long_example(model, 2048, "long"), model)
trace(model, render(long_example(model, 128, "short"), model), needs)  # the weights paged in
held = process_bytes()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # loading's own peak
cost = trace_cost(model, [layout], needs)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size starts again from now (Linux 4.0+)
tr = trace(model, layout, needs)
status = open("/proc/self/status").read()
pass_peak = int(status.split("VmHWM:")[1].split()[0]) * 1024
print(json.dumps({
    "tokens": len(layout), "answer": len(layout.response_positions), "held": held,
    "before": before, "pass_peak": pass_peak,
    "estimate": held + cost.total, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "rows": info.n_layers * info.n_heads * len(layout.response_positions) * len(layout) * 4,
    "kinds": sorted({k for k, _ in tr.acts}),
}))
"""


def test_a_long_prompt_peaks_under_its_estimate() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["tokens"] >= 2000 and got["answer"] >= 500
    assert "pattern" not in got["kinds"]  # Lookback Lens reads the sums reduced in the pass
    # The pass never takes the process past the budget check's estimate (its own peak,
    # measured from the pass's start: loading may have peaked higher before it).
    assert got["pass_peak"] <= got["estimate"], got
    assert got["peak"] <= max(got["before"], got["estimate"]), got
    # Keeping every layer's attention rows of the answer would take this much on top.
    assert got["pass_peak"] - got["held"] < got["rows"] / 2, got
