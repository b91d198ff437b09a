"""The shareable feature store: ``extract --out DIR`` writes Parquet shards keyed like the
cache, shards from two machines merge without duplicates, ``features import`` and
``evaluate --features`` bring them into the local cache, and hostile shards are
rejected row by row without stopping the good ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.cli import main
from core.contract import Features
from core.data import resolve_dataset
from core.detectors import make_detector
from core.extract import FeatureCache, extract_features
from core.featurestore import SCHEMA, import_store, read_manifest, shard_files, store_keys
from core.storage import Store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EXTRACT = ["extract", "--model", "tiny", "--device", "cpu", "--detectors", "nll,lexical"]


def _summary(out: str, start: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(start) or start in line)


def test_two_machines_shards_merge_without_duplicates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, tiny_model
) -> None:
    a, b = tmp_path / "machine-a", tmp_path / "machine-b"
    # two machines, each its own local cache, each half of the set (plus one overlap)
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "a.sqlite3"))
    assert main([*EXTRACT, "--dataset", "demo", "--shard", "0/2", "--out", str(a)]) == 0
    assert "0 examples held already, 12 rows written" in capsys.readouterr().out
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "b.sqlite3"))
    assert main([*EXTRACT, "--dataset", "demo", "--out", str(b), "--limit", "4"]) == 0
    capsys.readouterr()
    assert main([*EXTRACT, "--dataset", "demo", "--shard", "1/2", "--out", str(b)]) == 0
    capsys.readouterr()
    # re-running on a folder that holds everything traces and writes nothing
    before = shard_files(b)
    assert main([*EXTRACT, "--dataset", "demo", "--shard", "1/2", "--out", str(b)]) == 0
    assert "6 examples held already, 0 rows written" in capsys.readouterr().out
    assert shard_files(b) == before
    manifest = read_manifest(b)
    assert manifest["detectors"].keys() == {"nll", "lexical"} and manifest["datasets"].keys() == {
        "demo"
    }
    assert json.loads((b / "manifest.json").read_text())["shards"] == len(before)
    # a third machine merges both: every key once
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "c.sqlite3"))
    assert main(["features", "import", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    n_b = len(store_keys(b))
    overlap = len(store_keys(a) & store_keys(b))
    assert f"{a}: 12 imported, 0 already in the cache, 0 rejected" in out
    assert f"{b}: {n_b - overlap} imported, {overlap} already in the cache, 0 rejected" in out
    assert overlap > 0 and len(store_keys(a) | store_keys(b)) == 24
    # what was imported is what in-process extraction computes
    _, exs = resolve_dataset("demo")
    dets = [make_detector("nll"), make_detector("lexical")]
    fresh = extract_features(tiny_model, exs, dets)
    with Store(tmp_path / "c.sqlite3") as store:
        got = extract_features(tiny_model, exs, dets, cache=FeatureCache(store))
    assert got.computed == 0 and got.cache_hits == 12
    for n in ("nll", "lexical"):
        for x, y in zip(fresh.features[n], got.features[n], strict=True):
            np.testing.assert_allclose(x.response, y.response, rtol=1e-6)


def test_cached_features_export_without_tracing_and_evaluate_reads_a_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "local.sqlite3"))
    assert main([*EXTRACT, "--dataset", "demo"]) == 0
    capsys.readouterr()
    store_dir = tmp_path / "store"
    assert main([*EXTRACT, "--dataset", "demo", "--out", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "0 computed, 12 already stored" in out and "24 rows written" in out
    # elsewhere: evaluate --features merges the store first, then traces nothing
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "elsewhere.sqlite3"))
    args = ["evaluate", "--model", "tiny", "--dataset", "demo", "--detectors", "nll,lexical"]
    assert main([*args, "--features", str(store_dir), "--out", str(tmp_path / "runs")]) == 0
    err = capsys.readouterr().err
    assert f"{store_dir}: 24 imported" in err
    with Store(tmp_path / "elsewhere.sqlite3") as store:
        assert import_store(store_dir, store).present == 24


def _write(path: Path, rows: list[dict], schema: pa.Schema = SCHEMA) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def test_hostile_shards_are_rejected_row_by_row(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "src.sqlite3"))
    good_dir = tmp_path / "good"
    assert main([*EXTRACT, "--dataset", "demo", "--limit", "2", "--out", str(good_dir)]) == 0
    capsys.readouterr()
    (shard,) = shard_files(good_dir)
    rows = pq.read_table(shard).to_pylist()
    bad = tmp_path / "bad"
    bad.mkdir()
    first = dict(rows[0])
    liar = dict(rows[1], detector="lexical" if rows[1]["detector"] == "nll" else "nll")
    _write(
        bad / "part-x-000001.parquet",
        [
            dict(first, features=b"PK\x03\x04 not an npz"),  # garbage payload
            dict(first, model=""),  # empty key column
            liar,  # a payload that is not what its key says
            *rows[2:],  # good rows still come in
        ],
    )
    wrong = pa.schema([("model", pa.string()), ("features", pa.binary())])
    _write(bad / "part-y-000001.parquet", [{"model": "m", "features": b"x"}], schema=wrong)
    (bad / "part-z-000001.parquet").write_bytes(b"not parquet at all")
    (bad / "notes.txt").write_text("ignored")
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "dst.sqlite3"))
    assert main(["features", "import", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad}: {len(rows) - 2} imported, 0 already in the cache, 5 rejected" in out
    assert (
        "REJECTED part-x-000001.parquet row 0: feature cache: unreadable feature cache entry" in out
    )
    assert "REJECTED part-x-000001.parquet row 1: a key column" in out
    assert "REJECTED part-x-000001.parquet row 2: the payload is" in out
    assert "REJECTED part-y-000001.parquet: not a ragscope feature shard" in out
    assert "REJECTED part-z-000001.parquet: not a readable Parquet shard" in out
    assert main(["features", "import", str(tmp_path / "nowhere")]) == 2
    assert "no such folder" in capsys.readouterr().err
    with Store(tmp_path / "dst.sqlite3") as store:
        rec = store.get_analysis(
            example_hash=rows[3]["example_hash"],
            model=rows[3]["model"],
            detector=rows[3]["detector"],
            config_hash=rows[3]["config_hash"],
        )
    assert rec is not None and Features.from_bytes(rec.result).detector == rows[3]["detector"]
