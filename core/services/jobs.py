"""Background training jobs: detectors trained for a model outside the app's script runs.

A job is a row of the ``jobs`` table (:mod:`core.storage.jobs`) and a detached worker
process running :mod:`core.services.worker` (:func:`launch_job`), in a session of its
own so it outlives the page that started it, a browser reload and even the app's
server. The row is the only channel between them: the worker records its stage, its
progress and a heartbeat there (:class:`JobRunner`); any app session reads them
(:func:`job_view`) and can ask it to stop.

The worker trains into a staging folder beside the job's output folder and moves each
finished artifact into place only at the end (:meth:`JobRunner.publish`), so a job
that is cancelled, fails or is killed leaves no half-written artifact. Its features go
to the feature cache as each example is done, so a job started again (:func:`resume_job`,
after a crash or a restart) traces only what is missing. The row stores the job's
:class:`core.evaluation.recipe.TrainRecipe` (:meth:`TrainSpec.to_dict`); the worker reads it from
there and runs it through :func:`core.evaluation.train.train`, so the artifacts are those
``ragscope train`` writes for the same recipe (:meth:`TrainSpec.command`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal, Self

from core.base.errors import DataError, RagscopeError
from core.base.examples import control_character
from core.base.paths import adapted_sets_dir, model_detectors_dir, repo_root
from core.data import is_named_spec
from core.evaluation.recipe import TrainRecipe
from core.evaluation.train import TrainCancelled
from core.storage import JobRow, JobRowError, Store

HEARTBEAT_S = 2.0
"""How often a worker reports that it is alive (and reads whether to stop)."""
STALE_S = 45.0
"""A queued or running job with no heartbeat for this long has lost its worker."""
JobState = Literal["queued", "running", "interrupted", "done", "failed", "cancelled"]
"""A job's state as shown: the stored status, with ``interrupted`` for an active job
whose worker is gone."""
_HEX = frozenset("0123456789abcdef")


class JobCancelled(TrainCancelled):
    """Raised in a worker to stop its job (asked from the app, or a signal).

    A ``BaseException``, like ``KeyboardInterrupt``, so no ``except Exception`` on the
    way (a detector's fit, an example's extraction) swallows it.
    """


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """What a training job trains: a :class:`~core.evaluation.recipe.TrainRecipe` (which
    checks every value, as ``ragscope train`` does) of the shape the app's training panel
    makes, and the one thing only a job adds, the device.

    A job's recipe names its model, one dataset by name (:func:`core.data.is_named_spec`:
    ``demo``, ``builtin``, ``shared:NAME``, ``stored:NAME``; never a path: a job's worker
    reads no file a visitor named), its detectors, and optionally a limit, a seed and
    ``cv`` folds (calibrated cross-fitted, as ``--cv`` does by default); nothing else
    (no detector options, test dataset or other calibration: the panel could not show
    or resume them). Build one with :meth:`of`.

    Attributes:
        recipe: What the job trains.
        device: ``--device``.

    Raises:
        DataError: A recipe of another shape, a dataset that is not one named dataset,
            or a device that could not be one argument of a command line.
    """

    recipe: TrainRecipe
    device: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.recipe, TrainRecipe):
            raise DataError("a training job's recipe is not a training recipe", field="recipe")
        _argument("device", self.device)
        dataset = self.recipe.dataset
        if "," in dataset:
            raise DataError("a training job trains on one dataset", field="dataset")
        if not is_named_spec(dataset):
            raise DataError(
                f"a training job reads a dataset by name (demo, builtin, shared:NAME, "
                f"stored:NAME), not {dataset[:80]!r}; to train on a file, run "
                "`ragscope train --dataset PATH` in a terminal",
                field="dataset",
            )
        r = self.recipe
        if r.cv is not None and r.cv > MAX_JOB_FOLDS:
            raise DataError(
                f"a training job cross-validates with at most {MAX_JOB_FOLDS} folds, not "
                f"{r.cv}; run more in a terminal: `{r.command()}`",
                field="cv",
            )
        shaped = _job_recipe(r.model, r.dataset, r.detectors, r.limit, r.seed, r.cv)
        if shaped != r:
            mine, theirs = shaped.to_dict(), r.to_dict()
            differ = sorted(k for k in theirs if k != "command" and theirs[k] != mine.get(k))
            raise DataError(
                f"a training job's recipe sets {differ}, which a job from the app does not; "
                f"run it in a terminal: `{r.command()}`",
                field=differ[0] if differ else "recipe",
            )

    @classmethod
    def of(
        cls,
        *,
        model: str,
        detectors: Sequence[str],
        dataset: str,
        device: str = "auto",
        limit: int | None = None,
        seed: int = 0,
        cv: int | None = None,
    ) -> TrainSpec:
        """The job the training panel's choices make (the options of ``ragscope train``).

        Raises:
            DataError: A value ``ragscope train`` or a job refuses, naming the field.
        """
        detectors = detectors if isinstance(detectors, tuple) else tuple(detectors)
        return cls(recipe=_job_recipe(model, dataset, detectors, limit, seed, cv), device=device)

    def to_dict(self) -> dict[str, Any]:
        """What the job's row stores: the recipe the worker runs, and the device."""
        return {"device": self.device, "recipe": self.recipe.to_dict()}

    @classmethod
    def from_dict(cls, d: object) -> TrainSpec:
        """The spec a job row stores (read as untrusted): ``{"device", "recipe"}``, the
        recipe checked by :meth:`TrainRecipe.from_dict`; a row written before jobs
        stored recipes holds the flat options, read as they were.

        Raises:
            DataError: It is not a spec this class writes.
        """
        if not isinstance(d, dict):
            raise DataError("a training job's spec is not a JSON object")
        if "recipe" in d:
            extra = sorted(str(k)[:40] for k in set(d) - {"device", "recipe"})
            if extra:
                raise DataError(f"a training job's spec has unknown fields {extra}")
            return cls(recipe=TrainRecipe.from_dict(d["recipe"]), device=d.get("device", "auto"))
        keys = {"model", "device", "detectors", "dataset", "limit", "seed", "cv"}
        extra = sorted(str(k)[:40] for k in set(d) - keys)
        if extra:
            raise DataError(f"a training job's spec has unknown fields {extra}")
        detectors = d.get("detectors")
        if not isinstance(detectors, list):
            raise DataError("a training job's detectors are not a list", field="detectors")
        return cls.of(
            model=d.get("model"),  # type: ignore[arg-type]  # checked by TrainRecipe
            device=d.get("device", "auto"),
            detectors=tuple(detectors),
            dataset=d.get("dataset"),  # type: ignore[arg-type]  # checked by TrainRecipe
            limit=d.get("limit"),
            seed=d.get("seed", 0),
            cv=d.get("cv"),
        )

    def argv(self, out: str | Path) -> list[str]:
        """The ``ragscope`` arguments that train this into ``out`` (:meth:`command`)."""
        return self.recipe.argv(out=str(out), device=self.device)

    def command(self, out: str | Path) -> str:
        """The equivalent command line: the recipe's ``ragscope train ...`` on this
        device into ``out`` (:meth:`TrainRecipe.command`)."""
        return self.recipe.command(out=str(out), device=self.device)


MAX_JOB_FOLDS = 20
"""The most cross-validation folds a job from the app runs (the panel offers 2 to 20)."""


def _job_recipe(
    model: str,
    dataset: str,
    detectors: tuple[str, ...],
    limit: int | None,
    seed: int,
    cv: int | None,
) -> TrainRecipe:
    """The recipe of a job from the app: these choices, calibrated cross-fitted with
    ``cv`` (as ``--cv`` is by default), nothing else."""
    return TrainRecipe(
        model=model,
        dataset=dataset,
        detectors=detectors,
        limit=limit,
        seed=seed,
        cv=cv,
        calibration="crossfit" if cv is not None else None,
    )


def _argument(what: str, value: object) -> None:
    """``value`` can be one argument of a command line: one line, not an option's
    look-alike, no control characters (a NUL would keep the worker from starting)."""
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise DataError(f"a training job's {what} must be a one-line name", field=what)
    if value.startswith("-"):
        raise DataError(f"a training job's {what} cannot start with '-'", field=what)
    if (bad := control_character(value)) is not None:
        raise DataError(
            f"a training job's {what} {value[:80]!r} holds the control character "
            f"U+{ord(bad[1]):04X}; pick another {what}",
            field=what,
        )


MAX_QUEUE_KEY = 200
"""The longest review-queue key an adaptation job may name."""


@dataclass(frozen=True, kw_only=True)
class AdaptSpec:
    """What an adaptation job adapts (:mod:`core.services.adapting`): the detector set
    that judges ``dataset``'s answers, fitted to them from the reviews of ``queue``.

    Attributes:
        model: The model as ``--model`` names it.
        device: ``--device``.
        dataset: The answers, by name (:func:`core.data.is_named_spec`), never a path.
        queue: The review queue holding the reviews (the Review page's dataset key).
        set_name: The base set by name (``None``: the set that applies, as everywhere).
        refit: Also fit the ensemble's stacker of the dataset's own (``--refit``).

    Raises:
        DataError: A field that is not a one-line name, a dataset named by path.
    """

    model: str
    device: str = "auto"
    dataset: str
    queue: str
    set_name: str | None = None
    refit: bool = False

    def __post_init__(self) -> None:
        for what, value in (
            ("model", self.model),
            ("device", self.device),
            ("dataset", self.dataset),
            ("queue", self.queue),
            ("set_name", self.set_name or "default"),
        ):
            if not isinstance(value, str) or not value.strip() or len(value) > MAX_QUEUE_KEY:
                raise DataError(f"an adaptation job's {what} must be a short name", field=what)
            if value.startswith("-") or not value.isprintable():
                raise DataError(
                    f"an adaptation job's {what} {value[:80]!r} must be one printable line "
                    "not starting with '-'",
                    field=what,
                )
        if not is_named_spec(self.dataset) or "," in self.dataset:
            raise DataError(
                "an adaptation job reads one dataset by name (demo, builtin, shared:NAME, "
                f"stored:NAME), not {self.dataset[:80]!r}",
                field="dataset",
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.device,
            "dataset": self.dataset,
            "queue": self.queue,
            "set_name": self.set_name,
            "refit": self.refit,
        }

    @classmethod
    def from_dict(cls, d: object) -> AdaptSpec:
        """The spec a job row stores, read as untrusted (exact keys, checked values).

        Raises:
            DataError: It is not a spec this class writes.
        """
        keys = {"model", "device", "dataset", "queue", "set_name"}
        # "refit" came later: a spec written before holds the other keys only
        if not isinstance(d, dict) or set(d) - {"refit"} != keys:
            raise DataError(f"an adaptation job's spec must hold exactly {sorted(keys)}")
        if type(d.get("refit", False)) is not bool:
            raise DataError("an adaptation job's refit must be true or false", field="refit")
        return cls(**d)

    def argv(self, out: str | Path) -> list[str]:
        """The ``ragscope adapt`` arguments that do the same in a terminal."""
        argv = ["adapt", self.dataset, "--queue", self.queue, "--model", self.model]
        argv += ["--device", self.device]
        if self.set_name:
            argv += ["--set", self.set_name]
        if self.refit:
            argv.append("--refit")
        return argv

    def command(self, out: str | Path) -> str:
        return "ragscope " + shlex.join(self.argv(out))


# --------------------------------------------------------------------------- reading


def pid_alive(pid: int | None) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a finished child nobody reaped)."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive, and not ours to judge
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust the signal check
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


@dataclass(frozen=True, kw_only=True)
class JobView:
    """A job as a page shows it.

    Attributes:
        row: The stored row.
        state: Its state (:data:`JobState`).
        spec: Its options (``None`` when the stored spec is not one).
        spec_error: Why the stored spec could not be read.
        now: When this view was taken (Unix time).
    """

    row: JobRow
    state: JobState
    spec: TrainSpec | AdaptSpec | None
    spec_error: str | None = None
    now: float = field(default_factory=time.time)

    @property
    def id(self) -> int:
        return self.row.id

    @property
    def active(self) -> bool:
        """Queued or running with a live worker."""
        return self.state in ("queued", "running")

    @property
    def resumable(self) -> bool:
        """Interrupted or failed: starting its worker again continues it."""
        return self.state in ("interrupted", "failed") and self.spec is not None

    @property
    def fraction(self) -> float:
        """Progress through the current stage, 0 to 1 (1 once done)."""
        if self.state == "done":
            return 1.0
        r = self.row
        return min(max(r.done / r.total, 0.0), 1.0) if r.total > 0 else 0.0

    @property
    def progress_text(self) -> str:
        """The stage and its count, e.g. ``Features: 12 / 80 examples``."""
        r = self.row
        text = r.stage or self.state
        if r.total > 0:
            text += f": {r.done} / {r.total} examples"
        return text

    @property
    def seconds_since_heartbeat(self) -> float | None:
        hb = self.row.heartbeat
        return max(0.0, self.now - hb) if hb is not None else None

    @property
    def detectors(self) -> tuple[str, ...]:
        """The detectors a training job trains (none for another kind)."""
        return self.spec.recipe.detectors if isinstance(self.spec, TrainSpec) else ()

    def command(self) -> str | None:
        """The ``ragscope train`` (or ``adapt``) command equivalent to this job."""
        return self.spec.command(self.row.out) if self.spec is not None else None


def job_view(row: JobRow, *, now: float | None = None, stale_s: float = STALE_S) -> JobView:
    """How ``row`` stands now: a stored ``queued``/``running`` job whose worker process
    is gone, or that has not reported for ``stale_s`` seconds, is ``interrupted``."""
    now = time.time() if now is None else now
    try:
        spec: TrainSpec | AdaptSpec | None = (
            AdaptSpec.from_dict(row.spec) if row.kind == "adapt" else TrainSpec.from_dict(row.spec)
        )
        spec_error = None
    except DataError as e:
        spec, spec_error = None, str(e)
    state: JobState = row.status
    if row.active:
        hb = row.heartbeat
        stale = hb is None or now - hb > stale_s
        gone = row.pid is not None and not pid_alive(row.pid)
        if stale or gone:
            state = "interrupted"
    return JobView(row=row, state=state, spec=spec, spec_error=spec_error, now=now)


def staging_dir(out: str | Path, uid: str) -> Path:
    """Where the job with uid ``uid`` (:attr:`JobRow.uid`, random per job) writes its
    artifacts before publishing them into ``out``: a hidden folder beside ``out`` (same
    file system, so publishing is a rename). Jobs of two databases that train the same
    model never share it."""
    out = Path(out)
    return out.parent / f".{out.name}.job-{_uid(uid)}"


def job_log_path(db_path: str | Path, job: JobRow) -> Path:
    """The worker's output (stdout and stderr) of ``job`` of the database at ``db_path``:
    ``jobs/job-<id>-<uid>.log`` beside the database (two databases in one folder never
    share a log)."""
    return Path(db_path).parent / "jobs" / f"job-{int(job.id)}-{_uid(job.uid)}.log"


def _uid(uid: str) -> str:
    if not isinstance(uid, str) or len(uid) != 16 or not set(uid) <= _HEX:
        raise DataError(f"a job uid is 16 hex digits, not {str(uid)[:40]!r}", field="uid")
    return uid


def _remove_staging(out: str | Path, uid: str) -> None:
    shutil.rmtree(staging_dir(out, uid), ignore_errors=True)


@dataclass(frozen=True, kw_only=True)
class JobActor:
    """Who asks to cancel, resume or discard a job (with logins configured).

    Attributes:
        id: The signed-in identity (:attr:`JobRow.owner` of the jobs they start).
        admin: May control anyone's job (``RAGSCOPE_ADMINS``).
    """

    id: str
    admin: bool = False


class JobPermissionError(DataError):
    """A signed-in user asked to control a job that is not theirs."""


def may_control(owner: str | None, actor: JobActor | None) -> bool:
    """Whether ``actor`` may cancel, resume or discard a job started by ``owner``:
    without logins (``actor`` ``None``) anyone who reaches the app may; with logins,
    its owner or an admin."""
    return actor is None or actor.admin or (owner is not None and owner == actor.id)


def _check_control(store: Store, job_id: int, actor: JobActor | None, action: str) -> None:
    if actor is None or actor.admin:
        return
    owner = store.job_owner(job_id)
    if not may_control(owner, actor):
        whose = f"was started by {owner!r}" if owner else "was started without logins"
        raise JobPermissionError(
            f"job #{job_id} {whose}; only its owner or an admin (RAGSCOPE_ADMINS) may {action} it",
            source=f"job #{job_id}",
        )


# --------------------------------------------------------------------------- launching


def launch_job(store: Store, job_id: int) -> int:
    """Start the worker of queued job ``job_id``: ``python -m core.services.worker --job
    ID --out DIR`` (:mod:`core.services.worker`) in a new session (it outlives the caller), its output in :func:`job_log_path`.
    Returns its process id.

    Raises:
        DataError: The job's spec cannot be read, or the database is in memory (a
            worker could not see it).
    """
    if store.path == ":memory:":
        raise DataError("background jobs need a database file, not ':memory:'")
    row = store.get_job(job_id)
    adapt = row.kind == "adapt"
    own = adapted_sets_dir(row.model) if adapt else model_detectors_dir(row.model)
    try:
        spec: TrainSpec | AdaptSpec = (
            AdaptSpec.from_dict(row.spec) if adapt else TrainSpec.from_dict(row.spec)
        )
        if Path(row.out).resolve() != own.resolve():
            # A job publishes only into its model's own folder: a row naming another
            # place (written by something else) must not make a worker replace folders.
            raise DataError(f"it would publish into {row.out}, not its model's folder {own}")
    except DataError as e:
        store.finish_job(job_id, "failed", error=str(e))
        raise DataError(f"job #{job_id} cannot start: {e}; start a new one") from e
    log = job_log_path(store.path, row)
    recipe_line = spec.command(row.out)
    # The worker (core.services.worker) reads its recipe from the row (never from a
    # rebuilt command line).
    cmd = [sys.executable, "-m", "core.services.worker", "--job", str(job_id), "--out", row.out]
    env = {**os.environ, "RAGSCOPE_DB": store.path, "PYTHONUNBUFFERED": "1"}
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as out:
            out.write(f"$ {shlex.join(cmd)}\n# the same in a terminal: {recipe_line}\n")
            out.flush()
            proc = subprocess.Popen(
                cmd,
                cwd=repo_root(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    except (OSError, ValueError) as e:  # ValueError: a NUL in an argument
        store.finish_job(job_id, "failed", error=f"the worker could not be started ({e})")
        raise DataError(f"the {row.kind} job's worker could not be started ({e})") from e
    # Reap it when it ends, so a finished worker is not left a zombie that looks alive.
    threading.Thread(target=proc.wait, name=f"ragscope-job-{job_id}", daemon=True).start()
    store.set_job_pid(job_id, proc.pid)
    return proc.pid


def start_train_job(
    store: Store, spec: TrainSpec, *, model_key: str, owner: str | None = None
) -> int:
    """Queue a training job for the model ``model_key``, owned by ``owner`` (the
    signed-in identity; ``None`` without logins), and start its worker; returns the
    job's id. It publishes into the model's own folder
    (:func:`core.base.paths.model_detectors_dir`).

    Raises:
        JobBusyError: A job for that model is already queued or running.
        DataError: ``spec`` is not a :class:`TrainSpec` (it is checked before any row is
            written), or the worker could not be started.
    """
    if not isinstance(spec, TrainSpec):
        raise DataError(f"a training job needs a TrainSpec, not {type(spec).__name__}")
    return _queue_and_launch(store, "train", spec, model_detectors_dir(model_key), model_key, owner)


def _queue_and_launch(
    store: Store,
    kind: str,
    spec: TrainSpec | AdaptSpec,
    out: Path,
    model_key: str,
    owner: str | None,
) -> int:
    """Queue a job of ``kind`` publishing into ``out`` and start its worker (no staging
    folder of an earlier job under its uid is left); returns its id."""
    job_id = store.create_job(
        kind=kind, model=model_key, spec=spec.to_dict(), out=str(out), owner=owner
    )
    _remove_staging(out, store.get_job(job_id).uid)
    launch_job(store, job_id)
    return job_id


def start_adapt_job(
    store: Store, spec: AdaptSpec, *, model_key: str, owner: str | None = None
) -> int:
    """Queue an adaptation job for the model ``model_key`` (owned by ``owner``) and
    start its worker; returns the job's id. It publishes the derived set into the
    model's adapted-sets folder (:func:`core.base.paths.adapted_sets_dir`).

    Raises:
        JobBusyError: A job for that model is already queued or running.
        DataError: ``spec`` is not an :class:`AdaptSpec`, or the worker could not start.
    """
    if not isinstance(spec, AdaptSpec):
        raise DataError(f"an adaptation job needs an AdaptSpec, not {type(spec).__name__}")
    return _queue_and_launch(store, "adapt", spec, adapted_sets_dir(model_key), model_key, owner)


def resume_job(store: Store, job_id: int, *, actor: JobActor | None = None) -> int:
    """Start an interrupted or failed job's worker again (its features come from the
    cache); returns the new process id. With logins (``actor``), only its owner or an
    admin may.

    Raises:
        JobPermissionError: ``actor`` may not control it.
        DataError: The job is not interrupted or failed, or its spec cannot be read.
        JobBusyError: Another job for its model is active.
    """
    _check_control(store, job_id, actor, "resume")
    view = job_view(store.get_job(job_id))
    if not view.resumable:
        raise DataError(f"job #{job_id} is {view.state}; only an interrupted or failed job resumes")
    _remove_staging(view.row.out, view.row.uid)
    store.requeue_job(job_id)
    return launch_job(store, job_id)


def discard_job(store: Store, job_id: int, *, actor: JobActor | None = None) -> None:
    """Give up an interrupted job, or an active one whose row cannot be read: it is
    marked cancelled (what it staged is removed when its row says where). With logins
    (``actor``), only its owner or an admin may.

    Raises:
        JobPermissionError: ``actor`` may not control it.
        DataError: It is active (cancel it instead).
    """
    _check_control(store, job_id, actor, "discard")
    try:
        view = job_view(store.get_job(job_id))
    except JobRowError:
        store.discard_job(job_id)
        return
    if view.active:
        raise DataError(f"job #{job_id} is {view.state}; cancel it instead")
    if store.discard_job(job_id):
        _remove_staging(view.row.out, view.row.uid)


def cancel_job(store: Store, job_id: int, *, actor: JobActor | None = None) -> JobState:
    """Stop a job: a live worker is asked to (it stops within about
    :data:`HEARTBEAT_S` seconds and removes what it staged); an interrupted job is marked
    cancelled at once. Returns the job's state after the request. With logins
    (``actor``), only its owner or an admin may.

    Raises:
        JobPermissionError: ``actor`` may not control it.
    """
    _check_control(store, job_id, actor, "cancel")
    view = job_view(store.get_job(job_id))
    if view.state == "interrupted":
        store.finish_job(job_id, "cancelled", error=None)
        _remove_staging(view.row.out, view.row.uid)
        return "cancelled"
    if view.active:
        store.request_job_cancel(job_id)
    return view.state


# --------------------------------------------------------------------------- running


class JobRunner:
    """The worker's side of job ``job_id`` (``with JobRunner(...) as job:``).

    Entering claims the job (a job cancelled while queued raises
    :class:`JobCancelled` at once), empties its staging folder, starts a heartbeat
    thread and, in the main thread, turns ``SIGTERM`` into :class:`JobCancelled`. The
    heartbeat thread reads whether the app asked the job to stop and, if so, sends
    the process that ``SIGTERM``, so even a long fit stops within seconds. Leaving
    records the outcome: ``done`` with :attr:`result`, ``cancelled`` (the exception
    is swallowed; :attr:`status` says so) or ``failed`` with the error (re-raised);
    anything staged and not published is removed.

    Args:
        store: The database holding the job.
        job_id: The job.
        out: The output folder the worker was given (must be the job's).

    Raises:
        DataError: No such job, it is not queued, or ``out`` is not its folder.
    """

    def __init__(self, store: Store, job_id: int, *, out: str | Path) -> None:
        self.store = store
        self.job_id = int(job_id)
        self.out = Path(out)
        self.status: str = "queued"
        self.result: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._publishing = False
        self._cancel_sent = False
        self._raised = False
        self._closing = False
        self._pid = os.getpid()
        self._old_handler: Any = None
        self._armed = False
        self._uid: str | None = None

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> Self:
        row = self.store.claim_job(self.job_id, self._pid)
        self._uid = row.uid
        if Path(row.out).resolve() != self.out.resolve():
            self.store.finish_job(self.job_id, "failed", error="started with another --out")
            raise DataError(
                f"job #{self.job_id} publishes into {row.out}, not {self.out}", field="out"
            )
        if row.status == "cancelled":  # cancelled while queued: the first stage stops
            self.status = "cancelled"
            return self
        self.status = "running"
        _remove_staging(self.out, row.uid)
        self.staging.mkdir(parents=True)
        if threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self._armed = True
        self._thread = threading.Thread(
            target=self._beat, name=f"ragscope-job-{self.job_id}-heartbeat", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._closing = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._armed:
            signal.signal(signal.SIGTERM, self._old_handler)
            self._armed = False
        stopped = isinstance(exc, TrainCancelled | KeyboardInterrupt)
        if self.status == "cancelled":  # claimed after it was cancelled: nothing ran
            return stopped
        self.status = "done" if exc is None else "cancelled" if stopped else "failed"
        # A fresh connection: an exception raised mid-statement may have left the shared
        # one inside a transaction.
        with Store(self.store.path) as db:
            try:
                owned = db.get_job(self.job_id).pid == self._pid
            except RagscopeError:
                owned = False
            if not owned:  # resumed in another worker meanwhile: its job now, not ours
                return stopped
            # Staged files go before the outcome is recorded: whoever reads the outcome
            # finds them gone.
            _remove_staging(self.out, self.uid)
            if exc is None:
                db.finish_job(self.job_id, "done", result=self.result, pid=self._pid)
            elif stopped:
                db.finish_job(self.job_id, "cancelled", pid=self._pid)
            else:
                reason = (
                    str(exc) if isinstance(exc, RagscopeError) else f"{type(exc).__name__}: {exc}"
                )
                db.finish_job(self.job_id, "failed", error=reason, pid=self._pid)
        return isinstance(exc, TrainCancelled | KeyboardInterrupt)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._publishing or self._raised or self._closing:
            return  # too late to stop (publishing, finishing), or already stopping
        self._raised = True
        raise JobCancelled()

    def _beat(self) -> None:
        with Store(self.store.path) as db:
            while not self._stop.wait(HEARTBEAT_S):
                try:
                    cancel = db.update_job(self.job_id, pid=self._pid)
                except RagscopeError:
                    continue  # a busy or locked database: the next beat tries again
                if cancel and not self._cancel_sent and not self._publishing:
                    self._cancel_sent = True
                    if self._armed:
                        os.kill(os.getpid(), signal.SIGTERM)

    # -- reporting ---------------------------------------------------------------

    @property
    def uid(self) -> str:
        """The job's uid (known once entered)."""
        if self._uid is None:
            raise DataError(f"job #{self.job_id} has not been claimed yet (use `with`)")
        return self._uid

    @property
    def staging(self) -> Path:
        """The folder to train into (published by :meth:`publish`)."""
        return staging_dir(self.out, self.uid)

    def stage(self, text: str, total: int = 0) -> None:
        """Start a stage (``total`` units, 0 when not counted); stops if asked to."""
        if self.store.update_job(self.job_id, pid=self._pid, stage=text, done=0, total=total):
            self._raised = True
            raise JobCancelled()

    def progress(self, done: int, total: int) -> None:
        """The extraction's ``(done, total)`` callback: records it and stops if asked to.
        After the last example the stage becomes "Fitting and scoring"."""
        stage = "Fitting and scoring" if done >= total else "Features"
        if self.store.update_job(self.job_id, pid=self._pid, stage=stage, done=done, total=total):
            if not self._publishing:
                self._raised = True
                raise JobCancelled()

    def check_model(self, model_key: str) -> None:
        """Refuse to train for another model than the job's (a spec that now loads
        other weights).

        Raises:
            DataError: ``model_key`` is not the job's model.
        """
        job = self.store.get_job(self.job_id)
        if job.model != model_key:
            raise DataError(
                f"job #{self.job_id} is for {job.model.split('|', 1)[0]!r} but its model "
                f"spec loaded {model_key.split('|', 1)[0]!r}; start a new job from the app"
            )

    def publish(self, names: Sequence[str], *, marker: str = "cfg.json") -> dict[str, str]:
        """Move each trained artifact (or derived set: ``marker`` is the file each
        folder must hold) from the staging folder into the output folder (one already
        there is replaced). From here on the job no longer stops when asked. Returns
        name -> published folder.

        Raises:
            DataError: An artifact is missing from the staging folder.
        """
        self.stage("Publishing the artifacts")  # the last moment a cancel still stops it
        self._publishing = True
        missing = [n for n in names if not (self.staging / n / marker).is_file()]
        if missing:
            raise DataError(f"the training wrote no artifact for {missing}")
        self.out.mkdir(parents=True, exist_ok=True)
        done: dict[str, str] = {}
        for n in names:
            src, dst = self.staging / n, self.out / n
            old = self.staging / f".replaced-{n}"
            if dst.exists():
                dst.rename(old)
            src.rename(dst)
            shutil.rmtree(old, ignore_errors=True)
            done[n] = str(dst)
        return done
