"""The ``jobs`` table: background jobs (training detectors for a model), their state and
progress, shared by the process that runs one and every app session that watches it.

A job is ``queued`` when created, ``running`` once its worker claims it, and ends
``done``, ``failed`` or ``cancelled``. At most one job per model key is queued or
running (a partial unique index holds this across processes). A running job whose
worker died keeps its row as ``running``: :mod:`core.services.jobs` tells it apart by its
heartbeat and process id and offers to resume or discard it.

Rows are read as untrusted: a row that does not hold what this module writes raises
:class:`JobRowError` naming the job, never an arbitrary exception.
"""

from __future__ import annotations

import math
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Literal, cast

from core.base.errors import DataError
from core.base.safeio import parse_json
from core.storage.db import Database, dumps, now_iso

JobStatus = Literal["queued", "running", "done", "failed", "cancelled"]
JOB_STATUSES: tuple[JobStatus, ...] = ("queued", "running", "done", "failed", "cancelled")
ACTIVE_STATUSES: tuple[JobStatus, ...] = ("queued", "running")
JOB_KINDS = ("train", "adapt")
MAX_TEXT = 20_000
"""Longest stage or error text stored (longer ones are cut)."""

_COLUMNS = (
    "id, kind, model, spec, out, status, cancel_requested, stage, done, total, pid, "
    "heartbeat, attempts, error, result, created_at, started_at, finished_at, owner, uid"
)
_UID = re.compile(r"^[0-9a-f]{16}$")
"""A job's uid: 16 lower-case hex digits (it names files: nothing else may pass)."""


class JobRowError(DataError):
    """A job row that cannot be read back (damaged or written by something else).

    Attributes:
        job_id: The row's id.
    """

    def __init__(self, job_id: int, message: str) -> None:
        self.job_id = job_id
        super().__init__(
            f"{message}; discard the job (it is then ignored) or point RAGSCOPE_DB at "
            "another database",
            source=f"job #{job_id}",
        )


class JobBusyError(DataError):
    """Another job for the same model is queued or running.

    Attributes:
        job_id: The active job's id (``None`` when it could not be read).
    """

    def __init__(self, model: str, job_id: int | None) -> None:
        self.job_id = job_id
        which = f"job #{job_id}" if job_id is not None else "another job"
        super().__init__(
            f"{which} is already training detectors for this model; wait for it, cancel "
            "it, or resume it if it was interrupted (one job at a time per model)",
            source=model.split("|", 1)[0],
        )


@dataclass(frozen=True, kw_only=True)
class JobRow:
    """One job as stored.

    Attributes:
        id: Row id.
        kind: What the job does (``train``).
        model: ``ModelInfo.key`` of the model it is for.
        spec: The job's options (a JSON object; :mod:`core.services.jobs` validates it).
        out: The folder its results are published to.
        status: Stored state (see the module docstring).
        cancel_requested: Someone asked it to stop.
        stage: What it is doing, in words.
        done: Units of the current stage done.
        total: Units of the current stage (0: not counted).
        pid: Process id of its worker, when one was started.
        heartbeat: Unix time its worker last reported.
        attempts: How many workers have claimed it.
        error: Why it failed.
        result: What it produced (a JSON object), once done.
        created_at, started_at, finished_at: ISO 8601 UTC times.
        owner: The signed-in identity that started it (``None``: started without
            logins, or from the command line).
        uid: A random id, unique across databases, that names its log and staging folder.
    """

    id: int
    kind: str
    model: str
    spec: dict[str, Any]
    out: str
    status: JobStatus
    cancel_requested: bool
    stage: str
    done: int
    total: int
    pid: int | None
    heartbeat: float | None
    attempts: int
    error: str | None
    result: dict[str, Any] | None
    created_at: str
    started_at: str | None
    finished_at: str | None
    owner: str | None = None
    uid: str

    @property
    def active(self) -> bool:
        """Queued or running as stored (its worker may still have died)."""
        return self.status in ACTIVE_STATUSES


def _int(job_id: int, value: object, what: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**53:
        raise JobRowError(job_id, f"its {what} is not a count ({type(value).__name__})")
    return value


def _text(job_id: int, value: object, what: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise JobRowError(job_id, f"its {what} is not text ({type(value).__name__})")
    return value[:MAX_TEXT]


def _object(job_id: int, value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, str):
        raise JobRowError(job_id, f"its {what} is not JSON text")
    try:
        parsed = parse_json(value, source=f"job #{job_id} {what}")
    except DataError as e:
        raise JobRowError(job_id, f"its {what} is not JSON ({e.reason})") from e
    if not isinstance(parsed, dict):
        raise JobRowError(job_id, f"its {what} is not a JSON object")
    return parsed


def _job(row: tuple[Any, ...]) -> JobRow:
    """A stored row as a :class:`JobRow`, every field checked."""
    raw_id = row[0]
    if not isinstance(raw_id, int):
        raise JobRowError(-1, "its id is not a number")
    jid = raw_id
    (
        _,
        kind,
        model,
        spec,
        out,
        status,
        cancel,
        stage,
        done,
        total,
        pid,
        heartbeat,
        attempts,
        error,
        result,
        created,
        started,
        finished,
        owner,
        uid,
    ) = row
    if kind not in JOB_KINDS:
        raise JobRowError(jid, f"its kind {str(kind)[:40]!r} is not one of {list(JOB_KINDS)}")
    if status not in JOB_STATUSES:
        raise JobRowError(jid, f"its status {str(status)[:40]!r} is not a job status")
    if heartbeat is not None and not (
        isinstance(heartbeat, int | float) and math.isfinite(heartbeat)
    ):
        raise JobRowError(jid, "its heartbeat is not a time")
    if cancel not in (0, 1):
        raise JobRowError(jid, "its cancel flag is not 0 or 1")
    if not isinstance(uid, str) or not _UID.match(uid):
        raise JobRowError(jid, "its uid is not 16 hex digits")
    return JobRow(
        id=jid,
        kind=cast(str, kind),
        model=cast(str, _text(jid, model, "model")),
        spec=_object(jid, spec, "spec"),
        out=cast(str, _text(jid, out, "output folder")),
        status=cast(JobStatus, status),
        cancel_requested=bool(cancel),
        stage=cast(str, _text(jid, stage, "stage")),
        done=cast(int, _int(jid, done, "done count")),
        total=cast(int, _int(jid, total, "total count")),
        pid=_int(jid, pid, "process id", optional=True),
        heartbeat=float(heartbeat) if heartbeat is not None else None,
        attempts=cast(int, _int(jid, attempts, "attempt count")),
        error=_text(jid, error, "error", optional=True),
        result=_object(jid, result, "result") if result is not None else None,
        created_at=cast(str, _text(jid, created, "creation time")),
        started_at=_text(jid, started, "start time", optional=True),
        finished_at=_text(jid, finished, "finish time", optional=True),
        owner=_text(jid, owner, "owner", optional=True),
        uid=uid,
    )


def _new_uid() -> str:
    return secrets.token_hex(8)


class JobsRepository(Database):
    """Background jobs: create, claim, report progress, cancel, finish, resume."""

    def create_job(
        self, *, kind: str, model: str, spec: dict[str, Any], out: str, owner: str | None = None
    ) -> int:
        """Queue a job for ``owner`` (a signed-in identity; ``None`` without logins);
        returns its id. It gets a random :attr:`JobRow.uid`.

        Raises:
            JobBusyError: A job for ``model`` is already queued or running.
            DataError: ``kind`` is unknown or ``spec`` is not JSON-serialisable.
        """
        if kind not in JOB_KINDS:
            raise DataError(f"unknown job kind {kind!r}; known: {list(JOB_KINDS)}")
        payload = dumps(spec, "spec")
        try:
            with self._tx() as c:
                cur = c.execute(
                    "INSERT INTO jobs (kind, model, spec, out, status, stage, heartbeat, "
                    "created_at, owner, uid) VALUES (?, ?, ?, ?, 'queued', 'Queued', ?, ?, ?, ?)",
                    (kind, model, payload, out, time.time(), now_iso(), owner, _new_uid()),
                )
                return int(cur.lastrowid or 0)
        except sqlite3.IntegrityError as e:
            raise JobBusyError(model, self._active_id(model)) from e

    def job_owner(self, job_id: int) -> str | None:
        """Who started job ``job_id`` (``None``: nobody signed in), read on its own so a
        row that cannot otherwise be read still says whose it is.

        Raises:
            DataError: No such job.
            JobRowError: Its owner is not text.
        """
        rows = self._query("SELECT owner FROM jobs WHERE id = ?", (int(job_id),))
        if not rows:
            raise DataError(f"no job with id {job_id}")
        return _text(int(job_id), rows[0][0], "owner", optional=True)

    def _active_id(self, model: str) -> int | None:
        rows = self._query(
            "SELECT id FROM jobs WHERE model = ? AND status IN ('queued', 'running')", (model,)
        )
        return int(rows[0][0]) if rows and isinstance(rows[0][0], int) else None

    def get_job(self, job_id: int) -> JobRow:
        """The job ``job_id``.

        Raises:
            DataError: No such job.
            JobRowError: Its row cannot be read.
        """
        rows = self._query(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (int(job_id),))
        if not rows:
            raise DataError(f"no job with id {job_id}")
        return _job(rows[0])

    def latest_job(self, model: str, kind: str | None = None) -> JobRow | None:
        """The newest job for ``model`` (of ``kind``, else of any kind): the active one
        if there is one, else the last one that can be read (an unreadable ended row is
        history, skipped).

        Raises:
            JobRowError: The model's active row cannot be read (it holds the model's
                slot until discarded: :meth:`discard_job`).
        """
        where, params = "model = ?", [model]
        if kind is not None:
            where, params = "model = ? AND kind = ?", [model, kind]
        rows = self._query(
            f"SELECT {_COLUMNS} FROM jobs WHERE {where} "
            "ORDER BY status IN ('queued', 'running') DESC, id DESC LIMIT 50",
            params,
        )
        for row in rows:
            try:
                return _job(row)
            except JobRowError:
                if row[5] in ACTIVE_STATUSES:
                    raise
        return None

    def list_jobs(self, model: str | None = None, limit: int = 20) -> list[JobRow | JobRowError]:
        """The newest jobs (for ``model``, or all), newest first; an unreadable row is its
        :class:`JobRowError` in place."""
        sql = f"SELECT {_COLUMNS} FROM jobs"
        params: tuple[Any, ...] = ()
        if model is not None:
            sql += " WHERE model = ?"
            params = (model,)
        out: list[JobRow | JobRowError] = []
        for row in self._query(sql + " ORDER BY id DESC LIMIT ?", (*params, int(limit))):
            try:
                out.append(_job(row))
            except JobRowError as e:
                out.append(e)
        return out

    def set_job_pid(self, job_id: int, pid: int) -> None:
        """Record the process started for a queued job (before it claims the job)."""
        with self._tx() as c:
            c.execute(
                "UPDATE jobs SET pid = ?, heartbeat = ? WHERE id = ? AND status = 'queued'",
                (int(pid), time.time(), int(job_id)),
            )

    def claim_job(self, job_id: int, pid: int) -> JobRow:
        """Mark a queued job as running in process ``pid`` (one more attempt).

        A job cancelled while queued is marked ``cancelled`` instead. Returns the row
        after the change; its status says which happened.

        Raises:
            DataError: No such job, or it is not queued.
            JobRowError: Its row cannot be read.
        """
        with self._tx() as c:
            row = c.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (int(job_id),)).fetchone()
            if row is None:
                raise DataError(f"no job with id {job_id}")
            job = _job(row)
            if job.status != "queued":
                raise DataError(
                    f"job #{job_id} is {job.status}, not queued; resume it from the app "
                    "(or start a new one)"
                )
            now, at = time.time(), now_iso()
            if job.cancel_requested:
                c.execute(
                    "UPDATE jobs SET status = 'cancelled', stage = 'Cancelled', "
                    "finished_at = ?, heartbeat = ? WHERE id = ?",
                    (at, now, job.id),
                )
            else:
                c.execute(
                    "UPDATE jobs SET status = 'running', pid = ?, heartbeat = ?, "
                    "started_at = ?, attempts = attempts + 1, stage = 'Starting', done = 0, "
                    "total = 0, error = NULL WHERE id = ?",
                    (int(pid), now, at, job.id),
                )
            return _job(
                c.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job.id,)).fetchone()
            )

    def update_job(
        self,
        job_id: int,
        *,
        pid: int | None = None,
        stage: str | None = None,
        done: int | None = None,
        total: int | None = None,
    ) -> bool:
        """Report a running job's progress (and its heartbeat) from its worker; returns
        whether the worker should stop: the job was asked to, is no longer running, or
        (given ``pid``) now belongs to another worker (it was resumed elsewhere)."""
        sets = ["heartbeat = ?"]
        params: list[float | int | str] = [time.time()]
        for col, value in (("stage", stage), ("done", done), ("total", total)):
            if value is not None:
                sets.append(f"{col} = ?")
                params.append(value[:MAX_TEXT] if isinstance(value, str) else max(0, int(value)))
        owner = "" if pid is None else " AND pid = ?"
        with self._tx() as c:
            c.execute(
                f"UPDATE jobs SET {', '.join(sets)} WHERE id = ? AND status = 'running'{owner}",
                (*params, int(job_id), *(() if pid is None else (int(pid),))),
            )
            row = c.execute(
                "SELECT cancel_requested, status, pid FROM jobs WHERE id = ?", (int(job_id),)
            ).fetchone()
        if row is None:
            return True
        cancel, status, owner_pid = row
        return cancel == 1 or status != "running" or (pid is not None and owner_pid != pid)

    def request_job_cancel(self, job_id: int) -> bool:
        """Ask a queued or running job to stop; False when it was not active."""
        with self._tx() as c:
            cur = c.execute(
                "UPDATE jobs SET cancel_requested = 1 WHERE id = ? "
                "AND status IN ('queued', 'running')",
                (int(job_id),),
            )
            return cur.rowcount > 0

    def finish_job(
        self,
        job_id: int,
        status: Literal["done", "failed", "cancelled"],
        *,
        error: str | None = None,
        result: dict[str, Any] | None = None,
        stage: str | None = None,
        pid: int | None = None,
    ) -> bool:
        """End an active job (given ``pid``: only while that worker owns it); False when
        it had already ended (or belongs to another worker)."""
        if status not in ("done", "failed", "cancelled"):
            raise DataError(f"a job ends done, failed or cancelled, not {status!r}")
        default_stage = {"done": "Done", "failed": "Failed", "cancelled": "Cancelled"}[status]
        with self._tx() as c:
            cur = c.execute(
                "UPDATE jobs SET status = ?, error = ?, result = ?, stage = ?, "
                "finished_at = ?, heartbeat = ? WHERE id = ? "
                "AND status IN ('queued', 'running')" + ("" if pid is None else " AND pid = ?"),
                (
                    status,
                    error[:MAX_TEXT] if error else None,
                    dumps(result, "result") if result is not None else None,
                    (stage or default_stage)[:MAX_TEXT],
                    now_iso(),
                    time.time(),
                    int(job_id),
                    *(() if pid is None else (int(pid),)),
                ),
            )
            return cur.rowcount > 0

    def discard_job(self, job_id: int) -> bool:
        """Mark an active job cancelled without reading its row (one that cannot be read
        frees its model's slot this way); False when it was not active."""
        with self._tx() as c:
            cur = c.execute(
                "UPDATE jobs SET status = 'cancelled', stage = 'Discarded', finished_at = ?, "
                "heartbeat = ? WHERE id = ? AND status IN ('queued', 'running')",
                (now_iso(), time.time(), int(job_id)),
            )
            return cur.rowcount > 0

    def requeue_job(self, job_id: int) -> None:
        """Queue an interrupted or failed job again (its worker is started anew).

        Raises:
            JobBusyError: Another job for its model is queued or running.
            DataError: No such job, or it is done or cancelled.
        """
        job = self.get_job(job_id)
        if job.status in ("done", "cancelled"):
            raise DataError(f"job #{job_id} is {job.status}; start a new one instead")
        try:
            with self._tx() as c:
                c.execute(
                    "UPDATE jobs SET status = 'queued', pid = NULL, heartbeat = ?, "
                    "cancel_requested = 0, error = NULL, finished_at = NULL, "
                    "stage = 'Queued (resumed)', done = 0, total = 0 WHERE id = ?",
                    (time.time(), job.id),
                )
        except sqlite3.IntegrityError as e:
            raise JobBusyError(job.model, self._active_id(job.model)) from e
