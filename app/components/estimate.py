"""Time, said before and during an action: the estimate (:mod:`app.state.estimates`) in
words above its button, and a progress bar that counts what is done and the time left.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import streamlit as st

from app.state.estimates import PacePending, deferred_timing, timing
from app.text import md
from core.base.errors import RagscopeError
from core.base.words import plural
from core.pipeline.extract import WorkEstimate

if TYPE_CHECKING:
    from streamlit.delta_generator import DeltaGenerator

FEW_SECONDS = 5.0
"""Below this an estimate says "a few seconds"."""


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``1 h 20 min``."""
    s = max(0, int(math.ceil(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    return f"{s // 3600} h {(s % 3600) // 60} min"


def describe_work(
    est: WorkEstimate,
    *,
    what: str = "answers",
    extra: str = "",
    kept: str = "the feature cache",
    reread: bool = True,
) -> str:
    """The estimate in words (Markdown). ``extra`` names what :attr:`fixed_seconds`
    is (e.g. "the new answer's generation"); ``kept``, where what was read is kept;
    ``reread``: later runs read it back from there (say so)."""
    n = est.n_examples
    plus = f", plus about {format_seconds(est.fixed_seconds)} for {extra}" if extra else ""
    if est.n_to_trace == 0:
        total = est.seconds
        head = "a few seconds" if total < FEW_SECONDS else f"about {format_seconds(total)}"
        return (
            f"Estimated time on this machine: **{head}**: the features of all {n} {what} "
            f"are in {kept}{_kept_part(est)}{plus}."
        )
    if not est.known:
        return (
            "Estimated time: unknown (one of the answers could not be timed here); the "
            "bar below says the time left once the first is done."
        )
    cached = f"; {est.n_cached} already in {kept}{_kept_part(est)}" if est.n_cached else ""
    head = "a few seconds" if est.seconds < FEW_SECONDS else f"about {format_seconds(est.seconds)}"
    return (
        f"Estimated time on this machine: **{head}**: {est.n_to_trace} of {n} {what} to "
        f"trace at about {est.seconds_per_example:.1f} s each (paced on this machine)"
        f"{cached}{plus}." + (f" Later runs read them from {kept}." if reread else "")
    )


def _kept_part(est: WorkEstimate) -> str:
    """What the examples already kept add (at the pace the last such action here
    measured), when it is worth saying."""
    if est.kept_seconds < FEW_SECONDS:
        return ""
    return f" (about {format_seconds(est.kept_seconds)} to read back and use)"


def estimate_caption(
    compute: Callable[[], WorkEstimate],
    *,
    what: str = "answers",
    extra: str = "",
    kept: str = "the feature cache",
    reread: bool = True,
    where: DeltaGenerator | None = None,
) -> WorkEstimate | None:
    """``compute()``'s estimate as a caption, in ``where`` (e.g. an ``st.empty()`` put
    above the action's button before the button was drawn: a pace still to be timed then
    never keeps the button from showing); a failure to estimate is said in the caption
    (the action itself reports its own error). Pages skip it on the run their button
    starts the action: the progress bar says the time left then. A pace no action here
    has recorded yet is timed on a background thread: the caption says so and the page
    runs again when it is done (:func:`app.state.estimates.deferred_timing`), so a page
    never waits for its estimate."""
    box = where if where is not None else st
    try:
        with deferred_timing():  # a pace still to time is timed in the background
            est = compute()
    except PacePending as p:
        with box.container(key=f"{TIMING_KEY}-{next(_TIMING_IDS)}"):
            _timing_caption(p.key)
        return None
    except RagscopeError as e:
        box.caption(f"No time estimate: {md(e)}")
        return None
    box.caption(describe_work(est, what=what, extra=extra, kept=kept, reread=reread))
    if est.memory is not None:  # a long input's memory, before the click (issue 68)
        box.caption(est.memory)
    return est


TIMING_KEY = "rs-estimate-timing"
"""The key prefix of a caption's container while it waits for a background timing: the
page shows it as a CSS class ``st-key-rs-estimate-timing-<n>`` (browser tests wait until
none is left, ``tools.browser.TIMING_CLASS``); ``<n>`` keeps two such captions of one
page apart."""
_TIMING_IDS = itertools.count()

TIMING_POLL_S = 2.0
"""How often a page waiting for a background timing looks whether it is done."""

TIMING_NOTE = (
    "Estimated time: timing one answer on this machine in the background; the page is "
    "ready meanwhile and the estimate appears here when the timing is done (an action "
    "started now waits for that answer first)."
)


@st.fragment(run_every=TIMING_POLL_S)
def _timing_caption(key: str) -> None:
    """:data:`TIMING_NOTE` until the background timing of ``key`` ends, then the page
    runs again and says the estimate (a fragment: only this caption reruns meanwhile)."""
    if not timing(key):
        st.rerun()
    st.caption(TIMING_NOTE)


def time_left(done: int, total: int, elapsed: float) -> str:
    """`` · about 40 s left`` after ``done`` of ``total`` in ``elapsed`` seconds (empty
    before the first is done or after the last)."""
    if done <= 0 or done >= total:
        return ""
    return f" · about {format_seconds(elapsed / done * (total - done))} left"


@contextmanager
def progress_bar(text: str, step: str | None = None) -> Iterator[Callable[[int, int], None]]:
    """A progress bar while the block runs; yields the ``progress(done, total)`` callback.
    The bar counts what is done and, from the pace so far, the time left.

    Args:
        text: The bar's text before the first example.
        step: What the bar says before ``done / total examples`` (default: ``text``).
    """
    bar = st.progress(0.0, text=text)
    prefix = text if step is None else step
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        left = time_left(done, total, time.perf_counter() - t0)
        of = f"{done} / {total} {plural(total, 'example')}"
        bar.progress(done / max(total, 1), text=f"{prefix} {of}{left}")

    try:
        yield progress
    finally:
        bar.empty()
