"""Batch feature extraction: one traced pass per example for all detectors together.

For each example the engine renders the layout once, takes the union of the
needs of every detector whose features are not cached yet, runs ONE forward
pass (plus one no-context pass when some detector asks for it), and hands
the same traces to each detector. Features are written to the cache as soon
as an example is done, keyed by (model key, example content hash, detector
name + config hash), so an interrupted run resumes where it stopped and a
repeated evaluation recomputes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from core.contract import Detector, Features, Run
from core.errors import DataError
from core.examples import RAGExample, example_hash
from core.layout import render
from core.model import LoadedModel
from core.storage import Store
from core.trace import Needs, trace

Progress = Callable[[int, int], None]
"""Callback ``(done, total)`` after each example."""


class FeatureCache:
    """Features stored in the analyses table of a :class:`~core.storage.Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def _key(detector: Detector) -> tuple[str, str]:
        return detector.name, detector.config.feature_hash()

    def get(self, model_key: str, example: RAGExample, detector: Detector) -> Features | None:
        name, cfg = self._key(detector)
        rec = self.store.get_analysis(
            example_hash=example_hash(example), model=model_key, detector=name, config_hash=cfg
        )
        if rec is None or not isinstance(rec.result, bytes):
            return None
        try:
            return Features.from_bytes(rec.result, example_id=example.id)
        except DataError:
            return None  # a damaged entry is recomputed (and overwritten) like a miss

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


def _flatten(detectors: Sequence[Detector]) -> list[Detector]:
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
    flat = _flatten(detectors)
    layout = render(example, model)
    needs = [d.needs(model.info) for d in flat]
    wanted = [n for n in needs if n is not None]
    full = trace(model, layout, Needs.union(wanted)) if wanted else None
    # A detector may ask for less in the no-context pass (``bare_needs``; CORTEX
    # needs only hidden states there) than in the pass with the passages.
    bare_needs = [
        b
        for d, n in zip(flat, needs, strict=True)
        if d.needs_bare and n and (b := d.bare_needs(model.info)) is not None
    ]
    bare = None
    if bare_needs:
        bare = trace(model, render(example, model, with_context=False), Needs.union(bare_needs))
    run = Run(example=example, layout=layout, trace=full, bare=bare, model=model.info, loaded=model)
    got = {d.name: d.features(run) for d in flat}
    return _compose(detectors, got, model.info.key, example.id)


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


def iter_features(
    model: LoadedModel,
    examples: Iterable[RAGExample],
    detectors: Sequence[Detector],
    *,
    cache: FeatureCache | None = None,
    on_error: Literal["raise", "skip"] = "raise",
) -> Iterator[Extracted]:
    """Each example's features for every detector, one example at a time (nothing is
    held back: an extraction over thousands of answers needs the memory of one).
    Cached features are read; the missing ones come from one traced pass and are
    written to the cache at once, so a stopped run resumes where it stopped."""
    names = [d.name for d in detectors]
    if len(set(names)) != len(names):
        raise DataError(f"detector names repeat: {names}")
    key = model.info.key
    flat = _flatten(detectors)
    for ex in examples:
        got: dict[str, Features] = {}
        if cache is not None:
            for d in flat:
                f = cache.get(key, ex, d)
                if f is not None:
                    got[d.name] = f
        missing = [d for d in flat if d.name not in got]
        if missing:
            try:
                fresh = run_example(model, ex, missing)
            except DataError as e:
                if on_error == "raise":
                    raise
                yield Extracted(example=ex, features=None, computed=False, error=e)
                continue
            if cache is not None:
                for d in missing:
                    cache.put(key, ex, d, fresh[d.name])
            got.update(fresh)
        yield Extracted(
            example=ex, features=_compose(detectors, got, key, ex.id), computed=bool(missing)
        )


def extract_features(
    model: LoadedModel,
    examples: Iterable[RAGExample],
    detectors: Sequence[Detector],
    *,
    cache: FeatureCache | None = None,
    progress: Progress | None = None,
    on_error: Literal["raise", "skip"] = "raise",
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
    for i, got in enumerate(iter_features(model, exs, detectors, cache=cache, on_error=on_error)):
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
