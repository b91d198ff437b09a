"""Ray as the distributed engine of feature extraction (``ragscope extract --engine ray``).

A pool of :class:`ExtractActor` s (Ray actors; ``num_gpus`` per actor when asked, else
``num_cpus``) each loads the model ONCE and traces the batches of examples it is sent
with :func:`core.pipeline.extract.run_examples`, the same code as in-process extraction;
the driver keeps every actor busy (a new batch as soon as one comes back). The features
come back to the driver as rows keyed like the feature cache (model key, example
content hash, detector, feature config hash) with the cache's checked payload, and the
driver streams them into a Parquet feature store
(:class:`core.pipeline.featurestore.ShardWriter`).

The pool outlives one extraction: the next one in the same process, on the same Ray
session with the same model, device, actor count and resources, reuses its actors and
their loaded models (a notebook, a script, ``train`` after ``extract``; the detectors
are named per batch). :func:`release_actors` frees them; another Ray session or other
settings replace them.

Faults: Ray restarts a dead actor (up to :data:`MAX_RESTARTS` times, loading the model
again) and retries the batch it held; the store's writes are keyed and idempotent (a
batch that came back twice is skipped, never duplicated), and a driver started again
skips every example the store already holds, so a stopped run resumes. An example that
cannot be traced comes back as an error row naming the example (and the detector, when
one detector's features failed); nothing is lost on either side.

Workers run the same code as the driver: on a cluster, every node needs ragscope
installed, the model's weights reachable (``RAGSCOPE_CACHE_DIR``, or the GGUF path)
and no downloads (``HF_HUB_OFFLINE=1``); :func:`worker_env` is passed to them.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.base.errors import DataError, RagscopeError
from core.base.examples import RAGExample
from core.engine.model import LoadedModel, load_model
from core.evaluation.crossval import default_maker
from core.learning.contract import Features
from core.pipeline.extract import plain_detectors, run_examples
from core.pipeline.featurestore import feature_key

WORKER_ENV_VARS = (
    "RAGSCOPE_CACHE_DIR",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HOME",
    "OLLAMA_MODELS",
)


def worker_env() -> dict[str, str]:
    """The environment every worker gets: the driver's cache and offline settings."""
    env = {k: os.environ[k] for k in WORKER_ENV_VARS if k in os.environ}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


@dataclass(frozen=True, kw_only=True)
class RayOptions:
    """Where and how wide to run, and what to do when an example fails.

    Attributes:
        address: ``None`` starts a local Ray on the spot; ``"auto"`` joins the cluster
            this machine belongs to; ``"ray://host:port"`` connects to a remote one.
        actors: Actors in the pool (each holds one copy of the model).
        gpus_per_actor: GPUs each actor reserves (0: CPU actors).
        cpus_per_actor: CPUs each actor reserves.
        batch_size: Examples per actor call (and per traced forward pass).
        device: The model's device on the actors (``auto``, ``cpu`` or ``cuda``).
        on_error: ``skip`` (report failed examples) or ``stop`` (raise at the first).
    """

    address: str | None = None
    actors: int = 2
    gpus_per_actor: float = 0.0
    cpus_per_actor: float = 1.0
    batch_size: int = 1
    device: str = "auto"
    on_error: str = "skip"

    def __post_init__(self) -> None:
        if self.actors < 1:
            raise DataError(f"--actors must be >= 1, got {self.actors}", field="actors")
        if self.gpus_per_actor < 0 or self.cpus_per_actor <= 0:
            raise DataError("--gpus-per-actor must be >= 0 and CPUs per actor > 0")
        if self.batch_size < 1:
            raise DataError(f"--batch-size must be >= 1, got {self.batch_size}")


class ExtractActor:
    """One Ray actor: loads the model once, then turns batches of examples into rows with
    the detectors each batch names.

    Args:
        model: The model spec (``embedded``, ``tiny``, a GGUF path, ...).
        device: ``auto``, ``cpu`` or ``cuda``.
    """

    def __init__(self, model: str, device: str) -> None:
        self.model = load_model(model, device=device)
        self._flat: dict[str, list[Any]] = {}

    def _detectors(
        self, detectors: Sequence[str], options: Mapping[str, Mapping[str, Any]]
    ) -> list[Any]:
        """The plain detectors ``detectors`` amount to (made once per names and options)."""
        key = json.dumps([list(detectors), options], sort_keys=True)
        flat = self._flat.get(key)
        if flat is None:
            make = default_maker(options)
            made = [make(n) for n in detectors]
            flat = plain_detectors(made)
            self._flat = {key: flat}  # the last set only: a pool serves one run at a time
        return flat

    def extract(
        self,
        examples: Sequence[str],
        detectors: Sequence[str],
        options: Mapping[str, Mapping[str, Any]],
    ) -> dict[str, list[Any]]:
        """Rows (:data:`ROW_COLUMNS`) of the examples ``examples`` (JSON texts)."""
        flat = self._detectors(detectors, options)
        out: dict[str, list[Any]] = {c: [] for c in ROW_COLUMNS}
        exs = [RAGExample.from_dict(json.loads(str(s))) for s in examples]
        try:
            results = run_examples(self.model, exs, flat)
        except RagscopeError as e:  # the whole batch (e.g. the trace) failed
            results = [DataError(str(e)) for _ in exs]
        for ex, res in zip(exs, results, strict=True):
            if isinstance(res, DataError):
                _row(out, ex, None, None, f"example {ex.id!r}: {res}")
                continue
            for d in flat:
                key = feature_key(self.model.info.key, ex, d)
                _row(out, ex, key, res[d.name].to_bytes(), "")
        return out


ROW_COLUMNS = (
    "example_id",
    "example",
    "model",
    "example_hash",
    "detector",
    "config_hash",
    "features",
    "error",
)


def _row(
    out: dict[str, list[Any]],
    ex: RAGExample,
    key: tuple[str, str, str, str] | None,
    payload: bytes | None,
    error: str,
) -> None:
    model, ex_hash, det, cfg = key if key is not None else ("", "", "", "")
    for col, value in zip(
        ROW_COLUMNS,
        (ex.id, ex.to_json(), model, ex_hash, det, cfg, payload or b"", error),
        strict=True,
    ):
        out[col].append(value)


@dataclass(kw_only=True)
class RayReport:
    """What a Ray extraction did.

    Attributes:
        examples: Examples sent to the actors (the store's were skipped before).
        held: Examples the store held already.
        rows_written: Rows the store gained.
        duplicates: Rows that came back twice (a retried batch) and were skipped.
        failures: ``{"example": id, "error": why}`` per failed example.
        seconds: Wall time.
    """

    examples: int = 0
    held: int = 0
    rows_written: int = 0
    duplicates: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0


def start_ray(options: RayOptions) -> None:
    """Connect to the cluster of ``options.address``, or start a local Ray (workers get
    :func:`worker_env`); a Ray already initialised in this process is reused."""
    import ray

    if ray.is_initialized():
        return
    runtime_env = {"env_vars": worker_env()}
    if options.address is None:
        cpus = max(int(options.actors * options.cpus_per_actor), 1)
        ray.init(
            num_cpus=cpus,
            runtime_env=runtime_env,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    else:
        ray.init(address=options.address, runtime_env=runtime_env, log_to_driver=False)


MAX_RESTARTS = 3
"""Restarts of a dead actor (each loads the model again, then retries its batch) before
an extraction stops."""


@dataclass(frozen=True, eq=False)
class _Pool:
    """The kept actors and what they were made for (Ray session, model, resources)."""

    key: tuple[Any, ...]
    actors: list[Any]


_POOL: list[_Pool] = []
_POOL_LOCK = threading.Lock()


def _session() -> tuple[str, str]:
    """The Ray session and job this process is connected to."""
    import ray

    ctx = ray.get_runtime_context()
    return str(ctx.get_session_name()), str(ctx.get_job_id())


def _actors(model_spec: str, model_key: str, options: RayOptions) -> list[Any]:
    """The actors of ``model_spec`` (whose model the driver knows as ``model_key``) on
    ``options``' device and resources: the kept pool's when it was made for them in this
    Ray session, else a new pool (replacing it)."""
    import ray

    key = (
        _session(),
        model_spec,
        model_key,
        options.device,
        options.actors,
        options.cpus_per_actor,
        options.gpus_per_actor,
    )
    with _POOL_LOCK:
        if _POOL and _POOL[0].key == key:
            return _POOL[0].actors
    release_actors()
    resources: dict[str, Any] = {"num_cpus": options.cpus_per_actor}
    if options.gpus_per_actor:
        resources["num_gpus"] = options.gpus_per_actor
    cls = ray.remote(ExtractActor).options(
        max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS, **resources
    )
    actors = [cls.remote(model_spec, options.device) for _ in range(options.actors)]
    with _POOL_LOCK:
        _POOL[:] = [_Pool(key=key, actors=actors)]
    return actors


def release_actors() -> None:
    """Stop the actors kept for the next extraction (their models go with them)."""
    import ray

    with _POOL_LOCK:
        pools = list(_POOL)
        _POOL.clear()
    if not pools or not ray.is_initialized():
        return  # a Ray shut down took its actors with it
    for pool in pools:
        if pool.key[0] != _session():
            continue  # another session's actors: gone with it
        for actor in pool.actors:
            ray.kill(actor)


Key = tuple[str, str, str, str]
Sink = Callable[[RAGExample, Sequence[tuple[Key, Features]]], int]
"""Stores one example's features (every detector's, keyed); returns the rows added."""


def extract_ray(
    model_spec: str,
    model_key: str,
    examples: Sequence[RAGExample],
    detectors: Sequence[str],
    detector_options: Mapping[str, Mapping[str, Any]],
    flat: Sequence[Any],
    holds: Callable[[Key], bool],
    sink: Sink,
    options: RayOptions = RayOptions(),
    progress: Callable[[int, int], None] | None = None,
) -> RayReport:
    """Extract ``examples`` on Ray (see the module docstring).

    Args:
        model_spec: The model every actor loads.
        model_key: ``ModelInfo.key`` of that model (rows under another key are refused).
        examples: What to extract.
        detectors: Detector names; ``flat``: the plain detectors they amount to (the
            ensemble's members), whose keys the store holds.
        detector_options: ``--set`` options by detector.
        holds: Whether the store holds a key (examples it holds for every detector are
            not sent: a restarted driver resumes).
        sink: Stores one finished example's features (idempotent: keyed).
        options: Where and how wide to run, and what to do on a failed example
            (:class:`RayOptions`).
        progress: Called with (examples done, examples to do).
    """
    import ray

    t0 = time.perf_counter()
    report = RayReport()
    todo = [e for e in examples if not all(holds(feature_key(model_key, e, d)) for d in flat)]
    report.held = len(examples) - len(todo)
    report.examples = len(todo)
    if not todo:
        report.seconds = time.perf_counter() - t0
        return report
    start_ray(options)
    actors = _actors(model_spec, model_key, options)
    names_sent = list(detectors)
    options_sent = {k: dict(v) for k, v in detector_options.items()}
    queue = deque(todo[i : i + options.batch_size] for i in range(0, len(todo), options.batch_size))
    in_flight: dict[Any, Any] = {}  # a batch's result -> the actor running it

    def send(actor: Any) -> None:
        batch = [e.to_json() for e in queue.popleft()]
        in_flight[actor.extract.remote(batch, names_sent, options_sent)] = actor

    def results() -> Generator[dict[str, list[Any]], None, None]:
        """Each batch's rows as it comes back; its actor gets the next batch first."""
        for actor in actors[: len(queue)]:
            send(actor)
        died: Exception | None = None
        try:
            while in_flight:
                (ref,), _ = ray.wait(list(in_flight), num_returns=1)
                actor = in_flight.pop(ref)
                try:
                    rows = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    died = e
                    break
                if queue:
                    send(actor)
                yield rows
        finally:  # stopped early: the batches still queued on the actors are not run
            for ref in in_flight:
                ray.cancel(ref)
        if died is not None:
            release_actors()
            raise DataError(
                f"an extraction actor could not start, or died {MAX_RESTARTS + 1} times: "
                f"{died}. What was stored stays: re-run to resume"
            ) from died

    by_id = {e.id: e for e in todo}
    names = {d.name: d for d in flat}
    done: set[str] = set()
    pending: dict[str, list[tuple[Key, Features]]] = {}

    def take(batch: Mapping[str, list[Any]], i: int) -> None:
        """Row ``i`` of a batch: a failure reported, or features kept until the example
        has every detector's, then stored."""
        ex_id = str(batch["example_id"][i])
        ex = by_id.get(ex_id)
        if ex is None:
            raise DataError(f"a worker returned an example that was not sent: {ex_id!r}")
        if ex_id in done:  # a retried batch's rows: stored already
            report.duplicates += 1
            return
        error = str(batch["error"][i])
        if error:
            done.add(ex_id)
            report.failures.append({"example": ex_id, "error": error})
            if options.on_error == "stop":
                raise DataError(
                    f"{error}. Stopped there; what was stored stays (re-run to resume, "
                    "or --on-error skip)"
                )
            return
        key: Key = (
            str(batch["model"][i]),
            str(batch["example_hash"][i]),
            str(batch["detector"][i]),
            str(batch["config_hash"][i]),
        )
        det = names.get(key[2])
        if det is None or key != feature_key(model_key, ex, det):
            raise DataError(
                f"example {ex_id!r}: a worker returned features under another key "
                f"({key}); do all nodes run the same ragscope and model?"
            )
        got = pending.setdefault(ex_id, [])
        got.append((key, Features.from_bytes(bytes(batch["features"][i]), example_id=ex_id)))
        if len(got) == len(flat):
            done.add(ex_id)
            report.rows_written += sink(ex, pending.pop(ex_id))

    with contextlib.closing(results()) as stream:
        for batch in stream:
            for i in range(len(batch["example_id"])):
                take(batch, i)
                if progress:
                    progress(len(done), len(todo))
    report.seconds = time.perf_counter() - t0
    return report


def bench_ray(
    model_spec: str,
    device: str,
    model: LoadedModel,
    examples: Sequence[RAGExample],
    detectors: Sequence[str],
    actors: int,
) -> tuple[float, int]:
    """Seconds of a cold extraction of ``examples`` on a local Ray with ``actors`` actors
    (start-up and model loading included: no kept actor is reused; nothing stored), and
    the actor count; for ``ragscope bench --ray-actors``."""
    import ray

    release_actors()
    make = default_maker({})
    dets = [make(n) for n in detectors]
    flat = plain_detectors(dets)
    started = not ray.is_initialized()
    t0 = time.perf_counter()
    try:
        rep = extract_ray(
            model_spec=model_spec,
            model_key=model.info.key,
            examples=examples,
            detectors=detectors,
            detector_options={},
            flat=flat,
            holds=lambda _key: False,
            sink=lambda _ex, rows: len(rows),
            options=RayOptions(actors=actors, device=device),
        )
    finally:
        release_actors()
        if started:
            ray.shutdown()
    if rep.failures:
        raise DataError(f"the Ray bench failed on {rep.failures[0]['error']}")
    return time.perf_counter() - t0, actors
