"""Background jobs without a model: the jobs table (one active job per model, cancel,
resume, hostile rows), how a job's state is read (stale heartbeat, dead or zombie
worker), and the worker's side (:class:`core.services.jobs.JobRunner`: publish, cancel by flag
and by signal, failure), none of which leaves a half-written artifact."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from core.base.errors import DataError
from core.base.paths import model_detectors_dir, model_slug
from core.services.jobs import (
    STALE_S,
    JobActor,
    JobPermissionError,
    JobRunner,
    TrainSpec,
    cancel_job,
    discard_job,
    job_log_path,
    job_view,
    launch_job,
    pid_alive,
    resume_job,
    staging_dir,
)
from core.storage import JobBusyError, JobRow, JobRowError, Store
from core.storage import db as storage_db

MODEL = "tiny-random-llama (seed 0)|L2xH4/KV2|D64|V49152|float32"
OTHER = "SmolLM2-135M-Instruct|L30xH9/KV3|D576|V49152|float32"
SPEC = TrainSpec.of(model="tiny", device="cpu", detectors=("nll", "context_gain"), dataset="demo")


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "db.sqlite3") as s:
        yield s


def _job(store: Store, tmp_path: Path, model: str = MODEL) -> int:
    out = tmp_path / "trained" / model_slug(model)
    return store.create_job(kind="train", model=model, spec=SPEC.to_dict(), out=str(out))


def _fake_artifact(folder: Path, name: str) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "cfg.json").write_text(json.dumps({"detector": name, "model": MODEL}))
    (folder / name / "weights.json").write_text("{}")


# --------------------------------------------------------------------------- the table


def test_one_active_job_per_model_and_its_life(store: Store, tmp_path: Path) -> None:
    first = _job(store, tmp_path)
    with pytest.raises(JobBusyError) as busy:
        _job(store, tmp_path)
    assert busy.value.job_id == first and f"job #{first}" in str(busy.value)
    other = _job(store, tmp_path, OTHER)  # another model is not blocked
    assert other != first

    row = store.claim_job(first, 4242)
    assert (row.status, row.pid, row.attempts, row.stage) == ("running", 4242, 1, "Starting")
    with pytest.raises(DataError, match="not queued"):
        store.claim_job(first, 4242)
    assert store.update_job(first, stage="Features", done=3, total=12) is False
    row = store.get_job(first)
    assert (row.stage, row.done, row.total) == ("Features", 3, 12)
    assert store.request_job_cancel(first) is True
    assert store.update_job(first, done=4) is True  # the worker learns it should stop
    assert store.finish_job(first, "cancelled") is True
    assert store.finish_job(first, "done") is False  # ended jobs stay ended
    assert store.request_job_cancel(first) is False
    assert store.get_job(first).status == "cancelled"

    second = _job(store, tmp_path)  # the model's slot is free again
    assert store.latest_job(MODEL).id == second
    store.claim_job(second, 1)
    store.finish_job(second, "failed", error="boom")
    third = _job(store, tmp_path)
    with pytest.raises(JobBusyError):  # a failed job resumes only while the slot is free
        store.requeue_job(second)
    store.finish_job(third, "done", result={"artifacts": {}})
    store.requeue_job(second)
    again = store.get_job(second)
    assert (again.status, again.error, again.pid) == ("queued", None, None)
    assert store.latest_job(MODEL).id == second  # the active one first
    with pytest.raises(DataError, match="start a new one"):
        store.requeue_job(third)


def test_a_job_cancelled_while_queued_is_never_run(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path)
    store.request_job_cancel(job)
    with JobRunner(store, job, out=store.get_job(job).out) as runner:
        runner.stage("Loading the model")  # the first stage stops it
        raise AssertionError("not reached")
    assert runner.status == "cancelled" and store.get_job(job).status == "cancelled"
    assert store.get_job(job).attempts == 0


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("spec", "'not json'", "spec is not JSON"),
        ("spec", "'[1, 2]'", "spec is not a JSON object"),
        ("done", "'many'", "done count is not a count"),
        ("heartbeat", "'soon'", "heartbeat is not a time"),
        ("status", "'exploded'", "status"),
        ("result", "'{'", "result is not JSON"),
        ("uid", "'../../../etc'", "uid is not 16 hex digits"),
        ("uid", "NULL", "uid is not 16 hex digits"),
        ("owner", "x'41'", "owner is not text"),
    ],
)
def test_hostile_rows_raise_a_named_error(
    store: Store, tmp_path: Path, column: str, value: str, says: str
) -> None:
    job = _job(store, tmp_path)
    raw = sqlite3.connect(store.path)
    raw.execute("PRAGMA ignore_check_constraints = ON")
    raw.execute(f"UPDATE jobs SET {column} = {value} WHERE id = ?", (job,))
    raw.commit()
    raw.close()
    with pytest.raises(JobRowError, match=says) as err:
        store.get_job(job)
    assert err.value.job_id == job and f"job #{job}" in str(err.value)
    if column == "status":  # no longer active: history, skipped
        assert store.latest_job(MODEL) is None
    else:  # the active row holds the model's slot: it must be seen
        with pytest.raises(JobRowError):
            store.latest_job(MODEL)
    listed = store.list_jobs(MODEL)
    assert len(listed) == 1 and isinstance(listed[0], JobRowError)
    discard_job(store, job)  # frees the model's slot without reading the row
    latest = store.latest_job(MODEL)
    assert latest is None or latest.status == "cancelled"
    assert _job(store, tmp_path) > job


def test_a_row_cannot_make_a_worker_publish_elsewhere(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGSCOPE_TRAINED_DIR", str(tmp_path / "trained"))
    job = store.create_job(kind="train", model=MODEL, spec=SPEC.to_dict(), out=str(tmp_path))
    with pytest.raises(DataError, match="not its model's folder"):
        launch_job(store, job)
    row = store.get_job(job)
    assert row.status == "failed" and row.pid is None


def _row_spec(**recipe: object) -> dict[str, object]:
    """SPEC as a row stores it, its recipe changed as given."""
    d = SPEC.to_dict()
    return {**d, "recipe": {**d["recipe"], **recipe}}  # type: ignore[dict-item]


def test_a_spec_from_a_row_is_checked() -> None:
    """A row stores the job's recipe; a hostile one is refused with the field named."""
    stored = SPEC.to_dict()
    assert set(stored) == {"device", "recipe"} and stored["recipe"] == SPEC.recipe.to_dict()
    assert TrainSpec.from_dict(json.loads(json.dumps(stored))) == SPEC
    bad = [
        (_row_spec(detectors=["nll", "rm -rf"]), "detectors"),
        (_row_spec(detectors=[]), "detectors"),
        (_row_spec(detectors="nll"), "detectors"),
        (_row_spec(limit=-3), "limit"),
        (_row_spec(dataset="a,b"), "dataset"),
        (_row_spec(dataset="/etc/passwd"), "dataset"),
        (_row_spec(model="tiny\n--out /etc"), "model"),
        (_row_spec(dataset="--out=/etc"), "dataset"),
        (_row_spec(extra=1), "extra"),
        (_row_spec(procedure="cv", cv=1), "cv"),
        (_row_spec(procedure="cv", cv=True), "cv"),
        (_row_spec(procedure="cv", cv="5; rm"), "cv"),
        (_row_spec(procedure="cv", cv=500), "cv"),
        # What a job from the app never sets (it could not show or resume it).
        (_row_spec(options={"nll": {"x": 1}}), "options"),
        (_row_spec(test_dataset="builtin"), "test_dataset"),
        ({**SPEC.to_dict(), "argv": ["--out", "/etc"]}, None),
        ({**SPEC.to_dict(), "recipe": "ragscope train"}, None),
    ]
    for d, field in bad:
        with pytest.raises(DataError) as err:
            TrainSpec.from_dict(d)
        if field is not None:
            assert err.value.field == field, (d, err.value)
    with pytest.raises(DataError):
        TrainSpec.from_dict(["not", "a", "dict"])
    # A row written before jobs stored recipes still reads (and is still checked).
    flat = {"model": "tiny", "device": "cpu", "detectors": ["nll", "context_gain"]}
    assert TrainSpec.from_dict({**flat, "dataset": "demo", "limit": None}) == SPEC
    with pytest.raises(DataError):
        TrainSpec.from_dict({**flat, "dataset": "demo", "cv": 1})
    # The command is the recipe's, with the device and the folder.
    assert SPEC.argv("/x y")[-4:] == ["--device", "cpu", "--out", "/x y"]
    assert SPEC.command("/x y") == (
        "ragscope train --model tiny --dataset demo --seed 0 --detectors nll,context_gain "
        "--device cpu --out '/x y'"
    )
    assert SPEC.command("/o") == SPEC.recipe.command(out="/o", device="cpu")


def test_a_nul_in_a_dataset_name_never_reaches_a_worker(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(DataError, match="U\\+0000"):
        TrainSpec.of(model="tiny", detectors=("nll",), dataset="stored:a\x00b")
    assert store.list_jobs() == []  # refused before any row is written
    # A row written by something else: the job fails with the reason, never a
    # ValueError that leaves it queued without a worker.
    monkeypatch.setenv("RAGSCOPE_TRAINED_DIR", str(tmp_path / "trained"))
    spec = _row_spec(dataset="stored:a\x00b")
    job = store.create_job(
        kind="train", model=MODEL, spec=spec, out=str(model_detectors_dir(MODEL))
    )
    with pytest.raises(DataError, match="cannot start.*U\\+0000"):
        launch_job(store, job)
    row = store.get_job(job)
    assert row.status == "failed" and "U+0000" in (row.error or "") and row.pid is None


def test_only_the_owner_or_an_admin_controls_a_job(store: Store, tmp_path: Path) -> None:
    out = str(tmp_path / "trained" / model_slug(MODEL))
    job = store.create_job(
        kind="train", model=MODEL, spec=SPEC.to_dict(), out=out, owner="alice@example.com"
    )
    assert store.get_job(job).owner == "alice@example.com"
    mallory = JobActor(id="sub:mallory@idp.example")
    for act in (cancel_job, discard_job, resume_job):
        with pytest.raises(JobPermissionError, match="started by 'alice@example.com'.*admin"):
            act(store, job, actor=mallory)
    row = store.get_job(job)
    assert row.status == "queued" and not row.cancel_requested  # untouched
    # An unreadable row still says whose it is.
    raw = sqlite3.connect(store.path)
    raw.execute("UPDATE jobs SET spec = 'x' WHERE id = ?", (job,))
    raw.commit()
    raw.close()
    with pytest.raises(JobPermissionError):
        discard_job(store, job, actor=mallory)
    raw = sqlite3.connect(store.path)
    raw.execute("UPDATE jobs SET spec = ? WHERE id = ?", (json.dumps(SPEC.to_dict()), job))
    raw.commit()
    raw.close()
    assert cancel_job(store, job, actor=JobActor(id="alice@example.com")) == "queued"
    assert store.get_job(job).cancel_requested
    other = store.create_job(
        kind="train", model=OTHER, spec=SPEC.to_dict(), out=out, owner="bob@example.com"
    )
    cancel_job(store, other, actor=JobActor(id="root@example.com", admin=True))
    assert store.get_job(other).cancel_requested
    # Without logins (no actor) anyone who reaches the app may, as before.
    third = store.create_job(kind="train", model=OTHER + "x", spec=SPEC.to_dict(), out=out)
    cancel_job(store, third)
    assert store.get_job(third).cancel_requested


def test_two_databases_never_share_a_log_or_a_staging_folder(tmp_path: Path) -> None:
    out = tmp_path / "trained" / model_slug(MODEL)
    rows = []
    for name in ("a.sqlite3", "b.sqlite3"):
        with Store(tmp_path / name) as s:
            job = s.create_job(kind="train", model=MODEL, spec=SPEC.to_dict(), out=str(out))
            rows.append((s.path, s.get_job(job)))
    (pa, a), (pb, b) = rows
    assert a.id == b.id == 1
    assert job_log_path(pa, a).parent == job_log_path(pb, b).parent  # one folder
    assert job_log_path(pa, a) != job_log_path(pb, b)
    assert staging_dir(out, a.uid) != staging_dir(out, b.uid)
    assert staging_dir(out, a.uid).parent == out.parent
    with pytest.raises(DataError, match="16 hex digits"):
        staging_dir(out, "../../etc")


def test_jobs_from_before_uids_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "old.sqlite3"
    with monkeypatch.context() as m:  # a database as ragscope with schema 5 left it
        m.setattr(storage_db, "SCHEMA_VERSION", 5)
        Store(path).close()
    raw = sqlite3.connect(path)
    raw.execute(
        "INSERT INTO jobs (kind, model, spec, out, status, created_at) "
        "VALUES ('train', ?, ?, '/x', 'done', 'now')",
        (MODEL, json.dumps(SPEC.to_dict())),
    )
    raw.commit()
    raw.close()
    with Store(path) as s:
        row = s.list_jobs()[0]
        assert isinstance(row, JobRow) and len(row.uid) == 16 and row.owner is None


def test_model_folders_are_safe_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSCOPE_TRAINED_DIR", str(tmp_path))
    slug = model_slug("../../etc|L2xH4/KV2|D64|V1|float32")
    assert "/" not in slug and not slug.startswith(".") and slug.startswith("etc-")
    assert model_slug(MODEL) != model_slug(MODEL.replace("float32", "float16"))
    assert model_detectors_dir(MODEL).parent == tmp_path


# --------------------------------------------------------------------------- reading state


def test_state_from_heartbeat_and_worker(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path)
    row = store.get_job(job)
    assert job_view(row).state == "queued"
    assert job_view(row, now=row.heartbeat + STALE_S + 1).state == "interrupted"
    store.claim_job(job, 1 << 30)  # no such process
    assert job_view(store.get_job(job)).state == "interrupted"

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 20
    while pid_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # exits, unreaped: a zombie, which is not alive
    assert not pid_alive(child.pid)
    child.wait()
    assert pid_alive(os.getpid())


def test_cancel_or_resume_an_interrupted_job(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path)
    row = store.claim_job(job, 1 << 30)
    staged = staging_dir(row.out, row.uid)
    _fake_artifact(staged, "nll")
    with pytest.raises(DataError, match="only an interrupted or failed"):
        resume_job(store, _job(store, tmp_path, OTHER))
    assert cancel_job(store, job) == "cancelled"
    assert store.get_job(job).status == "cancelled" and not staged.exists()
    assert not Path(row.out).exists()


# --------------------------------------------------------------------------- the worker


def test_runner_publishes_only_complete_artifacts(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path)
    out = Path(store.get_job(job).out)
    _fake_artifact(out, "nll")  # an older artifact, replaced whole
    (out / "nll" / "old-only.txt").write_text("old")
    with JobRunner(store, job, out=out) as runner:
        runner.stage("Features", total=2)
        runner.progress(1, 2)
        assert store.get_job(job).stage == "Features" and store.get_job(job).done == 1
        runner.progress(2, 2)
        assert store.get_job(job).stage == "Fitting and scoring"
        for name in ("nll", "context_gain"):
            _fake_artifact(runner.staging, name)
        assert not (out / "context_gain").exists()  # nothing shows before publishing
        published = runner.publish(["nll", "context_gain"])
        runner.result = {"artifacts": published}
    row = store.get_job(job)
    assert row.status == "done" and row.result == {"artifacts": published}
    assert sorted(p.name for p in out.iterdir()) == ["context_gain", "nll"]
    assert not (out / "nll" / "old-only.txt").exists()
    assert not runner.staging.exists()


def test_runner_cancelled_between_examples_leaves_nothing(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path)
    out = Path(store.get_job(job).out)
    with JobRunner(store, job, out=out) as runner:
        runner.stage("Features", total=10)
        _fake_artifact(runner.staging, "nll")  # half the work, staged
        store.request_job_cancel(job)
        runner.progress(1, 10)
        raise AssertionError("not reached")
    assert runner.status == "cancelled" and store.get_job(job).status == "cancelled"
    assert not out.exists() and not staging_dir(out, store.get_job(job).uid).exists()


def test_runner_cancelled_in_a_long_step_stops_by_signal(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path)
    out = Path(store.get_job(job).out)
    t0 = time.monotonic()
    with JobRunner(store, job, out=out) as runner:
        runner.stage("Fitting and scoring")
        with Store(store.path) as app:  # the app, another connection
            app.request_job_cancel(job)
        time.sleep(30)  # a fit with no progress callback: the heartbeat thread stops it
    assert runner.status == "cancelled" and time.monotonic() - t0 < 15
    assert not out.exists() and not staging_dir(out, store.get_job(job).uid).exists()


def test_a_resumed_job_belongs_to_its_new_worker(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path)
    out = Path(store.get_job(job).out)
    with JobRunner(store, job, out=out) as old:
        old.stage("Features", total=10)
        # Its heartbeat stalled, so the app took it for interrupted and resumed it.
        store.requeue_job(job)
        store.claim_job(job, 4242)
        old.progress(1, 10)  # the old worker learns it lost the job, and stops
        raise AssertionError("not reached")
    assert old.status == "cancelled"
    row = store.get_job(job)
    assert (row.status, row.pid, row.attempts) == ("running", 4242, 2)  # left alone
    assert staging_dir(out, store.get_job(job).uid).exists()  # the new worker's to use


def test_runner_failure_is_recorded_and_raised(store: Store, tmp_path: Path) -> None:
    job = _job(store, tmp_path)
    out = Path(store.get_job(job).out)
    with pytest.raises(DataError, match="the dataset is gone"):
        with JobRunner(store, job, out=out) as runner:
            _fake_artifact(runner.staging, "nll")
            raise DataError("the dataset is gone")
    row = store.get_job(job)
    assert row.status == "failed" and "the dataset is gone" in (row.error or "")
    assert not out.exists() and not staging_dir(out, store.get_job(job).uid).exists()
    with pytest.raises(DataError, match="publishes into"):
        store.requeue_job(job)
        JobRunner(store, job, out=tmp_path / "elsewhere").__enter__()
    assert store.get_job(job).status == "failed"


def test_a_job_is_a_recipe_of_the_panels_shape_and_its_device() -> None:
    """The job's spec is the recipe ``ragscope train`` checks, plus the device; what a
    job adds on top is checked once here: one named dataset, at most 20 folds, nothing
    the panel does not set."""
    assert SPEC.recipe.calibration is None and SPEC.device == "cpu"
    cv = TrainSpec.of(model="tiny", detectors=("nll",), dataset="demo", cv=5)
    assert cv.recipe.cv == 5 and cv.recipe.calibration == "crossfit"
    with pytest.raises(DataError) as err:
        TrainSpec.of(model="tiny", detectors=("nll",), dataset="demo", cv=21)
    assert err.value.field == "cv" and "at most 20 folds" in str(err.value)
    with pytest.raises(DataError) as err:
        TrainSpec(recipe=replace(SPEC.recipe, options={"nll": {"answer": True}}))
    assert err.value.field == "options"
    with pytest.raises(DataError) as err:
        TrainSpec(recipe=SPEC.recipe, device="--evil")
    assert err.value.field == "device"
