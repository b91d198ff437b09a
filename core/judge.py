"""Judge one answer with fitted detectors, one verdict at a time (the Playground's path).

:func:`judge_stream` runs :func:`core.extract.stream_example` (the one shared pass with
the passages, and one without them when a detector asks) and turns each detector's
features into its verdict as soon as they exist, so a page can show the first verdicts
while the rest are computed. Extra needs (the surprisal the Playground colours tokens
by) ride along in the same pass instead of a pass of their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from core.contract import Detector, Verdict, for_dataset
from core.examples import RAGExample
from core.extract import Step, stream_example
from core.model import LoadedModel
from core.trace import Needs, Trace


@dataclass(frozen=True)
class Judged:
    """One step of :func:`judge_stream`.

    Attributes:
        step: The extraction step (a finished pass, or one detector's features).
        verdict: That detector's verdict (``"features"`` steps only).
        seconds: Wall time of the step, the prediction included.
    """

    step: Step
    verdict: Verdict | None
    seconds: float

    @property
    def detector(self) -> str | None:
        return self.step.detector


def judge_stream(
    model: LoadedModel,
    example: RAGExample,
    detectors: Sequence[Detector],
    *,
    extra: Needs | None = None,
    on_trace: Callable[[Trace], None] | None = None,
) -> Iterator[Judged]:
    """Each fitted detector's verdict on ``example``'s answer, as soon as it is ready;
    calibrated for the example's dataset when the detector was trained on it among
    others (:func:`core.contract.for_dataset`), else by its pooled calibration.

    Args:
        extra: Also recorded in the shared pass with the passages (see
            :func:`core.extract.stream_example`).
        on_trace: Called with that pass as soon as it is done.

    Raises:
        DataError: The example cannot be laid out or a detector cannot read it.
        NotFittedError: A detector is not fitted.
    """
    by_name = {d.name: d for d in detectors}
    t0 = time.perf_counter()
    for step in stream_example(model, example, detectors, extra=extra, on_trace=on_trace):
        verdict = None
        if step.stage == "features":
            assert step.detector is not None and step.features is not None
            det = by_name[step.detector]
            verdict = for_dataset(det, det.predict(step.features), example.provenance.dataset)
        now = time.perf_counter()
        yield Judged(step=step, verdict=verdict, seconds=now - t0)
        t0 = time.perf_counter()  # the consumer's own time is not this step's
