"""The worker process of a background job: ``python -m core.services.worker --job ID
--out DIR``.

:func:`core.services.jobs.launch_job` starts it in a session of its own. It reads what
to do from the job's row, never from its command line (:meth:`TrainSpec.from_dict`,
:meth:`AdaptSpec.from_dict`: the row is read as untrusted), runs it through core
(:func:`core.evaluation.train.train` for a training job, the recipe ``ragscope train``
runs; :func:`core.services.adapting.adapt_set` for an adaptation), and publishes into
``--out`` only what was written whole (:class:`core.services.jobs.JobRunner`: its
stage, progress and heartbeat go to the row, and a cancel leaves nothing behind).
``ragscope train --job`` and ``ragscope adapt --job`` run the same functions from a
terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from core.base.errors import RagscopeError
from core.data import resolve_dataset
from core.engine.model import LoadedModel, load_model
from core.evaluation.train import TrainOptions, report_training, summary, train
from core.pipeline.sets import ADAPTED_FILE, load_set
from core.services.adapting import adapt_set
from core.services.jobs import AdaptSpec, JobRunner, TrainSpec
from core.storage import Store


def _loading(msg: str, frac: float) -> None:
    print(f"[{frac:4.0%}] {msg}", file=sys.stderr, flush=True)


def _loaded(runner: JobRunner, model_spec: str, device: str) -> LoadedModel:
    """The job's model, loaded as its first stage and checked to be the one its row was
    made for."""
    runner.stage("Loading the model")
    model = load_model(model_spec, device=device, progress=_loading)
    runner.check_model(model.info.key)
    return model


def _ended(runner: JobRunner, job_id: int) -> int:
    """The worker's exit status: 1 when the job was cancelled (nothing published)."""
    if runner.status == "cancelled":
        print(f"job #{job_id} was cancelled; nothing was published", file=sys.stderr)
        return 1
    return 0


def run_train_job(store: Store, job_id: int, out: str | Path) -> int:
    """Train the recipe training job ``job_id``'s row stores into a staging folder, and
    publish its artifacts into ``out`` when every one is saved.

    Raises:
        DataError: The row's spec is not one a job from the app writes.
        RagscopeError: The model, the data or a detector fails (the row says so).
    """
    spec = TrainSpec.from_dict(store.get_job(job_id).spec)
    recipe = spec.recipe
    print(f"job #{job_id} runs {recipe.command(out=str(out))}", file=sys.stderr)
    runner = JobRunner(store, job_id, out=out)
    with runner:
        model = _loaded(runner, recipe.model, spec.device)
        runner.stage("Features")
        result = train(
            recipe,
            runner.staging,
            model=model,
            options=TrainOptions(device=spec.device),
            progress=runner.progress,
        )
        published = runner.publish(recipe.detectors)
        runner.result = {"artifacts": published, **summary(result)}
        report_training(result, out)
    return _ended(runner, job_id)


def run_adapt_job(store: Store, job_id: int, out: str | Path) -> int:
    """Adapt the set adaptation job ``job_id``'s row names to its dataset's reviews, and
    publish the derived set into ``out`` when it is written whole.

    Raises:
        DataError: The row's spec is not one a job from the app writes.
        RagscopeError: The model, the data or the adaptation fails (the row says so).
    """
    spec = AdaptSpec.from_dict(store.get_job(job_id).spec)
    runner = JobRunner(store, job_id, out=out)
    with runner:
        model = _loaded(runner, spec.model, spec.device)
        runner.stage("Reading the reviews")
        _, examples = resolve_dataset(spec.dataset)
        result = adapt_set(
            store,
            model,
            load_set(model.info.key, spec.set_name),
            spec.queue,
            examples,
            runner.staging,
            refit=spec.refit,
            progress=runner.progress,
        )
        runner.publish([result.folder.name], marker=ADAPTED_FILE)
        runner.result = result.summary()
        print(json.dumps(runner.result, indent=1))
    return _ended(runner, job_id)


def run_job(store: Store, job_id: int, out: str | Path) -> int:
    """Run job ``job_id`` by its kind (``train`` or ``adapt``)."""
    kind = store.get_job(job_id).kind
    return (run_adapt_job if kind == "adapt" else run_train_job)(store, job_id, out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m core.services.worker", description=__doc__)
    ap.add_argument("--job", type=int, required=True, help="the job's id in the database")
    ap.add_argument("--out", required=True, help="the folder the job publishes into")
    args = ap.parse_args(argv)
    try:
        with Store() as store:
            return run_job(store, args.job, args.out)
    except RagscopeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
