"""Ray as the distributed engine of feature extraction (``ragscope extract --engine ray``).

The examples become a Ray Dataset; ``map_batches`` runs them through a pool of
:class:`ExtractActor` s, each of which loads the model ONCE (``num_gpus`` per actor
when asked, else ``num_cpus``) and traces its batches with
:func:`core.pipeline.extract.run_examples`, the same code as in-process extraction. The
features come back to the driver as rows keyed like the feature cache (model key,
example content hash, detector, feature config hash) with the cache's checked
payload, and the driver streams them into a Parquet feature store
(:class:`core.pipeline.featurestore.ShardWriter`).

Faults: Ray Data restarts a dead actor and retries its batch; the store's writes are
keyed and idempotent (a retried batch's rows are skipped, never duplicated), and a
driver started again skips every example the store already holds, so a stopped run
resumes. An example that cannot be traced comes back as an error row naming the
example (and the detector, when one detector's features failed); nothing is lost on
either side.

Workers run the same code as the driver: on a cluster, every node needs ragscope
installed, the model's weights reachable (``RAGSCOPE_CACHE_DIR``, or the GGUF path)
and no downloads (``HF_HUB_OFFLINE=1``); :func:`worker_env` is passed to them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.base.errors import DataError, RagscopeError
from core.base.examples import RAGExample
from core.engine.model import LoadedModel, load_model
from core.evaluation.crossval import default_maker
from core.learning.contract import Features
from core.pipeline.extract import run_examples
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
    """One Ray actor: loads the model once, then turns batches of examples into rows.

    Args:
        model: The model spec (``embedded``, ``tiny``, a GGUF path, ...).
        device: ``auto``, ``cpu`` or ``cuda``.
        detectors: Detector names.
        options: Detector options by name (``--set``).
    """

    def __init__(
        self,
        model: str,
        device: str,
        detectors: Sequence[str],
        options: Mapping[str, Mapping[str, Any]],
    ) -> None:
        self.model = load_model(model, device=device)
        make = default_maker(options)
        self.detectors = [make(n) for n in detectors]
        self.flat = [
            m for d in self.detectors for m in (d.member_detectors() if d.composite else [d])
        ]

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {c: [] for c in ROW_COLUMNS}
        examples = [RAGExample.from_dict(json.loads(str(s))) for s in batch["example"]]
        try:
            results = run_examples(self.model, examples, self.flat)
        except RagscopeError as e:  # the whole batch (e.g. the trace) failed
            results = [DataError(str(e)) for _ in examples]
        for ex, res in zip(examples, results, strict=True):
            if isinstance(res, DataError):
                _row(out, ex, None, None, f"example {ex.id!r}: {res}")
                continue
            for d in self.flat:
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
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the caller shows progress (examples, not blocks)
    ctx.enable_rich_progress_bars = False
    ctx.print_on_execution_start = False
    ds = ray.data.from_items([{"example": e.to_json()} for e in todo])
    resources: dict[str, Any] = {"num_cpus": options.cpus_per_actor}
    if options.gpus_per_actor:
        resources["num_gpus"] = options.gpus_per_actor
    rows = ds.map_batches(
        ExtractActor,
        fn_constructor_kwargs={
            "model": model_spec,
            "device": options.device,
            "detectors": list(detectors),
            "options": {k: dict(v) for k, v in detector_options.items()},
        },
        batch_size=options.batch_size,
        compute=ray.data.ActorPoolStrategy(size=options.actors),
        batch_format="numpy",
        **resources,
    )
    by_id = {e.id: e for e in todo}
    names = {d.name: d for d in flat}
    done: set[str] = set()
    pending: dict[str, list[tuple[Key, Features]]] = {}
    for batch in rows.iter_batches(batch_format="numpy", batch_size=None):
        for i in range(len(batch["example_id"])):
            ex_id = str(batch["example_id"][i])
            ex = by_id.get(ex_id)
            if ex is None:
                raise DataError(f"a worker returned an example that was not sent: {ex_id!r}")
            if ex_id in done:  # a retried batch's rows: stored already
                report.duplicates += 1
                continue
            error = str(batch["error"][i])
            if error:
                done.add(ex_id)
                report.failures.append({"example": ex_id, "error": error})
                if options.on_error == "stop":
                    raise DataError(
                        f"{error}. Stopped there; what was stored stays (re-run to resume, "
                        "or --on-error skip)"
                    )
            else:
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
                payload = bytes(batch["features"][i])
                got = pending.setdefault(ex_id, [])
                got.append((key, Features.from_bytes(payload, example_id=ex_id)))
                if len(got) < len(flat):
                    continue
                done.add(ex_id)
                report.rows_written += sink(ex, pending.pop(ex_id))
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
    (start-up and model loading included; nothing stored), and the actor count; for
    ``ragscope bench --ray-actors``."""
    import ray

    make = default_maker({})
    dets = [make(n) for n in detectors]
    flat = [m for d in dets for m in (d.member_detectors() if d.composite else [d])]
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
        if started:
            ray.shutdown()
    if rep.failures:
        raise DataError(f"the Ray bench failed on {rep.failures[0]['error']}")
    return time.perf_counter() - t0, actors
