"""How long a page's action will take on this machine, said before it starts
(:mod:`core.pipeline.extract`'s estimating section): the examples whose features are not cached
yet at one pace, and those kept at another (reading them back and the action's own work
on them), both recorded on this machine (``paces`` in the database, for a day).

Each action records its own paces (:func:`paced_extraction`, :func:`paced_read`, keyed by
the action and its detectors): a Review scan that also decides spans, or an Agreement
that judges twelve detectors, is not paced on another page's plain extraction, and the
estimate follows the machine's load. Before an action has run here, the traced pace is
timed on one answer, warm (once per model and detector choice; its features are kept, so
the timing is not lost work).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import streamlit as st

from app.state.datasets import get_store
from app.state.detectors import DetectorSet
from app.state.verdicts import answer_verdicts
from core.base.errors import RagscopeError, brief
from core.base.examples import RAGExample
from core.engine.generate import GenerationConfig, generate
from core.engine.layout import render
from core.explain import read_estimate, time_reading, unread
from core.pipeline.extract import (
    FeatureCache,
    LengthPaces,
    WorkEstimate,
    answer_tokens,
    estimate_extraction,
    example_chars,
    fit_paces,
    learn_paces,
    memory_note,
    time_extraction,
    uncached,
)

if TYPE_CHECKING:
    from core.engine.model import LoadedModel
    from core.learning.contract import Detector
    from core.signals.sae import LoadedSAE
    from core.storage import Store


log = logging.getLogger(__name__)


def detectors_key(detectors: Sequence[Detector]) -> tuple[tuple[str, str], ...]:
    """What a pace is measured for: each detector's name and feature configuration."""
    return tuple((d.name, d.config.feature_hash()) for d in detectors)


def _pace_key(key: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{name}:{h}" for name, h in key)


KEPT = "|kept"
"""The suffix of the key an action's pace per kept example is recorded under (its value
is seconds per example, not per character)."""


def _action_key(action: str | None, key: str) -> str:
    """Where ``action``'s paces are recorded (``None``: plain extraction's, the timed one)."""
    return key if action is None else f"{action}|{key}"


def _recorded(model: LoadedModel, key: str) -> float | None:
    return get_store().get_pace(model=model.instance_key, detectors=key)


class PacePending(Exception):  # noqa: N818 (a state, not an error)
    """No pace is recorded yet for an estimate asked under :func:`deferred_timing`: one
    answer is being timed in the background (:attr:`key`), and the estimate can be said
    once it is done."""

    def __init__(self, key: str) -> None:
        super().__init__(f"timing one answer for {key}")
        self.key = key


@dataclass
class _Timing:
    """One pace being timed, or timed, in this process."""

    thread: threading.Thread | None = None
    pace: float | None = None
    error: RagscopeError | None = None

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


_TIMINGS: dict[tuple[str, str, str], _Timing] = {}
_TIMINGS_LOCK = threading.Lock()
_DEFER: ContextVar[bool] = ContextVar("ragscope_defer_timing", default=False)


@contextlib.contextmanager
def deferred_timing() -> Iterator[None]:
    """Within the block, a pace no action here has recorded yet is timed on a background
    thread (:class:`PacePending` is raised at once) instead of before the page goes on:
    a page draws its estimate when the timing is done (:func:`app.components.estimate.
    estimate_caption`) and never waits for it."""
    token = _DEFER.set(True)
    try:
        yield
    finally:
        _DEFER.reset(token)


def timing(key: str) -> bool:
    """Whether the pace ``key`` (:class:`PacePending`'s) is still being timed here."""
    with _TIMINGS_LOCK:
        return any(k[2] == key and t.running for k, t in _TIMINGS.items())


def settle(timeout: float = 600.0) -> None:
    """Wait for every background timing to end (tests, and the bench, read what a page
    says once its estimate is there)."""
    with _TIMINGS_LOCK:
        threads = [t.thread for t in _TIMINGS.values() if t.thread is not None]
    for th in threads:
        th.join(timeout)


def forget_timings() -> None:
    """Forget every pace timed in this process (as a new process would)."""
    settle()
    with _TIMINGS_LOCK:
        _TIMINGS.clear()


def _recorded_or(
    model: LoadedModel, keys: Sequence[str], time_it: Callable[[Store], float]
) -> float:
    """Seconds per character of some work on the model: the first pace recorded on this
    machine under ``keys`` (the database: the action's last run, else the first timing),
    else one answer timed once per process and database (``time_it``, given the store),
    recorded under the last of ``keys`` (the timed work's own key). Under
    :func:`deferred_timing` the timing runs on a background thread and
    :class:`PacePending` is raised; otherwise it runs here.

    Raises:
        PacePending: Deferred, and not timed yet.
        RagscopeError: The answer could not be timed (said once; not timed again).
    """
    for key in keys:
        known = _recorded(model, key)
        if known is not None:
            return known
    store = get_store()
    where = (model.instance_key, store.path, keys[-1])
    with _TIMINGS_LOCK:
        got = _TIMINGS.get(where)
        if got is None:
            got = _TIMINGS[where] = _Timing()
            if _DEFER.get():
                got.thread = threading.Thread(
                    target=_time_into,
                    args=(got, model, store, keys[-1], time_it),
                    name="ragscope-estimate-timing",
                    daemon=True,
                )
                got.thread.start()
                raise PacePending(keys[-1])
        elif got.running:
            raise PacePending(keys[-1])
    if got.thread is None and got.pace is None and got.error is None:
        _time_into(got, model, store, keys[-1], time_it)
    if got.error is not None:
        raise got.error
    assert got.pace is not None
    store.put_pace(model=model.instance_key, detectors=keys[-1], seconds_per_char=got.pace)
    return got.pace


def _time_into(
    got: _Timing, model: LoadedModel, store: Store, key: str, time_it: Callable[[Store], float]
) -> None:
    """Time one answer (``time_it``) into ``got`` and record its pace under ``key``."""
    try:
        got.pace = time_it(store)
        store.put_pace(model=model.instance_key, detectors=key, seconds_per_char=got.pace)
    except RagscopeError as e:
        got.error = e
    except Exception as e:  # a background thread must not die silently
        log.warning("timing an answer for an estimate failed", exc_info=True)
        got.error = RagscopeError(f"the answer could not be timed ({brief(e)})")


def _pace(
    model: LoadedModel,
    detectors: Sequence[Detector],
    key: tuple[tuple[str, str], ...],
    action: str | None,
    example: RAGExample,
    time_one: Callable[[RAGExample], float] | None,
) -> float:
    """The pace of ``action`` tracing ``key``'s detectors' features: its own last run's,
    else ``time_one(example)`` (the action's own work on one answer), else the timed
    extraction's (:func:`_recorded_or`)."""
    plain = _pace_key(key)
    where = _action_key(action, plain)
    if time_one is not None:
        return _recorded_or(model, [where], lambda _store: time_one(example))
    return _recorded_or(
        model,
        [where, plain],
        lambda store: time_extraction(model, example, detectors, FeatureCache(store)),
    )


PROMPT, RESPONSE = "|prompt", "|response"
"""Suffixes of the keys an action's :class:`~core.pipeline.extract.LengthPaces` are
recorded under (seconds per prompt character, per answer character)."""


class Pacer:
    """What a timed block hands its action: :meth:`ticking` wraps the action's progress
    callback, so each example's own time is known when the block ends."""

    def __init__(self) -> None:
        self.ticks: list[tuple[int, float]] = []

    def ticking(self, progress: Callable[[int, int], None]) -> Callable[[int, int], None]:
        """``progress``, also noting when each example was done."""

        def tick(done: int, total: int) -> None:
            self.ticks.append((done, time.perf_counter()))
            progress(done, total)

        return tick

    def durations(self, t0: float, n: int) -> list[float] | None:
        """Each of ``n`` examples' time, in the order done, when the action said each
        once (``None`` otherwise)."""
        if [d for d, _ in self.ticks] != list(range(1, n + 1)):
            return None
        times = [t0, *(t for _, t in self.ticks)]
        return [b - a for a, b in zip(times, times[1:], strict=False)]


@contextlib.contextmanager
def _recording(
    model: LoadedModel, key: str, examples: Sequence[RAGExample], todo: Sequence[RAGExample]
) -> Iterator[Pacer]:
    """Times the block, which reads ``examples`` (``todo`` of them not kept yet), and
    records under ``key`` the paces its time measures when it ends normally: the next
    estimate is paced on this action, not on one answer timed earlier under another load.
    The whole block's time gives the pace per character traced and per kept example
    (:func:`core.pipeline.extract.learn_paces`); when the action told each example's end
    (:meth:`Pacer.ticking`), the kept examples' own times give the kept pace, and the
    traced ones' the paces of prompt and answer characters apart
    (:func:`core.pipeline.extract.fit_paces`)."""
    pacer = Pacer()
    t0 = time.perf_counter()
    yield pacer
    store = get_store()

    def put(suffix: str, value: float | None) -> None:
        if value is not None:
            store.put_pace(model=model.instance_key, detectors=key + suffix, seconds_per_char=value)

    per_char, per_kept = learn_paces(
        time.perf_counter() - t0,
        traced_chars=sum(example_chars(e) for e in todo),
        n_kept=len(examples) - len(todo),
        kept_pace=_recorded(model, key + KEPT),
    )
    each = pacer.durations(t0, len(examples))
    if each is not None:
        traced = {id(e) for e in todo}
        kept = [d for e, d in zip(examples, each, strict=True) if id(e) not in traced]
        per_kept = sum(kept) / len(kept) if kept else per_kept
        fit = fit_paces(
            [d for e, d in zip(examples, each, strict=True) if id(e) in traced], list(todo)
        )
        if fit is not None:
            put(PROMPT, fit.prompt)
            put(RESPONSE, fit.response)
    put("", per_char)
    put(KEPT, per_kept)


def _length_paces(model: LoadedModel, key: str) -> LengthPaces | None:
    """The prompt and answer paces ``key``'s action last measured, if it did."""
    prompt, response = _recorded(model, key + PROMPT), _recorded(model, key + RESPONSE)
    if prompt is None or response is None:
        return None
    return LengthPaces(prompt=prompt, response=response)


def paced_extraction(
    model: LoadedModel,
    examples: Sequence[RAGExample],
    detectors: Sequence[Detector],
    *,
    action: str,
) -> contextlib.AbstractContextManager[Pacer]:
    """A block in which ``action`` reads ``detectors``' features of ``examples`` (and does
    its own work on them), timed: its paces replace the ones recorded for ``action``
    (:func:`work_estimate` with the same ``action`` reads them next)."""
    todo = uncached(FeatureCache(get_store()), model.info.key, examples, detectors)
    key = _action_key(action, _pace_key(detectors_key(detectors)))
    return _recording(model, key, examples, todo)


def work_estimate(
    model: LoadedModel,
    examples: Sequence[RAGExample],
    detectors: Sequence[Detector],
    *,
    action: str | None = None,
    time_one: Callable[[RAGExample], float] | None = None,
    fixed_seconds: float = 0.0,
) -> WorkEstimate:
    """How long ``action`` (a :func:`paced_extraction` block; ``None``: extraction alone,
    e.g. a training job's) on ``examples`` with ``detectors`` will take here. Before the
    action has run here, ``time_one`` (seconds per character of the action's own work on
    one answer, e.g. :func:`core.pipeline.judge.time_judging`) paces it, else extracting
    one answer's features does.

    Raises:
        DataError: The example timed cannot be laid out or a detector cannot read it.
        ModelError: A detector cannot run on this model.
    """
    key = detectors_key(detectors)
    where = _action_key(action, _pace_key(key))
    cache = FeatureCache(get_store())
    est = estimate_extraction(
        model.info.key,
        examples,
        detectors,
        cache,
        lambda ex: _pace(model, detectors, key, action, ex, time_one),
        kept_pace=_recorded(model, where + KEPT) or 0.0,
        fixed_seconds=fixed_seconds,
    )
    return _by_lengths(
        model, where, est, lambda: uncached(cache, model.info.key, examples, detectors)
    )


def _by_lengths(
    model: LoadedModel, key: str, est: WorkEstimate, todo: Callable[[], list[RAGExample]]
) -> WorkEstimate:
    """``est`` with its traced part at the prompt and answer paces ``key``'s action
    measured (:func:`_length_paces`), when it did."""
    paces = _length_paces(model, key)
    if paces is None or not est.chars_to_trace:
        return est
    return replace(est, seconds_per_char=paces.seconds(todo()) / est.chars_to_trace)


def _sae_key(sae: LoadedSAE, activation: str) -> str:
    return f"sae:{sae.key}:{activation}"


def _read_pace(model: LoadedModel, sae: LoadedSAE, key: str, example: RAGExample) -> float:
    """The pace of reading SAE activations (``key``: the SAE and activation;
    :func:`_recorded_or`)."""
    activation = key.rsplit(":", 1)[1]
    return _recorded_or(
        model,
        [key],
        lambda _store: time_reading(model, sae, example, activation),  # type: ignore[arg-type]
    )


def paced_read(
    model: LoadedModel, sae: LoadedSAE, examples: Sequence[RAGExample], activation: str
) -> contextlib.AbstractContextManager[Pacer]:
    """A block that reads ``sae``'s activations of ``examples``, timed: its pace replaces
    the recorded one (:func:`sae_read_estimate` reads it next)."""
    todo = unread(model, sae, examples, activation)  # type: ignore[arg-type]
    return _recording(model, _sae_key(sae, activation), examples, todo)


def sae_read_estimate(
    model: LoadedModel, sae: LoadedSAE, examples: Sequence[RAGExample], activation: str
) -> WorkEstimate:
    """How long reading ``sae``'s activations of ``examples`` will take here (those not
    read in this process yet, at the measured pace).

    Raises:
        RagscopeError: The answer timed cannot be laid out or run.
    """
    key = _sae_key(sae, activation)
    est = read_estimate(
        model,
        sae,
        examples,
        activation=activation,  # type: ignore[arg-type]
        pace=lambda ex: _read_pace(model, sae, key, ex),
        kept_pace=_recorded(model, key + KEPT) or 0.0,
    )
    est = _by_lengths(
        model,
        key,
        est,
        lambda: unread(model, sae, examples, activation),  # type: ignore[arg-type]
    )
    shown = _recorded(model, key + SHOWN)
    return replace(est, fixed_seconds=len(examples) * shown) if shown else est


SHOWN = "|shown"
"""The suffix of the key the pace of showing what a read found is recorded under
(seconds per answer read: the page's work after the read, which grows with them)."""


def record_shown(
    model: LoadedModel, sae: LoadedSAE, activation: str, n_answers: int, seconds: float
) -> None:
    """The time the page took to show what a read of ``n_answers`` answers found (the
    features' top answers and their cards) replaces the recorded pace of it:
    :func:`sae_read_estimate` adds it to the read's."""
    if n_answers > 0 and seconds > 0:
        get_store().put_pace(
            model=model.instance_key,
            detectors=_sae_key(sae, activation) + SHOWN,
            seconds_per_char=seconds / n_answers,
        )


PACE_ANSWER = RAGExample(
    id="pace",
    question="Who built the bridge, and when?",
    passages=("Ada Lovell built the stone bridge over the river in 1820.",),
    response="Ada Lovell built it in 1820.",
)
"""A short answer whose decoding times the model's steps."""

PACE_TOKENS = 8
"""Tokens generated to time a step."""


@st.cache_data(show_spinner="Timing the model's decoding on this machine…", max_entries=8)
def _decode_pace(_model: LoadedModel, instance_key: str) -> float:
    """Seconds per generated token (greedy, a short prompt; the second run, the first
    warms the caches up)."""
    cfg = GenerationConfig(max_new_tokens=PACE_TOKENS)
    generate(_model, PACE_ANSWER, cfg)
    out = generate(_model, PACE_ANSWER, cfg)
    return out.seconds / max(len(out.token_ids), 1)


def generation_seconds(
    model: LoadedModel, max_new_tokens: int, like: RAGExample | None = None
) -> float:
    """About how long generating a new answer takes here: as many tokens as ``like``'s
    answer has (a regenerated answer is usually about as long as the one it replaces),
    at most ``max_new_tokens``; without ``like``, ``max_new_tokens`` of them."""
    tokens = max_new_tokens
    if like is not None:
        try:
            n = int(render(like, model).response_offsets.shape[0])
        except RagscopeError:
            n = max_new_tokens
        tokens = min(max_new_tokens, max(n, PACE_TOKENS))
    return tokens * _decode_pace(model, model.instance_key)


def answer_estimate(
    model: LoadedModel,
    example: RAGExample,
    shipped: DetectorSet,
    n_answers: int,
    *,
    action: str,
    time_one: Callable[[RAGExample], float] | None = None,
    fixed_seconds: float = 0.0,
) -> WorkEstimate:
    """How long ``action`` judging ``n_answers`` answers the size of ``example``'s with
    the whole set takes here (e.g. the original and an edited version), from the
    answer's tokens (:func:`core.pipeline.extract.answer_tokens`: judging grows with
    them, the lens products most) at the seconds per answer token of ``action``'s last
    run here (:func:`record_answers`), else of ``time_one(example)`` (the seconds of the
    action's own work on one answer, timed once per model and process), else of the
    set's own verdict on ``example`` (:func:`~app.state.verdicts.answer_verdicts`: shared
    with the Playground and every page, so usually known already; else judged now, and
    kept). The estimate counts answer tokens where its other uses count characters.

    Raises:
        PacePending: Under :func:`deferred_timing`, while the pace is timed.
        DataError: The example cannot be laid out for the detectors.
        ModelError: A detector cannot run.
    """
    tokens = answer_tokens(model, example)
    key = _answers_key(shipped, action)
    pace = _recorded(model, key)
    if pace is None:
        work = (
            (lambda: time_one(example))
            if time_one is not None
            else (lambda: answer_verdicts(model, example, shipped).seconds)
        )
        pace = _recorded_or(model, [key], lambda _store: work() / tokens)
    return WorkEstimate(
        n_examples=n_answers,
        n_cached=0,
        chars_to_trace=n_answers * tokens,
        seconds_per_char=pace,
        fixed_seconds=fixed_seconds,
        memory=memory_note(model, example, shipped.for_example(example).fitted),
    )


ANALYSE = "analyse"
"""The Playground's Analyse, as an action whose pace is recorded."""


def _answers_key(shipped: DetectorSet, action: str) -> str:
    """Where ``action``'s seconds per answer token with ``shipped`` are recorded: by the
    features its detectors read, so a set adapted from it (the same features, other
    calibrations) reuses the pace instead of timing an answer again."""
    return f"{action}|tokens|{_pace_key(detectors_key(shipped.fitted))}"


def record_answers(
    model: LoadedModel,
    shipped: DetectorSet,
    action: str,
    examples: Sequence[RAGExample],
    seconds: float,
) -> None:
    """The pace of one run of ``action`` (the set judging ``examples`` and the page's
    own work on them, measured end to end: an Analyse, a Compare), in seconds per answer
    token, replaces the recorded one: the next estimate of ``action`` reads it."""
    tokens = sum(answer_tokens(model, e) for e in examples)
    if tokens and seconds > 0:
        get_store().put_pace(
            model=model.instance_key,
            detectors=_answers_key(shipped, action),
            seconds_per_char=seconds / tokens,
        )


def answers_seconds(
    model: LoadedModel, shipped: DetectorSet, action: str, examples: Sequence[RAGExample]
) -> float | None:
    """How long ``action`` on ``examples`` will take here, from their answer tokens at the
    pace of its last run (:func:`record_answers`); ``None`` before any (nothing is timed
    just to estimate)."""
    pace = _recorded(model, _answers_key(shipped, action))
    return None if pace is None else pace * sum(answer_tokens(model, e) for e in examples)
