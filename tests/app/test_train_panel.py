"""Training detectors for a model that has none (AppTest, tiny model): Home offers the
form with an estimate and the equivalent command; the job runs in its own process, its
progress shows on every detector page and in a new session (a reload), its artifacts
load without a restart, and a cancelled job leaves nothing behind."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import core.data.catalog as catalog
from app.state.jobs import (
    KEY_TRAIN_CANCEL,
    KEY_TRAIN_CV,
    KEY_TRAIN_DATASET,
    KEY_TRAIN_DETECTORS,
    KEY_TRAIN_DISCARD,
    KEY_TRAIN_LIMIT,
    KEY_TRAIN_OPEN,
    KEY_TRAIN_RESUME,
    KEY_TRAIN_START,
)
from core.base.paths import model_detectors_dir
from core.data import builtin_examples, stored_spec
from core.services.jobs import TrainSpec, job_log_path
from core.storage import JobRow, Store

HEADS = "views/heads.py"
GAM = "views/gam.py"
HOME = "views/home.py"
WAIT_S = 150.0


@pytest.fixture
def jobs_env(app_env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The app's environment for jobs; any worker still running at the end is stopped."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the tiny model: more threads only wait
    yield app_env
    with Store(app_env) as store:
        for row in store.list_jobs():
            if isinstance(row, JobRow) and row.active and row.pid:
                try:
                    os.kill(row.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _text(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption]
    parts += [i.value for i in at.info] + [s.value for s in at.success]
    parts += [w.value for w in at.warning] + [c.value for c in at.sidebar.caption]
    parts += [p.proto.text for p in at.get("progress")]
    return "\n".join(parts)


def _until(at: AppTest, done: Callable[[AppTest], bool], what: str) -> AppTest:
    deadline = time.monotonic() + WAIT_S
    while not done(at):
        assert time.monotonic() < deadline, f"{what}:\n{_text(at)}"
        time.sleep(0.5)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
    return at


def _open_form(at: AppTest, detectors: list[str], dataset: str, limit: int) -> None:
    at.session_state[KEY_TRAIN_DETECTORS] = detectors
    at.session_state[KEY_TRAIN_DATASET] = dataset
    at.session_state[KEY_TRAIN_LIMIT] = limit
    at.session_state[KEY_TRAIN_OPEN] = True
    at.run()


def test_train_detectors_in_the_background(
    make_app: Callable[[], AppTest], jobs_env: Path, no_exception, tiny_model, tmp_path: Path
) -> None:
    at = make_app().run()
    no_exception(at)
    assert "No detectors are trained for this model yet" in _text(at)
    assert [e.label for e in at.expander if "Train detectors" in e.label]
    assert not at.get("multiselect")  # the form renders only once opened

    _open_form(at, ["nll", "context_gain"], "demo", 0)
    no_exception(at)
    text = _text(at)
    # One example was timed here (its features kept in the cache), the rest are to trace.
    assert "Estimated time on this machine" in text
    assert re.search(r"1[12] of 12 examples to trace", text), text
    train = "ragscope train --model tiny --dataset demo --seed 0 --detectors nll,context_gain"
    assert f"{train} --device cpu --out " in text
    assert "--cv" not in text
    # CV folds: the command gains --cv K; one fold is refused with the reason.
    at.number_input(key=KEY_TRAIN_CV).set_value(3).run()
    assert "--cv 3 --calibration crossfit --seed 0 --detectors nll,context_gain" in _text(at)
    at.number_input(key=KEY_TRAIN_CV).set_value(1).run()
    assert "cv must be a whole number from 2 to 100" in " ".join(e.value for e in at.error)
    assert at.button(key=KEY_TRAIN_START).disabled
    at.number_input(key=KEY_TRAIN_CV).set_value(0).run()
    at.button(key=KEY_TRAIN_START).click().run()
    no_exception(at)
    assert "Job #1" in _text(at) and at.button(key=KEY_TRAIN_CANCEL)

    # Another page shows the same job; so does a new session (a browser reload).
    at.switch_page(HEADS).run()
    no_exception(at)
    assert "Job #1" in _text(at)
    fresh = make_app().run()
    assert "Job #1" in _text(fresh) and fresh.get("progress")

    # It ends; its artifacts load on the next run, with no restart.
    # (The artifacts appear as soon as they are published, a moment before the job is
    # marked finished: wait for both.)
    finished = "Job #1: `nll`, `context_gain` on `demo` finished"
    _until(
        fresh,
        lambda a: "trained set · 2 for this model" in _text(a) and finished in _text(a),
        "not trained",
    )
    no_exception(fresh)
    out = model_detectors_dir(tiny_model.info.key)
    assert sorted(p.name for p in out.iterdir()) == ["context_gain", "nll"]
    _until(at, lambda a: "trained set · 2 for this model" in _text(a), "not on the page")
    assert "Job #1" not in _text(at)  # detector pages drop the panel once trained

    # A second job, cancelled mid-run: nothing of it is published.
    fresh.session_state[KEY_TRAIN_OPEN] = True  # Home: "Train more detectors"
    _open_form(fresh, ["lookback_lens"], "builtin", 400)
    fresh.button(key=KEY_TRAIN_START).click().run()
    _until(fresh, lambda a: "Features" in _text(a), "no progress")
    fresh.button(key=KEY_TRAIN_CANCEL).click().run()
    _until(fresh, lambda a: "was cancelled" in _text(a), "not cancelled")
    no_exception(fresh)
    assert sorted(p.name for p in out.iterdir()) == ["context_gain", "nll"]
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no staging left


def test_interrupted_and_unreadable_jobs(
    make_app: Callable[[], AppTest], jobs_env: Path, no_exception, tiny_model
) -> None:
    key = tiny_model.info.key
    spec = TrainSpec.of(model="tiny", device="cpu", detectors=("nll",), dataset="demo")
    out = str(model_detectors_dir(key))
    with Store(jobs_env) as store:
        job = store.create_job(kind="train", model=key, spec=spec.to_dict(), out=out)
        store.claim_job(job, 1 << 30)  # its worker is gone (the machine restarted)
    at = make_app().run()
    no_exception(at)
    assert "was interrupted" in _text(at) and at.button(key=KEY_TRAIN_RESUME)
    at.switch_page(GAM).run()
    assert "was interrupted" in _text(at)
    at.button(key=KEY_TRAIN_DISCARD).click().run()
    no_exception(at)
    assert "was interrupted" not in _text(at)
    with Store(jobs_env) as store:
        assert store.get_job(job).status == "cancelled"

        # Resume starts its worker again; cancelled before it gets going, it stops.
        job2 = store.create_job(kind="train", model=key, spec=spec.to_dict(), out=out)
        store.claim_job(job2, 1 << 30)
    at.switch_page(HOME).run()
    at.button(key=KEY_TRAIN_RESUME).click().run()
    no_exception(at)
    assert f"Job #{job2}" in _text(at) and at.get("progress")
    at.button(key=KEY_TRAIN_CANCEL).click().run()
    _until(at, lambda a: f"Job #{job2}" in _text(a) and "was cancelled" in _text(a), "running")

    # A row something else wrote: a named error, never an exception; Discard frees it.
    with Store(jobs_env) as store:
        job3 = store.create_job(kind="train", model=key, spec=spec.to_dict(), out=out)
    raw = sqlite3.connect(jobs_env)
    raw.execute("UPDATE jobs SET spec = '{\"model\": [1]' WHERE id = ?", (job3,))
    raw.commit()
    raw.close()
    at.run()
    assert not at.exception and any("cannot be read" in e.value for e in at.error)
    at.button(key=KEY_TRAIN_DISCARD).click().run()
    no_exception(at)
    with Store(jobs_env) as store:
        assert store.list_jobs(key)[0].__class__.__name__ == "JobRowError"
        assert store.latest_job(key).id == job2  # the unreadable row is history now


MARKER = "TOP-SECRET-FIRST-LINE"


def test_a_stored_dataset_named_like_a_server_file_trains_on_its_stored_rows(
    make_app: Callable[[], AppTest],
    jobs_env: Path,
    no_exception,
    tiny_model,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = tmp_path / "srv" / "x.csv"
    secret.parent.mkdir()
    secret.write_text(f"{MARKER},passages,response\n" + "q,p,r\n" * 30)
    with Store(jobs_env) as store:
        store.import_dataset(str(secret), builtin_examples(), source="upload", fmt="ragscope")
    opened: list[str] = []
    real = catalog.load_dataset

    def spy(path, *a, **kw):
        opened.append(str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(catalog, "load_dataset", spy)
    at = make_app().run()
    _open_form(at, ["nll"], stored_spec(str(secret)), 0)
    no_exception(at)
    shown = _text(at) + "\n".join(e.value for e in at.error)
    # 12 to trace, or 11 when this test timed the first one here (kept in the cache)
    assert re.search(r"1[12] of 12 examples to trace", shown), shown
    assert f"--dataset stored:{secret} " in shown
    assert MARKER not in shown and str(secret) not in opened
    at.button(key=KEY_TRAIN_START).click().run()
    no_exception(at)
    with Store(jobs_env) as store:
        job = store.list_jobs()[0]
        assert isinstance(job, JobRow) and job.spec["recipe"]["dataset"] == f"stored:{secret}"
    deadline = time.monotonic() + WAIT_S
    while True:  # the worker reads the same name from the store
        with Store(jobs_env) as store:
            row = store.get_job(job.id)
        if not row.active or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    log = job_log_path(jobs_env, row).read_text()
    assert row.status == "done", log
    # Every example read (the one the estimate timed comes from the feature cache).
    feats = row.result["features"]
    assert feats["computed"] + feats["cache_hits"] == 12 and MARKER not in log


def test_with_logins_only_the_owner_or_an_admin_controls_a_job(
    make_app: Callable[[], AppTest],
    jobs_env: Path,
    no_exception,
    tiny_model,
    monkeypatch: pytest.MonkeyPatch,
    with_login: Callable[..., AppTest],
) -> None:
    key = tiny_model.info.key
    spec = TrainSpec.of(model="tiny", device="cpu", detectors=("nll",), dataset="demo")
    out = str(model_detectors_dir(key))
    with Store(jobs_env) as store:
        job = store.create_job(
            kind="train", model=key, spec=spec.to_dict(), out=out, owner="bob@example.com"
        )
        store.claim_job(job, 1 << 30)  # interrupted
    user = {"is_logged_in": True, "email": "alice@example.com", "email_verified": True}

    def as_alice() -> AppTest:
        return with_login(make_app(), user).run()

    at = as_alice()
    no_exception(at)
    assert "was interrupted" in _text(at) and "started by `bob@example.com`" in _text(at)
    assert "Only the user who started this job or an admin" in _text(at)
    assert at.button(key=KEY_TRAIN_RESUME).disabled and at.button(key=KEY_TRAIN_DISCARD).disabled
    monkeypatch.setenv("RAGSCOPE_ADMINS", "root@example.com, alice@example.com")
    at = as_alice()
    assert not at.button(key=KEY_TRAIN_DISCARD).disabled
    at.button(key=KEY_TRAIN_DISCARD).click().run()
    no_exception(at)
    with Store(jobs_env) as store:
        assert store.get_job(job).status == "cancelled"
