"""``ragscope extract --engine ray``: a local Ray with two CPU actors and the tiny model
gives the in-process features; a killed actor, a stopped driver and a two-node cluster
still yield the complete set, each row once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from core.base.errors import DataError  # noqa: E402
from core.cli import main  # noqa: E402
from core.data import resolve_dataset  # noqa: E402
from core.detectors import make_detector  # noqa: E402
from core.pipeline.extract import FeatureCache, extract_features  # noqa: E402
from core.pipeline.featurestore import ShardWriter, feature_key, shard_files, store_keys  # noqa: E402
from core.services.distributed import RayOptions, extract_ray, release_actors  # noqa: E402
from core.storage import Store  # noqa: E402

NAMES = ["nll", "lexical"]


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray (2 CPUs) for the module's single-node tests."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def demo():
    return resolve_dataset("demo")[1]


@pytest.fixture(scope="module")
def reference(tiny_model, demo):
    """In-process features of the demo set (the bar the Ray path must meet)."""
    dets = [make_detector(n) for n in NAMES]
    ext = extract_features(tiny_model, demo, dets)
    return {n: {f.example_id: f for f in ext.features[n]} for n in NAMES}


def _run(tiny_model, examples, folder: Path, *, progress=None, on_error="skip"):
    flat = [make_detector(n) for n in NAMES]
    writer = ShardWriter(folder, manifest={"model": tiny_model.info.key})

    def sink(ex, rows):
        added = sum(writer.add(k, ex, f) for k, f in rows)
        writer.example_done()
        return added

    try:  # a stopped driver keeps what it finished (the CLI closes its writer likewise)
        return extract_ray(
            model_spec="tiny",
            model_key=tiny_model.info.key,
            examples=examples,
            detectors=NAMES,
            detector_options={},
            flat=flat,
            holds=writer.holds,
            sink=sink,
            options=RayOptions(actors=2, device="cpu", on_error=on_error),
            progress=progress,
        )
    finally:
        writer.close()


def _check_complete(folder: Path, tiny_model, demo, reference) -> None:
    """Every (example, detector) once, equal to in-process extraction."""
    flat = [make_detector(n) for n in NAMES]
    want = {feature_key(tiny_model.info.key, e, d) for e in demo for d in flat}
    keys = store_keys(folder)
    assert keys == want
    import pyarrow.parquet as pq

    rows = [r for f in shard_files(folder) for r in pq.read_table(f).to_pylist()]
    assert len(rows) == len(want)  # no duplicates across shards
    from core.learning.contract import Features

    for r in rows:
        got = Features.from_bytes(r["features"], example_id=r["example_id"])
        ref = reference[r["detector"]][r["example_id"]]
        # Same code on the same CPU: equal to float rounding (torch may pick other
        # kernels per process), checked to 1e-6.
        np.testing.assert_allclose(got.response, ref.response, rtol=1e-6, atol=1e-6)


def test_ray_features_equal_in_process_extraction(local_ray, tiny_model, demo, reference, tmp_path):
    rep = _run(tiny_model, demo, tmp_path / "store")
    assert rep.examples == len(demo) and rep.held == 0 and not rep.failures
    assert rep.rows_written == len(demo) * len(NAMES) and rep.duplicates == 0
    _check_complete(tmp_path / "store", tiny_model, demo, reference)


def _actor_pids() -> list[int]:
    """The extraction actors' processes (Ray names them after the actor class)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"ExtractActor" in cmd:
            pids.append(int(proc.name))
    return sorted(pids)


def test_the_next_extraction_reuses_the_actors_until_they_are_released(
    local_ray, tiny_model, demo, reference, tmp_path
):
    """A second run in the process (other examples, another store) is served by the same
    two actors and their loaded models; released, they are gone, and the next run
    starts new ones."""
    _run(tiny_model, demo[:6], tmp_path / "a")
    first = _actor_pids()
    assert len(first) == 2
    rep = _run(tiny_model, demo, tmp_path / "b")
    assert rep.examples == len(demo) and not rep.failures and rep.duplicates == 0
    assert _actor_pids() == first
    _check_complete(tmp_path / "b", tiny_model, demo, reference)
    release_actors()
    deadline = time.monotonic() + 60
    while set(_actor_pids()) & set(first):
        assert time.monotonic() < deadline, "released actors are still running"
        time.sleep(0.2)
    _run(tiny_model, demo[:2], tmp_path / "c")
    again = _actor_pids()
    assert len(again) == 2 and not set(again) & set(first)


def test_a_killed_actor_loses_and_duplicates_nothing(
    local_ray, tiny_model, demo, reference, tmp_path
):
    killed: list[int] = []
    actor_pids = _actor_pids

    def kill_one(done: int, total: int) -> None:
        if not killed and (pids := actor_pids()):
            killed.append(pids[0])
            os.kill(pids[0], signal.SIGKILL)

    rep = _run(tiny_model, demo, tmp_path / "store", progress=kill_one)
    assert killed, "no actor was killed"
    assert not rep.failures
    _check_complete(tmp_path / "store", tiny_model, demo, reference)


def test_a_restarted_driver_resumes(local_ray, tiny_model, demo, reference, tmp_path):
    folder = tmp_path / "store"

    class Stop(Exception):
        pass

    def stop_after_four(done: int, total: int) -> None:
        if done >= 4:
            raise Stop

    with pytest.raises(Stop):
        _run(tiny_model, demo, folder, progress=stop_after_four)
    first = store_keys(folder)
    assert 0 < len(first) < len(demo) * len(NAMES)
    rep = _run(tiny_model, demo, folder)
    assert rep.held == len(first) // len(NAMES)  # whole examples were stored, then skipped
    assert rep.examples == len(demo) - rep.held and rep.duplicates == 0
    _check_complete(folder, tiny_model, demo, reference)


def test_worker_errors_name_the_example(local_ray, tiny_model, demo, tmp_path):
    import dataclasses

    bad = dataclasses.replace(demo[0], id="far-too-long", passages=("word " * 3000,))
    rep = _run(tiny_model, [bad, demo[1]], tmp_path / "store")
    assert [f["example"] for f in rep.failures] == ["far-too-long"]
    assert "far-too-long" in rep.failures[0]["error"]
    assert rep.examples == 2 and rep.rows_written == len(NAMES)
    with pytest.raises(DataError, match="far-too-long"):
        _run(tiny_model, [bad], tmp_path / "other", on_error="stop")


def test_cli_engine_ray_fills_the_local_cache(
    local_ray, tiny_model, demo, reference, tmp_path, monkeypatch, capsys
):
    db = tmp_path / "cache.sqlite3"
    monkeypatch.setenv("RAGSCOPE_DB", str(db))
    argv = ["extract", "--model", "tiny", "--device", "cpu", "--dataset", "demo"]
    argv += ["--detectors", ",".join(NAMES), "--engine", "ray", "--actors", "2"]
    assert main([*argv, "--out", str(tmp_path / "store")]) == 0
    out = capsys.readouterr().out
    assert f"{len(demo)} computed, 0 already stored, 0 failed" in out
    with Store(db) as store:
        cached = extract_features(
            tiny_model, demo, [make_detector(n) for n in NAMES], cache=FeatureCache(store)
        )
    assert cached.computed == 0  # everything came from the Ray run
    assert main([*argv, "--out", str(tmp_path / "store")]) == 0
    assert f"{len(demo)} examples held already, 0 rows written" in capsys.readouterr().out
    assert main(argv) == 0  # without a store: the local cache holds them all
    assert f"0 computed, {len(demo)} already stored" in capsys.readouterr().out


def test_train_and_evaluate_extract_on_ray(local_ray, tmp_path, monkeypatch, capsys):
    """``--engine ray`` on evaluate/train fills the cache on Ray first; the run then
    reads every feature from the cache."""
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "cache.sqlite3"))
    argv = ["--model", "tiny", "--device", "cpu", "--dataset", "demo", "--detectors", "nll"]
    argv += ["--engine", "ray", "--actors", "2"]
    assert main(["train", *argv, "--out", str(tmp_path / "artifacts")]) == 0
    err = capsys.readouterr().err
    assert "features (ray, batch size default): 12 computed, 0 already stored" in err
    assert (tmp_path / "artifacts" / "nll" / "cfg.json").is_file()
    assert main(["evaluate", *argv, "--out", str(tmp_path / "runs")]) == 0
    assert "0 computed, 12 already stored" in capsys.readouterr().err


# Last: the bench starts actors of its own (a cold start: the pooled ones are released),
# and the cluster test replaces the module's local Ray.


def test_bench_times_extraction_on_ray(local_ray, capsys):
    import json

    argv = ["bench", "--model", "tiny", "--device", "cpu", "--no-cold", "--repeats", "1"]
    argv += ["--tokens", "80", "--extraction", "3", "--dataset", "demo", "--batch-sizes", ""]
    argv += ["--features", "", "--aarf", "0", "--ray-actors", "2", "--json"]
    assert main(argv) == 0
    ext = json.loads(capsys.readouterr().out)["extraction"]
    assert ext["dataset"] == "demo" and ext["n_examples"] == 3
    assert ext["ray_s"] > 0 and ext["ray_actors"] == 2


def test_a_two_node_cluster(tiny_model, demo, reference, tmp_path, local_ray):
    from ray.cluster_utils import Cluster

    ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert len(nodes) == 2
        _run(tiny_model, demo, tmp_path / "store")
        _check_complete(tmp_path / "store", tiny_model, demo, reference)
    finally:
        ray.shutdown()
        cluster.shutdown()
