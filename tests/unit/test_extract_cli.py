"""``ragscope extract``: every detector's features stored for every example, resumable,
shardable across processes, failures skipped and reported (or stopping the run)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from core.base.errors import DataError
from core.cli import main
from core.cli.features import parse_shard
from core.data import resolve_dataset, save_jsonl
from core.detectors import make_detector
from core.pipeline.extract import FeatureCache, extract_features
from core.storage import Store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARGS = ["extract", "--model", "tiny", "--device", "cpu", "--detectors", "nll,lexical"]


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "features.sqlite3"
    monkeypatch.setenv("RAGSCOPE_DB", str(path))
    return path


def _summary(out: str) -> str:
    return next(line for line in out.splitlines() if " examples of " in line)


def test_extract_stores_what_evaluation_reads_and_resumes(db: Path, capsys, tiny_model) -> None:
    assert main([*ARGS, "--dataset", "demo", "--shard", "0/2"]) == 0
    half = _summary(capsys.readouterr().out)
    assert "6 examples of demo (shard 0/2) x 2 detectors" in half and "6 computed" in half
    # the other shard (four examples per forward pass) and then the whole set: nothing
    # traced twice
    assert main([*ARGS, "--dataset", "demo", "--shard", "1/2", "--batch-size", "4"]) == 0
    assert "6 computed, 0 already stored" in _summary(capsys.readouterr().out)
    assert main([*ARGS, "--dataset", "demo"]) == 0
    assert "0 computed, 12 already stored, 0 failed" in _summary(capsys.readouterr().out)
    # stored under the keys the rest of ragscope reads, equal to in-process features
    _, exs = resolve_dataset("demo")
    dets = [make_detector("nll"), make_detector("lexical")]
    fresh = extract_features(tiny_model, exs, dets)
    with Store(db) as store:
        cached = extract_features(tiny_model, exs, dets, cache=FeatureCache(store))
    assert cached.computed == 0 and cached.cache_hits == len(exs)
    for n in ("nll", "lexical"):
        for a, b in zip(fresh.features[n], cached.features[n], strict=True):
            np.testing.assert_allclose(a.response, b.response, rtol=1e-5, atol=1e-6)


def test_failed_examples_are_skipped_and_reported_or_stop_the_run(
    db: Path, tmp_path: Path, capsys
) -> None:
    _, exs = resolve_dataset("demo")
    long = dataclasses.replace(exs[1], id="far-too-long", passages=("word " * 3000,))
    data = tmp_path / "mixed.jsonl"
    save_jsonl([exs[0], long, exs[2]], data)
    report = tmp_path / "report.json"
    argv = [*ARGS, "--dataset", str(data), "--report", str(report), "--batch-size", "3"]
    assert main(argv) == 1  # the bad example fails alone inside its batch
    out = capsys.readouterr().out
    assert "2 computed, 0 already stored, 1 failed" in _summary(out)
    assert "FAILED far-too-long:" in out
    rep = json.loads(report.read_text())
    assert rep["failed"] == 1 and rep["computed"] == 2 and rep["n"] == 3
    assert [f["example"] for f in rep["failures"]] == ["far-too-long"]
    # --on-error stop: the run ends at the bad example with an error naming it; what was
    # stored before stays (the first example is not traced again)
    data2 = tmp_path / "stop.jsonl"
    save_jsonl([exs[3], long, exs[4]], data2)
    assert main([*ARGS, "--dataset", str(data2), "--on-error", "stop"]) == 2
    assert "example 'far-too-long'" in capsys.readouterr().err
    assert main([*ARGS, "--dataset", str(data2)]) == 1
    assert "1 computed, 1 already stored, 1 failed" in _summary(capsys.readouterr().out)


def test_bad_shards_and_detectors_are_clear_errors(db: Path, capsys) -> None:
    assert parse_shard(None) is None and parse_shard("1/3") == (1, 3)
    for bad in ("2/2", "-1/2", "a/b", "3", "1/0"):
        with pytest.raises(DataError, match="I/N"):
            parse_shard(bad)
    assert main([*ARGS, "--dataset", "demo", "--shard", "2/2"]) == 2
    assert "0/2 and 1/2" in capsys.readouterr().err
    assert main([*ARGS[:-1], "no_such_detector", "--dataset", "demo"]) == 2
    assert "no_such_detector" in capsys.readouterr().err


def test_evaluate_with_a_batch_size_prefetches_in_batches(db: Path, tmp_path: Path, capsys) -> None:
    argv = ["evaluate", "--model", "tiny", "--device", "cpu", "--dataset", "demo"]
    argv += ["--detectors", "nll", "--batch-size", "4", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "features (local, batch size 4): 12 computed" in capsys.readouterr().err
