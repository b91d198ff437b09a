"""The shareable feature store: ``extract --out DIR`` writes Parquet shards keyed like the
cache, shards from two machines merge without duplicates, ``features import`` and
``evaluate --features`` bring them into the local cache, and hostile shards are
rejected row by row without stopping the good ones."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from numpy.lib import format as npformat

from core.cli import main
from core.data import resolve_dataset
from core.detectors import make_detector
from core.learning.contract import Features
from core.pipeline import featurestore
from core.pipeline.extract import FeatureCache, extract_features
from core.pipeline.featurestore import SCHEMA, import_store, read_manifest, shard_files, store_keys
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
    assert manifest["detectors"].keys() == {"nll", "lexical"}
    assert manifest["datasets"].keys() == {"ragscope-demo"}  # the dataset its records name
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


@pytest.fixture(scope="module")
def good_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[pa.Schema, list[dict]]:
    """A store of four demo examples x (nll, lexical): its shard's schema (with the
    writer's manifest) and rows."""
    root = tmp_path_factory.mktemp("good")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAGSCOPE_DB", str(root / "src.sqlite3"))
        assert main([*EXTRACT, "--dataset", "demo", "--limit", "4", "--out", str(root / "s")]) == 0
    (shard,) = shard_files(root / "s")
    return pq.read_schema(shard), pq.read_table(shard).to_pylist()


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
    liar["config_hash"] = next(r["config_hash"] for r in rows if r["detector"] == liar["detector"])
    _write(
        bad / "part-x-000001.parquet",
        [
            dict(first, features=b"PK\x03\x04 not an npz"),  # garbage payload
            dict(first, model=""),  # empty key column
            liar,  # a payload that is not what its key says
            *rows[2:],  # good rows still come in
        ],
        schema=pq.read_schema(shard),  # with the writer's manifest
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


# ----------------------------------------------------------------------------- poisoned rows


def _payload(feats: Features, **change: object) -> bytes:
    """``feats``' cache payload with header fields or arrays changed, written the way
    :meth:`Features.to_bytes` writes one (so only the change can make it wrong)."""
    arrays = {
        k: v
        for k in ("response", "tokens", "token_offsets", "chunks", "chunk_offsets")
        if (v := getattr(feats, k)) is not None
    }
    meta = {
        "detector": feats.detector,
        "example_id": feats.example_id,
        "model": feats.model,
        "names": list(feats.names),
        "token_names": list(feats.token_names),
        "chunk_names": list(feats.chunk_names),
    }
    for k, v in change.items():
        (arrays if k in arrays else meta)[k] = v
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    return buf.getvalue()


def _declares(feats: Features, shape: tuple[int, ...]) -> bytes:
    """``feats``' payload whose response array's ``.npy`` header declares ``shape``."""
    header = io.BytesIO()
    npformat.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": shape}
    )
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(_payload(feats))) as src, zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            data = header.getvalue() if name == "response.npy" else src.read(name)
            dst.writestr(name, data, zipfile.ZIP_DEFLATED)
    return out.getvalue()


def test_poisoned_rows_are_refused_naming_file_and_row(
    good_store: tuple[pa.Schema, list[dict]], tmp_path: Path
) -> None:
    schema, rows = good_store
    _, exs = resolve_dataset("demo")
    nll = [r for r in rows if r["detector"] == "nll"]
    good, other = nll[0], nll[1]
    f = Features.from_bytes(other["features"])
    offs = np.asarray(f.token_offsets)
    n = len(f.names)
    poisoned = [
        dict(other, features=_payload(f, response=np.full(n, np.nan, np.float32))),
        dict(other, features=_payload(f, tokens=np.full_like(f.tokens, np.inf))),
        dict(other, features=_payload(f, names=[f"x{i}" for i in range(n)])),
        dict(other, features=_payload(f, response=np.zeros(n + 2, np.float32))),
        dict(other, features=_payload(f, token_offsets=offs[:, ::-1].copy())),
        dict(other, features=_payload(f, token_offsets=offs + 10_000)),
        dict(other, features=_payload(f, token_offsets=offs.astype(np.float32))),
        dict(other, config_hash="0" * 16),
        dict(other, example_hash=good["example_hash"]),  # another example's hash
        dict(other, features=_declares(f, (1 << 38,))),  # a 1 TiB array in a few hundred bytes
    ]
    folder = tmp_path / "poisoned"
    folder.mkdir()
    rest = [r for r in rows if r is not other and r is not good]
    _write(folder / "part-p-000001.parquet", [good, *poisoned, *rest], schema=schema)
    with Store(tmp_path / "dst.sqlite3") as store:
        rep = import_store(folder, store, examples=exs)
        assert rep.imported == 1 + len(rest) and rep.present == 0
        why = dict(r.split(": ", 1) for r in rep.rejected)
        assert len(why) == len(poisoned)
        at = [why[f"part-p-000001.parquet row {i}"] for i in range(1, len(poisoned) + 1)]
        assert f"'response' holds {n} NaN or infinite values" in at[0]
        assert "'tokens' holds" in at[1] and "NaN or infinite" in at[1]
        assert "other names than the store's other nll rows" in at[2]
        assert "response values for" in at[3]  # a shape that is not its names'
        assert "impossible character ranges" in at[4]
        assert "offsets reach character" in at[5] and "features of another example" in at[5]
        assert "'token_offsets' is not [n, 2] integer offsets" in at[6]
        assert "config hash 0000000000000000 is not " in at[7]
        assert "the hash of the nll config the shard's manifest records" in at[7]
        assert "but the local example" in at[8] and "another example's hash" in at[8]
        assert "response.npy declares 1,099,511,627,776 bytes of float32 but holds" in at[9]
        # nothing of `other` came in; what was good did
        key = {k: other[k] for k in ("example_hash", "model", "detector", "config_hash")}
        assert store.get_analysis(**key) is None
        assert store.has_analysis(**{k: good[k] for k in key})


def test_rows_that_do_not_fit_their_example_are_recomputed_not_used(
    good_store: tuple[pa.Schema, list[dict]], tmp_path: Path, tiny_model
) -> None:
    """A row filed under another example's hash (its id and dataset too) passes an import
    that does not know the example; when the example is used, its offsets are not the
    example's tokens, so it is recomputed and overwritten, never used."""
    schema, rows = good_store
    _, exs = resolve_dataset("demo")
    by_id = {e.id: e for e in exs}
    nll = [r for r in rows if r["detector"] == "nll"]
    a, b = nll[0], nll[1]
    fa, fb = Features.from_bytes(a["features"]), Features.from_bytes(b["features"])
    assert fa.token_offsets.shape != fb.token_offsets.shape
    misfiled = dict(a, example_hash=b["example_hash"], example_id=b["example_id"])
    folder = tmp_path / "misfiled"
    folder.mkdir()
    _write(folder / "part-m-000001.parquet", [misfiled], schema=schema)
    det = make_detector("nll")
    with Store(tmp_path / "dst.sqlite3") as store:
        assert import_store(folder, store).imported == 1
        got = extract_features(
            tiny_model, [by_id[b["example_id"]]], [det], cache=FeatureCache(store)
        )
        assert got.computed == 1 and got.cache_hits == 0
        np.testing.assert_allclose(got.features["nll"][0].response, fb.response, rtol=1e-5)
        # and overwritten: the next read is a hit with the example's own features
        again = extract_features(
            tiny_model, [by_id[b["example_id"]]], [det], cache=FeatureCache(store)
        )
        assert again.cache_hits == 1
        np.testing.assert_allclose(again.features["nll"][0].response, fb.response, rtol=1e-5)


# ----------------------------------------------------------------------------- memory

MiB = 1 << 20


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def dictionary_bomb(path: Path, rows: int, *, value_bytes: int, column: str = "features") -> None:
    """A shard of SCHEMA whose ``column`` holds one ``value_bytes`` value repeated ``rows``
    times by Parquet dictionary encoding: a few KB on disk, ``rows * value_bytes`` once
    read. Built cheaply: dictionary arrays written as they are, then the footer's stored
    Arrow schema swapped for SCHEMA's (as a hostile writer would)."""

    def col(name: str, typ: pa.DataType) -> pa.DictionaryArray:
        value = (
            ("k" * value_bytes if typ == pa.string() else bytes(value_bytes))
            if (name == column)
            else ("x" if typ == pa.string() else b"x")
        )
        return pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(rows, np.int32)), pa.array([value], typ)
        )

    arrays = [col(f.name, f.type) for f in SCHEMA]
    pq.write_table(pa.Table.from_arrays(arrays, names=SCHEMA.names), path, compression="zstd")
    data = path.read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - n : -8]
    old = pq.read_metadata(path).metadata[b"ARROW:schema"]
    buf = io.BytesIO()
    pq.write_table(SCHEMA.empty_table(), buf)
    new = pq.read_metadata(io.BytesIO(buf.getvalue())).metadata[b"ARROW:schema"]
    assert footer.count(_varint(len(old)) + old) == 1
    footer = footer.replace(_varint(len(old)) + old, _varint(len(new)) + new)
    path.write_bytes(data[: -8 - n] + footer + len(footer).to_bytes(4, "little") + b"PAR1")
    assert pq.ParquetFile(path).schema_arrow.types == SCHEMA.types


# VmHWM: this process's own peak (ru_maxrss would include the parent's, kept across exec)
PEAK = """
import re, sys
from core.pipeline.featurestore import import_store, store_keys
from core.storage import Store
if sys.argv[2] == "import":
    with Store(sys.argv[3]) as s:
        print("\\n".join(import_store(sys.argv[1], s).rejected))
else:
    try:
        store_keys(sys.argv[1])
    except Exception as e:
        print(e)
status = open("/proc/self/status").read()
print("PEAK", int(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1)) // 1024)
"""


def _peak(folder: Path, what: str, db: Path) -> tuple[str, int]:
    """What reading ``folder`` printed, and the peak RSS (MiB) of the process that read it."""
    done = subprocess.run(
        [sys.executable, "-c", PEAK, str(folder), what, str(db)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    out, _, peak = done.stdout.rpartition("PEAK ")
    return out, int(peak)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM (Linux)")
def test_a_decompression_bomb_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """300 rows of one 4 MB value: a 2 KB shard that decodes to 1.2 GB (the import peaked
    at 2.5 GB before its sizes were bounded); a 20 MB key repeated 100 times (2 GB) is
    refused on import and on ``extract --out``'s read of the folder's keys."""
    bomb = tmp_path / "bomb"
    bomb.mkdir()
    dictionary_bomb(bomb / "part-b-000001.parquet", 300, value_bytes=4 * MiB)
    assert (bomb / "part-b-000001.parquet").stat().st_size < 16_000
    out, peak = _peak(bomb, "import", tmp_path / "a.sqlite3")
    assert "part-b-000001.parquet: row group 0 expands to over" in out
    assert peak < 500, f"import peaked at {peak} MiB"
    key = tmp_path / "key"
    key.mkdir()
    dictionary_bomb(key / "part-k-000001.parquet", 100, value_bytes=20 * MiB, column="model")
    for what in ("import", "keys"):
        out, peak = _peak(key, what, tmp_path / "b.sqlite3")
        assert "the 'model' column decompresses to" in out and "(not read)" in out
        assert peak < 500, f"{what} peaked at {peak} MiB"


LYING_FOOTER = """
import sys
import pyarrow as pa, pyarrow.parquet as pq
from core.pipeline.featurestore import SCHEMA
path, rows, size, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cols = [
    pa.array(["x"] * rows) if t == pa.string() else pa.array([bytes(size)] * rows, pa.binary())
    for t in SCHEMA.types
]
table = pa.Table.from_arrays(cols, schema=SCHEMA)
pq.write_table(
    table, path, compression="zstd", use_dictionary=False, row_group_size=rows,
    data_page_size=1 << 20, write_batch_size=batch,
)
"""


def _varint(n: int, length: int | None = None) -> bytes:
    """``n`` as a Thrift varint; with ``length``, padded to that many bytes (an overlong
    encoding every reader accepts)."""
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        more = n > 0 or (length is not None and len(out) < length - 1)
        out.append(b | (0x80 if more else 0))
        if not more:
            return bytes(out)


def lying_footer(
    path: Path, rows: int, value_bytes: int, *, per_page: int = 1, claim: int = 1000
) -> None:
    """A shard of ``rows`` plain (not dictionary) values of ``value_bytes`` zero bytes,
    ``per_page`` values a page, whose footer claims the features column decompresses to ``claim`` bytes: written in
    a child process (it is large before compression), then the footer's
    ``total_uncompressed_size`` rewritten in place (same length, overlong varint)."""
    subprocess.run(
        [sys.executable, "-c", LYING_FOOTER, str(path), str(rows), str(value_bytes), str(per_page)],
        check=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    data = path.read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    footer = data[-8 - n : -8]
    meta = pq.read_metadata(path).row_group(0).column(SCHEMA.names.index("features"))
    true = _varint(meta.total_uncompressed_size << 1)  # i64 fields are zigzag varints
    assert footer.count(true) == 1
    footer = footer.replace(true, _varint(claim << 1, len(true)))
    path.write_bytes(data[: -8 - n] + footer + data[-8:])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM (Linux)")
def test_a_footer_that_understates_sizes_cannot_exhaust_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """120 values of 2 MB in a small shard whose footer says the column decompresses to
    1,000 bytes: reads are planned from the pages' own headers (each page allocates what
    its header says), so the import reads them a few at a time and refuses each row (it
    planned 120 rows a batch from the footer and peaked past 700 MB before); under a
    lower column limit the shard is refused naming its true size, unread."""
    lie = tmp_path / "lie"
    lie.mkdir()
    shard = lie / "part-l-000001.parquet"
    lying_footer(shard, 120, 2 * MiB)
    assert shard.stat().st_size < 64_000
    features = pq.read_metadata(shard).row_group(0).column(SCHEMA.names.index("features"))
    assert features.total_uncompressed_size == 1000
    out, peak = _peak(lie, "import", tmp_path / "a.sqlite3")
    assert out.count("part-l-000001.parquet") == 120  # every row refused, one by one
    assert peak < 500, f"import peaked at {peak} MiB"
    monkeypatch.setattr(featurestore, "FEATURES_COLUMN_LIMIT", 64 * MiB)
    with Store(tmp_path / "b.sqlite3") as store:
        (why,) = import_store(lie, store).rejected
    assert "the 'features' column decompresses to 251,6" in why and "(not read)" in why
    # every value in one page: a page over the limit is refused, however the footer reads
    lying_footer(shard, 120, 2 * MiB, per_page=120)
    monkeypatch.setattr(featurestore, "FEATURES_COLUMN_LIMIT", 256 * MiB)
    monkeypatch.setattr(featurestore, "PAGE_LIMIT", 64 * MiB)
    with Store(tmp_path / "c.sqlite3") as store:
        (why,) = import_store(lie, store).rejected
    assert "a page of the 'features' column decompresses to 251,6" in why


def test_column_and_row_limits_are_checked_before_reading(
    good_store: tuple[pa.Schema, list[dict]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema, rows = good_store
    folder = tmp_path / "s"
    folder.mkdir()
    # a plain (not dictionary) features column over the limit: refused from the footer
    big = dict(rows[0], features=bytes(3 * MiB))
    table = pa.Table.from_pylist([big, *rows[1:]], schema=schema)
    pq.write_table(table, folder / "part-c-000001.parquet", use_dictionary=False)
    monkeypatch.setattr(featurestore, "FEATURES_COLUMN_LIMIT", 2 * MiB)
    with Store(tmp_path / "dst.sqlite3") as store:
        (why,) = import_store(folder, store).rejected
        assert "row group 0: the 'features' column decompresses to" in why
        assert "over the 2,097,152-byte limit (not read)" in why
        monkeypatch.setattr(featurestore, "ROWS_LIMIT", len(rows) - 1)
        (why,) = import_store(folder, store).rejected
        assert f"declares {len(rows)} rows, over the {len(rows) - 1}-row limit" in why


def test_extract_out_refuses_a_store_whose_keys_would_exhaust_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """``extract --out DIR`` reads DIR's keys to skip what it holds: a 20 MB key repeated
    100 times is refused from the footer, naming the shard, before anything is traced."""
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "local.sqlite3"))
    out = tmp_path / "store"
    out.mkdir()
    dictionary_bomb(out / "part-k-000001.parquet", 100, value_bytes=20 * MiB, column="model")
    assert main([*EXTRACT, "--dataset", "demo", "--limit", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "part-k-000001.parquet" in err and "the 'model' column decompresses to" in err
    assert shard_files(out) == [out / "part-k-000001.parquet"]


def test_features_import_checks_rows_against_a_local_dataset(
    good_store: tuple[pa.Schema, list[dict]], tmp_path: Path, monkeypatch, capsys
) -> None:
    """Offsets past the end of the answer cannot be seen without the example: ``features
    import --dataset`` refuses them at import; without it the row comes in (and is
    checked when used)."""
    schema, rows = good_store
    row = next(r for r in rows if r["detector"] == "nll")
    f = Features.from_bytes(row["features"])
    past = dict(row, features=_payload(f, token_offsets=np.asarray(f.token_offsets) + 10_000))
    folder = tmp_path / "store"
    folder.mkdir()
    _write(folder / "part-o-000001.parquet", [past], schema=schema)
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "a.sqlite3"))
    assert main(["features", "import", str(folder)]) == 0
    assert f"{folder}: 1 imported" in capsys.readouterr().out
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "b.sqlite3"))
    assert main(["features", "import", str(folder), "--dataset", "demo"]) == 1
    out = capsys.readouterr().out
    assert f"{folder}: 0 imported, 0 already in the cache, 1 rejected" in out
    assert "REJECTED part-o-000001.parquet row 0: nll features: token offsets reach" in out
