"""Batch feature extraction: one traced pass per example for all detectors together.

For each example the engine renders the layout once, takes the union of the
needs of every detector whose features are not cached yet, runs ONE forward
pass (plus one no-context pass when some detector asks for it), and hands
the same traces to each detector. Features are written to the cache as soon
as an example is done, keyed by (model key, example content hash, detector
name + config hash), so an interrupted run resumes where it stopped and a
repeated evaluation recomputes nothing. With ``batch_size`` > 1 several examples
share each forward pass (right-padded, :func:`core.engine.trace.trace_batch`); features
equal the one-at-a-time ones up to float rounding.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from scipy.optimize import nnls

from core.base.errors import DataError
from core.base.examples import RAGExample, example_hash
from core.engine.layout import Layout, render
from core.engine.memory import MemoryBudgetError, TraceCost, describe_cost
from core.engine.model import LoadedModel
from core.engine.trace import CHUNK_ABOVE, Needs, Trace, trace_batch, trace_cost
from core.learning.contract import Detector, Features, Run
from core.storage import Store

Progress = Callable[[int, int], None]
"""Callback ``(done, total)`` after each example."""


class FeatureCache:
    """Features stored in the analyses table of a :class:`~core.storage.Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def _key(detector: Detector) -> tuple[str, str]:
        return detector.name, detector.config.feature_hash()

    def get(
        self,
        model_key: str,
        example: RAGExample,
        detector: Detector,
        response_offsets: Callable[[], np.ndarray | None] | None = None,
    ) -> Features | None:
        """The cached features, or ``None`` for a miss. An entry that cannot be this
        example's (a damaged or foreign payload, another detector's or model's features,
        offsets outside the response or, given ``response_offsets``, other tokens than
        the example's under the model) is a miss too: recomputed and overwritten, never
        used. Entries a feature store brought in are checked here against the example
        they are used for.

        Args:
            response_offsets: Gives the example's response token offsets under the model,
                called only when an entry is stored (``None`` from it: the example cannot
                be laid out, so nothing stored can be its features).
        """
        name, cfg = self._key(detector)
        rec = self.store.get_analysis(
            example_hash=example_hash(example), model=model_key, detector=name, config_hash=cfg
        )
        if rec is None or not isinstance(rec.result, bytes):
            return None
        expected = response_offsets() if response_offsets is not None else None
        if response_offsets is not None and expected is None:
            return None
        try:
            feats = Features.from_bytes(rec.result, example_id=example.id)
            feats.check_fits(example, expected)
        except DataError:
            return None  # a damaged entry is recomputed (and overwritten) like a miss
        if feats.detector != name or feats.model != model_key:
            return None
        return feats

    def has(self, model_key: str, example_key: str, detector: Detector) -> bool:
        """Whether an entry is stored for the example whose :func:`example_hash` is
        ``example_key`` (not read, so not checked: :meth:`get` may still call it a miss)."""
        name, cfg = self._key(detector)
        return self.store.has_analysis(
            example_hash=example_key, model=model_key, detector=name, config_hash=cfg
        )

    def stored(self, model_key: str, example_keys: Sequence[str], detector: Detector) -> set[str]:
        """Which of ``example_keys`` (:func:`example_hash`) have an entry stored (not read):
        :meth:`has` for many examples at once."""
        name, cfg = self._key(detector)
        return self.store.stored_hashes(
            example_hashes=example_keys, model=model_key, detector=name, config_hash=cfg
        )

    def put(self, model_key: str, example: RAGExample, detector: Detector, feats: Features) -> None:
        name, cfg = self._key(detector)
        self.store.put_analysis(
            example_hash=example_hash(example),
            model=model_key,
            detector=name,
            config_hash=cfg,
            result=feats.to_bytes(),
            dataset=example.provenance.dataset,
            example_id=example.id,
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class Extraction:
    """Features of many examples for several detectors.

    Attributes:
        examples: The examples that were extracted, in input order (failed ones left out).
        features: Detector name -> one :class:`Features` per example, aligned with ``examples``.
        errors: One error per example that could not be analysed (``on_error="skip"``).
        cache_hits: Examples whose features all came from the cache.
        computed: Examples that needed a forward pass or feature computation.
        seconds: Wall time.
    """

    examples: tuple[RAGExample, ...]
    features: Mapping[str, tuple[Features, ...]]
    errors: tuple[DataError, ...]
    cache_hits: int
    computed: int
    seconds: float

    @property
    def examples_per_minute(self) -> float:
        return 60.0 * len(self.examples) / self.seconds if self.seconds > 0 else float("inf")


def plain_detectors(detectors: Sequence[Detector]) -> list[Detector]:
    """The detectors that read the model: the plain ones and every composite's members.

    A member shares the features of a detector of the same name in the batch when
    their feature configs agree.

    Raises:
        DataError: A member has the name of another detector in the batch but not its
            feature config.
    """
    flat: dict[str, Detector] = {}

    def add(d: Detector) -> None:
        name = d.name
        have = flat.get(name)
        if have is None:
            flat[name] = d
        elif have.config.feature_hash() != d.config.feature_hash():
            raise DataError(
                f"two {name} detectors with different feature options in one run (one of "
                "them an ensemble member); give the ensemble the same member options"
            )

    for d in detectors:
        if not d.composite:
            add(d)
    for d in detectors:
        if d.composite:
            for m in d.member_detectors():
                add(m)
    return list(flat.values())


def _compose(
    detectors: Sequence[Detector], got: Mapping[str, Features], model_key: str, example_id: str
) -> dict[str, Features]:
    """Every requested detector's features: plain ones as read, composites bundled."""
    out = {}
    for d in detectors:
        name = d.name
        if d.composite:
            out[name] = d.bundle(example_id, model_key, got)
        else:
            out[name] = got[name]
    return out


def run_example(
    model: LoadedModel, example: RAGExample, detectors: Sequence[Detector]
) -> dict[str, Features]:
    """Trace one example once for all ``detectors`` and return their features.

    Composite detectors (the ensemble) get their members' features bundled; each
    member is computed once, shared with a detector of the same name in the batch.
    """
    got = run_examples(model, [example], detectors)[0]
    if isinstance(got, DataError):
        raise got
    return got


@dataclass(frozen=True)
class Step:
    """One step of :func:`stream_example`.

    Attributes:
        stage: ``"trace"`` (the pass with the passages is done), ``"bare"`` (the
            no-context pass is done) or ``"features"`` (a requested detector's features).
        seconds: Wall time of this step.
        detector: The detector whose features these are (``"features"`` steps).
        features: Its features (``"features"`` steps).
    """

    stage: Literal["trace", "bare", "features"]
    seconds: float
    detector: str | None = None
    features: Features | None = None


def stream_example(
    model: LoadedModel,
    example: RAGExample,
    detectors: Sequence[Detector],
    *,
    extra: Needs | None = None,
    on_trace: Callable[[Trace], None] | None = None,
) -> Iterator[Step]:
    """:func:`run_example`, one detector at a time: each requested detector's features
    are yielded as soon as what it reads exists, so a page can show a verdict while
    the others are still being computed. The order: detectors that read no
    activations (before any forward pass), the pass with the passages, the detectors
    that read only it, the no-context pass (when one is asked for), the rest, and each
    composite as soon as all its members are done. The traces are the same ONE pass
    (and one no-context pass) :func:`run_example` runs, so the features are equal.

    Args:
        extra: Also recorded in the pass with the passages (e.g. the logits a page
            shows), handed to ``on_trace`` with everything else before any detector
            that reads the pass.
        on_trace: Called with the pass with the passages as soon as it is done.

    Raises:
        DataError: The example cannot be laid out or a detector cannot read it.
    """
    flat = plain_detectors(detectors)
    needs = {d.name: d.needs(model.info) for d in flat}
    bare_needs = [
        b
        for d in flat
        if d.needs_bare and needs[d.name] and (b := d.bare_needs(model.info)) is not None
    ]
    layout = render(example, model)
    run = Run(example=example, layout=layout, trace=None, bare=None, model=model.info, loaded=model)
    wanted = {d.name for d in detectors}
    got: dict[str, Features] = {}
    sent: set[str] = set()

    def compute(group: Sequence[Detector]) -> Iterator[Step]:
        for d in group:
            t0 = time.perf_counter()
            got[d.name] = d.features(run)
            if d.name in wanted:
                sent.add(d.name)
                yield Step("features", time.perf_counter() - t0, d.name, got[d.name])
            yield from composites()

    def composites() -> Iterator[Step]:
        for d in detectors:
            members = [m.name for m in d.member_detectors()] if d.composite else []
            if d.composite and d.name not in sent and all(m in got for m in members):
                t0 = time.perf_counter()
                feats = d.bundle(example.id, model.info.key, got)
                sent.add(d.name)
                yield Step("features", time.perf_counter() - t0, d.name, feats)

    without = [d for d in flat if needs[d.name] is None and not d.needs_bare]
    yield from compute(without)
    full_needs = [n for n in needs.values() if n is not None] + ([extra] if extra else [])
    if full_needs:
        t0 = time.perf_counter()
        run = replace(run, trace=trace_batch(model, [layout], Needs.union(full_needs))[0])
        assert run.trace is not None
        if on_trace is not None:
            on_trace(run.trace)
        yield Step("trace", time.perf_counter() - t0)
    yield from compute([d for d in flat if d not in without and not d.needs_bare])
    later = [d for d in flat if d not in without and d.needs_bare]
    if later:
        t0 = time.perf_counter()
        bare = (
            trace_batch(
                model, [render(example, model, with_context=False)], Needs.union(bare_needs)
            )[0]
            if bare_needs
            else None
        )
        run = replace(run, bare=bare)  # the memo travels with it
        yield Step("bare", time.perf_counter() - t0)
        yield from compute(later)
    yield from composites()


def example_cost(
    model: LoadedModel,
    example: RAGExample,
    detectors: Sequence[Detector],
    *,
    extra: Needs | None = None,
) -> TraceCost:
    """The memory :func:`run_example` (and :func:`iter_run`) of ``example`` with
    ``detectors`` will add (:func:`core.engine.trace.trace_cost`): the pass with the
    passages, and the no-context pass run while it is kept.

    Raises:
        DataError: The example cannot be laid out.
    """
    flat = plain_detectors(detectors)
    needs = [n for d in flat if (n := d.needs(model.info)) is not None]
    bare = [
        b
        for d in flat
        if d.needs_bare and d.needs(model.info) and (b := d.bare_needs(model.info)) is not None
    ]
    full = [*needs, *([extra] if extra else [])]
    layout = render(example, model)
    cost = (
        trace_cost(model, [layout], full)
        if full
        else TraceCost(tokens=len(layout), kept=0, attention=0, cache=0, features=0)
    )
    if bare:
        cost = cost + trace_cost(model, [render(example, model, with_context=False)], bare)
    return cost


LENGTH_SLACK = 1.25
"""Answers traced in one padded pass are at most this factor apart in length (the
longest's tokens over the shortest's), so no pass pads a short prompt to a long one."""


def length_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Indices of ``lengths`` grouped for padded passes (issue 68): by length, shortest
    first; a long prompt (over :data:`core.engine.trace.CHUNK_ABOVE` tokens, traced in
    chunks) alone; the others together while the longest is within
    :data:`LENGTH_SLACK` of the group's shortest."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda k: lengths[k]):
        n = lengths[i]
        first = lengths[groups[-1][0]] if groups else 0
        if groups and max(n, first) <= CHUNK_ABOVE and n <= LENGTH_SLACK * first:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _trace_fitting(
    model: LoadedModel, layouts: Sequence[Layout], needs: Needs
) -> list[Trace | DataError]:
    """:func:`~core.engine.trace.trace_batch` of ``layouts``, halved until each pass
    fits the memory budget; a layout that does not fit alone gets the refusal
    (:class:`~core.engine.memory.MemoryBudgetError`) as its outcome, the others their
    traces."""
    try:
        return list(trace_batch(model, layouts, needs))
    except MemoryBudgetError as e:
        if len(layouts) == 1:
            return [e]
        half = len(layouts) // 2
        return [
            *_trace_fitting(model, layouts[:half], needs),
            *_trace_fitting(model, layouts[half:], needs),
        ]


def memory_note(
    model: LoadedModel, example: RAGExample, detectors: Sequence[Detector]
) -> str | None:
    """What judging ``example`` with ``detectors`` will take in memory, in words, when
    the input is long or over the budget (:func:`example_cost`,
    :func:`core.engine.memory.describe_cost`); ``None`` otherwise, or when the example
    cannot be laid out (the action says why)."""
    try:
        return describe_cost(example_cost(model, example, detectors))
    except DataError:
        return None


def run_examples(
    model: LoadedModel, examples: Sequence[RAGExample], detectors: Sequence[Detector]
) -> list[dict[str, Features] | DataError]:
    """:func:`run_example` for several examples, traced together in one batched pass
    (:func:`core.engine.trace.trace_batch`; and one for the no-context layouts when a detector
    needs them), grouped by length (:func:`length_groups`: a pass never pads a short
    prompt to a long one, and a batch over the memory budget is halved). Returns, per
    example in order, its features or the :class:`DataError` that example raised (a bad
    example, or one too large for the budget, never sinks the others)."""
    flat = plain_detectors(detectors)
    needs = [d.needs(model.info) for d in flat]
    wanted = [n for n in needs if n is not None]
    # A detector may ask for less in the no-context pass (``bare_needs``; CORTEX
    # needs only hidden states there) than in the pass with the passages.
    bare_needs = [
        b
        for d, n in zip(flat, needs, strict=True)
        if d.needs_bare and n and (b := d.bare_needs(model.info)) is not None
    ]
    out: list[dict[str, Features] | DataError | None] = [None] * len(examples)
    ready: list[tuple[int, Layout, Layout | None]] = []
    for i, ex in enumerate(examples):
        try:
            layout = render(ex, model)
            bare_layout = render(ex, model, with_context=False) if bare_needs else None
        except DataError as e:
            out[i] = e
            continue
        ready.append((i, layout, bare_layout))
    for group in length_groups([len(lay) for _, lay, _ in ready]):
        members = [ready[g] for g in group]
        fulls: list[Trace | DataError | None] = [None] * len(members)
        if wanted:
            fulls = list(_trace_fitting(model, [lay for _, lay, _ in members], Needs.union(wanted)))
        bares: list[Trace | DataError | None] = [None] * len(members)
        if bare_needs:
            bare_layouts = [b for _, _, b in members if b is not None]
            bares = list(_trace_fitting(model, bare_layouts, Needs.union(bare_needs)))
        for (i, layout, _), full, bare in zip(members, fulls, bares, strict=True):
            ex = examples[i]
            if isinstance(full, DataError) or isinstance(bare, DataError):
                out[i] = full if isinstance(full, DataError) else bare  # type: ignore[assignment]  # one of the two is the error
                continue
            run = Run(
                example=ex, layout=layout, trace=full, bare=bare, model=model.info, loaded=model
            )
            try:
                got = {d.name: d.features(run) for d in flat}
            except DataError as e:
                out[i] = e
                continue
            out[i] = _compose(detectors, got, model.info.key, ex.id)
    done = [o for o in out if o is not None]
    assert len(done) == len(out)
    return done


@dataclass(frozen=True)
class Extracted:
    """One example's outcome in :func:`iter_features`.

    Attributes:
        example: The example.
        features: Every requested detector's features by name (``None`` when it failed).
        computed: Whether anything was traced (``False``: all read from the cache).
        error: Why it failed (``None`` when it did not).
    """

    example: RAGExample
    features: dict[str, Features] | None
    computed: bool
    error: DataError | None = None


DEFAULT_BATCH_SIZE: dict[str, int] = {"cpu": 1, "cuda": 8}
"""Examples per traced forward pass by device kind. On CPU one at a time: measured on a
2-core machine (``ragscope bench --extraction 8 --dataset shared:ragtruth_qa_dev
--batch-sizes 2,4 --ray-actors 2``, 12 answers of 579 tokens, all 12 detectors) batches
of 2 and 4 ran at 0.99x the speed of one at a time and a local Ray with two one-thread
actors at 1.05x, start-up included: the CPU is compute-bound either way, and one at a
time holds the least memory. On CUDA, batches fill the device."""


def default_batch_size(device: str) -> int:
    """The batch size :func:`iter_features` uses on ``device`` unless told otherwise."""
    return DEFAULT_BATCH_SIZE.get(device.split(":")[0], 1)


def iter_features(
    model: LoadedModel,
    examples: Iterable[RAGExample],
    detectors: Sequence[Detector],
    *,
    cache: FeatureCache | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    batch_size: int | None = None,
) -> Iterator[Extracted]:
    """Each example's features for every detector, in order (nothing is held back
    beyond one batch: an extraction over thousands of answers needs the memory of
    ``batch_size`` examples). Cached features are read; the missing ones come from
    traced passes (``batch_size`` examples per forward pass, :func:`run_examples`;
    default :func:`default_batch_size` of the model's device) and are written to the
    cache at once, so a stopped run resumes where it stopped."""
    names = [d.name for d in detectors]
    if len(set(names)) != len(names):
        raise DataError(f"detector names repeat: {names}")
    if batch_size is None:
        batch_size = default_batch_size(model.device)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batch: list[RAGExample] = []
    for ex in examples:
        batch.append(ex)
        if len(batch) == batch_size:
            yield from _extract_batch(model, batch, detectors, cache, on_error)
            batch = []
    if batch:
        yield from _extract_batch(model, batch, detectors, cache, on_error)


def _response_offsets(model: LoadedModel, example: RAGExample) -> np.ndarray | None:
    """The example's response tokens under ``model`` (``None``: it cannot be laid out,
    so nothing cached can be its features)."""
    try:
        return render(example, model).response_offsets
    except DataError:
        return None


def _extract_batch(
    model: LoadedModel,
    examples: Sequence[RAGExample],
    detectors: Sequence[Detector],
    cache: FeatureCache | None,
    on_error: Literal["raise", "skip"],
) -> Iterator[Extracted]:
    key = model.info.key
    flat = plain_detectors(detectors)
    got: list[dict[str, Features]] = [{} for _ in examples]
    if cache is not None:
        for i, ex in enumerate(examples):
            offsets = functools.cache(functools.partial(_response_offsets, model, ex))
            for d in flat:  # the example is laid out once, at its first stored entry
                f = cache.get(key, ex, d, offsets)
                if f is not None:
                    got[i][d.name] = f
    # Examples missing the same detectors are traced together.
    groups: dict[tuple[str, ...], list[int]] = {}
    for i in range(len(examples)):
        missing = tuple(d.name for d in flat if d.name not in got[i])
        if missing:
            groups.setdefault(missing, []).append(i)
    errors: dict[int, DataError] = {}
    for missing, idx in groups.items():
        dets = [d for d in flat if d.name in missing]
        results = run_examples(model, [examples[i] for i in idx], dets)
        for i, res in zip(idx, results, strict=True):
            if isinstance(res, DataError):
                if on_error == "raise":
                    raise res
                errors[i] = res
                continue
            if cache is not None:
                for d in dets:
                    cache.put(key, examples[i], d, res[d.name])
            got[i].update(res)
    computed = {i for idx in groups.values() for i in idx}
    for i, ex in enumerate(examples):
        if i in errors:
            yield Extracted(example=ex, features=None, computed=False, error=errors[i])
        else:
            yield Extracted(
                example=ex,
                features=_compose(detectors, got[i], key, ex.id),
                computed=i in computed,
            )


def extract_features(
    model: LoadedModel,
    examples: Iterable[RAGExample],
    detectors: Sequence[Detector],
    *,
    cache: FeatureCache | None = None,
    progress: Progress | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    batch_size: int | None = None,
) -> Extraction:
    """Features of every example for every detector, kept in memory (see the module
    docstring; :func:`iter_features` streams them instead)."""
    exs = list(examples)
    names = [d.name for d in detectors]
    kept: list[RAGExample] = []
    out: dict[str, list[Features]] = {n: [] for n in names}
    errors: list[DataError] = []
    hits = computed = 0
    t0 = time.perf_counter()
    for i, got in enumerate(
        iter_features(model, exs, detectors, cache=cache, on_error=on_error, batch_size=batch_size)
    ):
        if got.error is not None or got.features is None:
            errors.append(got.error or DataError(f"no features for {got.example.id!r}"))
        else:
            computed += got.computed
            hits += not got.computed
            kept.append(got.example)
            for n in names:
                out[n].append(got.features[n])
        if progress:
            progress(i + 1, len(exs))
    return Extraction(
        examples=tuple(kept),
        features={n: tuple(v) for n, v in out.items()},
        errors=tuple(errors),
        cache_hits=hits,
        computed=computed,
        seconds=time.perf_counter() - t0,
    )


# --------------------------------------------------------------------------- estimating

WARM_UP = RAGExample(
    id="warm-up",
    question="Who built the bridge?",
    passages=("Ada Lovell built the bridge in 1820.",),
    response="Ada Lovell built it in 1820.",
)
"""A tiny answer run to load what detectors load on first use before anything is timed
(:func:`time_extraction`, :func:`core.pipeline.judge.warm_up`)."""


def example_chars(example: RAGExample) -> int:
    """The characters a trace of ``example`` reads (its prompt material and its answer):
    what the time to extract its features grows with."""
    if example.prompt is not None:
        prompt = len(example.prompt)
    else:
        prompt = sum(len(p) for p in example.passages) + len(example.question or "")
    return max(1, prompt + len(example.response))


def answer_tokens(model: LoadedModel, example: RAGExample) -> int:
    """How many tokens ``example``'s answer is under ``model`` (at least 1): what judging
    an answer grows with (every answer token is read through the lens at every layer),
    and so what the app's estimates of judging count (a character count of the prompt
    and answer together misjudged answers whose passages and answer differ in length by
    0.3x to 3.4x).

    Raises:
        DataError: The example cannot be laid out for the model.
    """
    return max(1, int(render(example, model).response_offsets.shape[0]))


def is_cached(
    cache: FeatureCache, model_key: str, example: RAGExample, detectors: Sequence[Detector]
) -> bool:
    """Whether every feature ``detectors`` read of ``example`` (each composite's members')
    is stored, without reading any of them."""
    key = example_hash(example)  # hashed once, not once per detector
    return all(cache.has(model_key, key, d) for d in plain_detectors(detectors))


def uncached(
    cache: FeatureCache,
    model_key: str,
    examples: Sequence[RAGExample],
    detectors: Sequence[Detector],
) -> list[RAGExample]:
    """The ``examples`` not :func:`is_cached`, asked of the cache in a few queries per
    detector (each composite's member) rather than one per example and detector."""
    keys = [example_hash(e) for e in examples]
    have: set[str] | None = None
    for d in plain_detectors(detectors):
        got = cache.stored(model_key, keys, d)
        have = got if have is None else have & got
    if have is None:  # no detector: nothing to read
        return []
    return [e for e, k in zip(examples, keys, strict=True) if k not in have]


@dataclass(frozen=True, kw_only=True)
class WorkEstimate:
    """How long reading some examples' features will take on this machine, roughly.

    Two paces make it (:func:`learn_paces` says how an action's time measures them):
    tracing grows with an example's characters, and an example already kept still costs
    reading it back and the action's own work on it (judging, spans, a page's statistic).

    Attributes:
        n_examples: Examples the action reads.
        n_cached: Of those, examples whose features are all stored already.
        chars_to_trace: Characters of the others (:func:`example_chars`).
        seconds_per_char: Seconds per character traced, measured here (the last such
            action, or one example timed warm, :func:`time_extraction`); ``None`` when
            it could not be (nothing to trace, or the example failed).
        seconds_per_kept: Seconds per example already stored (0 until an action here
            has measured it).
        fixed_seconds: Work on top that does not grow with the examples (a generation,
            a worker's start).
        memory: What a long input's pass will take in memory, against the budget, in
            words (:func:`core.engine.memory.describe_cost`); ``None``: nothing to say.
    """

    n_examples: int
    n_cached: int
    chars_to_trace: int
    seconds_per_char: float | None
    seconds_per_kept: float = 0.0
    fixed_seconds: float = 0.0
    memory: str | None = None

    @property
    def n_to_trace(self) -> int:
        return self.n_examples - self.n_cached

    @property
    def known(self) -> bool:
        """Whether the time is known (everything cached, or the pace was measured)."""
        return self.n_to_trace == 0 or self.seconds_per_char is not None

    @property
    def kept_seconds(self) -> float:
        """The part of :attr:`seconds` spent on the examples already stored."""
        return self.n_cached * self.seconds_per_kept

    @property
    def seconds(self) -> float:
        """The estimate (the traced part is 0 while unknown: check :attr:`known`)."""
        traced = self.chars_to_trace * (self.seconds_per_char or 0.0)
        return self.fixed_seconds + traced + self.kept_seconds

    @property
    def seconds_per_example(self) -> float:
        """The mean time of one example to trace."""
        traced = self.seconds - self.fixed_seconds - self.kept_seconds
        return traced / max(self.n_to_trace, 1)


def learn_paces(
    seconds: float, *, traced_chars: int, n_kept: int, kept_pace: float | None
) -> tuple[float | None, float | None]:
    """What one action's wall time says of :class:`WorkEstimate`'s two paces: seconds per
    character traced and seconds per example already kept (``None``: not measured by this
    action). An action that traced nothing measures the kept pace alone; otherwise the
    traced pace is what is left once the kept examples are counted at ``kept_pace`` (at
    most half the time: a kept pace measured under another load cannot zero it)."""
    if not (seconds > 0 and math.isfinite(seconds)):
        return None, None
    if traced_chars <= 0:
        return None, (seconds / n_kept if n_kept > 0 else None)
    kept = min(max(n_kept, 0) * (kept_pace or 0.0), seconds / 2)
    return (seconds - kept) / traced_chars, None


MIN_FIT = 6
"""Fewest traced examples whose times :func:`fit_paces` splits into two paces."""


@dataclass(frozen=True)
class LengthPaces:
    """Seconds per character of an example's prompt material and of its answer, apart:
    the features read per answer token (a lens over every layer, each head's attention to
    the passages) make an answer's character cost several prompt characters, or, for
    what reads each head over the passages, fewer. :func:`fit_paces` measures both."""

    prompt: float
    response: float

    def seconds(self, examples: Sequence[RAGExample]) -> float:
        return sum(self.prompt * p + self.response * r for p, r in map(example_lengths, examples))


def example_lengths(example: RAGExample) -> tuple[int, int]:
    """``(prompt material, answer)`` characters of ``example`` (they add up to
    :func:`example_chars`, less its floor of 1)."""
    chars = example_chars(example)
    return chars - len(example.response), len(example.response)


def fit_paces(seconds: Sequence[float], examples: Sequence[RAGExample]) -> LengthPaces | None:
    """:class:`LengthPaces` from each traced example's time, by non-negative least
    squares; ``None`` with fewer than :data:`MIN_FIT` examples, or when their prompt and
    answer lengths grow together too closely to tell the two paces apart."""
    if len(seconds) != len(examples) or len(examples) < MIN_FIT:
        return None
    X = np.asarray([example_lengths(e) for e in examples], dtype=float)
    y = np.asarray(seconds, dtype=float)
    if not (np.isfinite(y).all() and (y >= 0).all()) or (X.std(axis=0) == 0).any():
        return None
    scaled = X / X.mean(axis=0)
    if np.linalg.cond(scaled) > 30:
        return None
    coef, _ = nnls(X, y)
    if not coef.any():
        return None
    return LengthPaces(prompt=float(coef[0]), response=float(coef[1]))


def time_extraction(
    model: LoadedModel, example: RAGExample, detectors: Sequence[Detector], cache: FeatureCache
) -> float:
    """Seconds per character (:func:`example_chars`) to trace ``example`` and compute
    every feature ``detectors`` read, measured by extracting it here. Its features are
    stored in ``cache``, so the time spent counts towards the action it estimates. What
    detectors load on first use (spaCy, the sentence embedder, a first pass's kernels) is
    loaded before the clock starts, on :data:`WARM_UP` (not kept), so the pace is the
    warm one every later example runs at.

    Raises:
        DataError: The example cannot be laid out or a detector cannot read it.
    """
    for got in iter_features(model, [WARM_UP], detectors):
        if got.error is not None:
            raise got.error
    t0 = time.perf_counter()
    for got in iter_features(model, [example], detectors, cache=cache):
        if got.error is not None:
            raise got.error
    return (time.perf_counter() - t0) / example_chars(example)


def estimate_extraction(
    model_key: str,
    examples: Sequence[RAGExample],
    detectors: Sequence[Detector],
    cache: FeatureCache | None,
    pace: Callable[[RAGExample], float | None],
    *,
    kept_pace: float = 0.0,
    fixed_seconds: float = 0.0,
) -> WorkEstimate:
    """How long :func:`extract_features` of ``examples`` will take: the examples not in
    ``cache`` (all of them without one) at ``pace(first of them)`` seconds per character
    (``pace`` is called only when something is left to trace; it may time that example,
    see :func:`time_extraction`, which stores it: the count is taken after)."""

    def todo_of(exs: Sequence[RAGExample]) -> list[RAGExample]:
        if cache is None:
            return list(exs)
        return uncached(cache, model_key, exs, detectors)

    return estimate_work(examples, todo_of, pace, kept_pace=kept_pace, fixed_seconds=fixed_seconds)


def estimate_work(
    examples: Sequence[RAGExample],
    todo_of: Callable[[Sequence[RAGExample]], list[RAGExample]],
    pace: Callable[[RAGExample], float | None],
    *,
    kept_pace: float = 0.0,
    fixed_seconds: float = 0.0,
) -> WorkEstimate:
    """The estimate of reading ``examples`` when ``todo_of`` says which are not kept yet:
    the first of those paced (``pace`` may read it and keep it, so the count is taken
    after), the rest at that pace per character. Shared by every kind of read (features
    here, SAE activations in :mod:`core.explain`)."""
    todo = todo_of(examples)
    spc = pace(todo[0]) if todo else None
    if todo and spc is not None:
        todo = todo_of(todo)
    return WorkEstimate(
        n_examples=len(examples),
        n_cached=len(examples) - len(todo),
        chars_to_trace=sum(example_chars(e) for e in todo),
        seconds_per_char=spc,
        seconds_per_kept=kept_pace,
        fixed_seconds=fixed_seconds,
    )
