"""Training jobs end to end on the tiny model: the detached worker (``ragscope train
--job``) publishes the artifacts ``ragscope train`` makes with the same options; a
worker killed mid-run leaves nothing published and resumes from the feature cache; a
cancelled one leaves no artifact and no staging folder."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from core.base.paths import model_detectors_dir, runs_dir
from core.cli import main
from core.engine.model import LoadedModel
from core.learning.artifact import compare_artifacts
from core.services.jobs import (
    JobView,
    TrainSpec,
    cancel_job,
    job_log_path,
    job_view,
    pid_alive,
    resume_job,
    staging_dir,
    start_train_job,
)
from core.storage import JobRow, Store

WAIT_S = 180.0
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def job_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """A fresh database and trained-detectors folder (the workers inherit them); every
    worker still running at the end is stopped."""
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "jobs.sqlite3"))
    monkeypatch.setenv("RAGSCOPE_TRAINED_DIR", str(tmp_path / "trained"))
    # A cache dir of its own (the runs a CV job saves stay here), sharing the session's
    # model cache.
    models = Path(os.environ["RAGSCOPE_CACHE_DIR"]).expanduser() / "models"
    models.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "models").symlink_to(models, target_is_directory=True)
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    # The tiny model is latency-bound: on a shared small machine more threads only wait.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with Store() as store:
        yield store
        for row in store.list_jobs():
            if isinstance(row, JobRow) and row.active and pid_alive(row.pid):
                os.kill(row.pid, signal.SIGKILL)  # type: ignore[arg-type]


def _wait(store: Store, job: int, done: Callable[[JobView], bool]) -> JobView:
    deadline = time.monotonic() + WAIT_S
    while True:
        view = job_view(store.get_job(job))
        if done(view):
            return view
        if time.monotonic() > deadline:
            log = job_log_path(store.path, store.get_job(job))
            pytest.fail(
                f"job {job} stuck at {view.state}, {view.progress_text}:\n{log.read_text()}"
            )
        time.sleep(0.2)


def _log(store: Store, job: int) -> str:
    return job_log_path(store.path, store.get_job(job)).read_text()


def test_the_job_publishes_what_the_cli_trains(
    tiny_model: LoadedModel, job_env: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = TrainSpec.of(
        model="tiny", device="cpu", detectors=("nll", "context_gain"), dataset="demo"
    )
    key = tiny_model.info.key
    out = model_detectors_dir(key)
    job = start_train_job(job_env, spec, model_key=key)
    view = _wait(job_env, job, lambda v: not v.active)
    assert view.state == "done", _log(job_env, job)
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no staging left
    assert sorted(p.name for p in out.iterdir()) == ["context_gain", "nll"]
    assert set(view.row.result["artifacts"]) == {"nll", "context_gain"}
    assert view.row.result["features"]["computed"] == 12
    # The worker was given the job, not a rebuilt command line: it read the recipe the
    # row stores, and the artifacts record that recipe.
    started = _log(job_env, job).splitlines()[0]
    # the worker is core's job entry point, not the CLI module
    assert started.endswith(f"-m core.services.worker --job {job} --out {out}")
    assert "--dataset" not in started
    assert view.row.spec["recipe"] == spec.recipe.to_dict()
    for name in spec.recipe.detectors:
        cfg = json.loads((out / name / "cfg.json").read_text())
        assert cfg["trained_on"]["recipe"] == spec.recipe.to_dict()

    # The same command in a terminal, with a database of its own (features traced again).
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "cli.sqlite3"))
    cli_out = tmp_path / "cli-out"
    assert view.command() == spec.command(out)
    assert main(spec.argv(cli_out)) == 0
    for name in spec.recipe.detectors:
        assert compare_artifacts(out / name, cli_out / name) == []
        assert (out / name / "weights.json").read_bytes() == (
            cli_out / name / "weights.json"
        ).read_bytes()
        recipe = json.loads((out / name / "cfg.json").read_text())["trained_on"]["recipe"]
        assert recipe["model"] == "tiny" and recipe["dataset"] == "demo"


def test_killed_job_resumes_from_the_cache_and_cancel_leaves_nothing(
    tiny_model: LoadedModel, job_env: Store
) -> None:
    key = tiny_model.info.key
    out = model_detectors_dir(key)
    spec = TrainSpec.of(model="tiny", device="cpu", detectors=("nll",), dataset="builtin", limit=40)
    job = start_train_job(job_env, spec, model_key=key)
    running = _wait(job_env, job, lambda v: v.row.stage == "Features" and v.row.done >= 4)
    os.kill(running.row.pid, signal.SIGKILL)  # type: ignore[arg-type]  # a crash
    _wait(job_env, job, lambda v: v.state == "interrupted")
    assert not out.exists()  # nothing published

    resume_job(job_env, job)
    view = _wait(job_env, job, lambda v: not v.active)
    assert view.state == "done" and view.row.attempts == 2, _log(job_env, job)
    features = view.row.result["features"]
    assert features["cache_hits"] >= running.row.done, features
    assert features["computed"] + features["cache_hits"] == 40 - features["n_errors"]
    assert sorted(p.name for p in out.iterdir()) == ["nll"]
    nll_cfg = (out / "nll" / "cfg.json").read_bytes()

    # Cancel a second job mid-extraction: no artifact, no staging folder.
    spec2 = TrainSpec.of(
        model="tiny", device="cpu", detectors=("nll", "lookback_lens"), dataset="builtin", limit=40
    )
    job2 = start_train_job(job_env, spec2, model_key=key)
    _wait(job_env, job2, lambda v: v.row.stage == "Features" and v.row.done >= 2)
    assert cancel_job(job_env, job2) == "running"
    view2 = _wait(job_env, job2, lambda v: not v.active)
    assert view2.state == "cancelled", _log(job_env, job2)
    assert sorted(p.name for p in out.iterdir()) == ["nll"]  # the first job's, untouched
    assert (out / "nll" / "cfg.json").read_bytes() == nll_cfg
    assert not staging_dir(out, view2.row.uid).exists()
    deadline = time.monotonic() + 30
    while pid_alive(view2.row.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(view2.row.pid)  # the worker exits


def test_a_cv_job_trains_on_every_answer_and_reports_its_folds(
    tiny_model: LoadedModel, job_env: Store
) -> None:
    spec = TrainSpec.of(
        model="tiny", device="cpu", detectors=("nll",), dataset="builtin", limit=40, cv=3
    )
    assert spec.command("X") == (
        "ragscope train --model tiny --dataset builtin --cv 3 --calibration crossfit "
        "--limit 40 --seed 0 --detectors nll --device cpu --out X"
    )
    assert TrainSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    key = tiny_model.info.key
    job = start_train_job(job_env, spec, model_key=key)
    view = _wait(job_env, job, lambda v: not v.active)
    assert view.state == "done", _log(job_env, job)
    assert view.row.result["auroc_from"] == "3-fold CV"
    assert [p.name.endswith("-cv3-builtin.json") for p in runs_dir().glob("*.json")] == [True]
    assert 0.0 <= view.row.result["auroc"]["nll"] <= 1.0
    cfg = json.loads((model_detectors_dir(key) / "nll" / "cfg.json").read_text())
    assert cfg["trained_on"]["recipe"]["cv"] == 3
    # Every answer trained the artifact (no test split held out); calibration read all.
    proc = cfg["train"]["procedure"]
    assert proc["calibration"] == "crossfit"
    assert proc["n_fit"] + proc["n_validation"] == proc["n_calibration"] >= 40, proc
