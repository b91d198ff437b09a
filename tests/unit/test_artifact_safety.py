"""Artifacts never run code: exact skops allowlists, recorded SHA-256 hashes, bounded reads.

The hostile artifacts are built by the ``hostile_artifact`` fixture (tests/conftest.py):
a scikit-learn pipeline of NumPy / scikit-learn callables that runs Python code at its
first ``predict_proba``, with every hash recorded as an attacker would. Every way a
user can point ragscope at a detector folder must refuse it, and its marker file must
never appear.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import skops.io as sio

from core.base.errors import DataError
from core.base.paths import repo_root
from core.base.safeio import (
    SKOPS_PLAIN_DATA,
    load_skops,
    parse_json,
    read_bounded,
    replace_file,
    replacing,
    skops_types,
)
from core.cli import main
from core.detectors import detector_class, seal_artifact
from core.detectors.interpdetect import SKOPS_TYPES as INTERPDETECT_TYPES
from core.detectors.raglens import SKOPS_TYPES as RAGLENS_TYPES
from core.learning.artifact import artifact_hashes, read_artifact
from core.learning.span_rule import SpanRule

SHIPPED = repo_root() / "assets" / "detectors"
OLD_PREFIXES = ("sklearn.", "xgboost.", "numpy.")  # what ragscope trusted before


FAST = repo_root() / "assets" / "detector-sets" / "fast"


def _shipped_folders() -> list[Path]:
    """The default set's artifacts and their members, and the fast set's."""
    found = []
    for root in (SHIPPED, FAST):
        found += [p for p in sorted(root.iterdir()) if (p / "cfg.json").is_file()]
        found += [p for p in sorted(root.glob("*/members/*")) if (p / "cfg.json").is_file()]
    return found


@pytest.fixture(autouse=True)
def _isolated_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "cli.sqlite3"))


# --------------------------------------------------------------------------- shipped


@pytest.mark.parametrize(
    "folder", _shipped_folders(), ids=lambda p: str(p.relative_to(SHIPPED.parent))
)
def test_every_shipped_artifact_is_hashed_and_loads_under_the_exact_allowlist(folder: Path) -> None:
    cfg = json.loads((folder / "cfg.json").read_text())
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert set(cfg["files"]) == files - {"cfg.json"}
    assert cfg["files"] == artifact_hashes(folder)
    allowed = {"interpdetect": INTERPDETECT_TYPES, "raglens": RAGLENS_TYPES}.get(cfg["detector"])
    for sk in folder.glob("*.skops"):
        schema = json.loads(zipfile.ZipFile(sk).read("schema.json"))
        assert allowed is not None and skops_types(schema) <= allowed | SKOPS_PLAIN_DATA
    det = detector_class(cfg["detector"]).load(folder, model_key=cfg["model"])
    assert det.threshold_ == cfg["threshold"]


def test_artifacts_verify_command_passes_on_the_shipped_folder(capsys) -> None:
    assert main(["artifacts", "verify"]) == 0
    out = capsys.readouterr().out
    assert out.count("ok ") == len([p for p in SHIPPED.iterdir() if (p / "cfg.json").is_file()])


# --------------------------------------------------------------------------- code in skops


def test_the_payload_is_the_real_attack(tmp_path: Path, hostile_artifact) -> None:
    """Documentation of the hole: the payload passes the old prefix rule, and skops
    loading it with those types trusted runs the code at the first predict."""
    marker = hostile_artifact(tmp_path, "interpdetect")
    path = tmp_path / "interpdetect" / "pipeline.skops"
    untrusted = sio.get_untrusted_types(file=path)
    assert untrusted and all(t.startswith(OLD_PREFIXES) for t in untrusted)
    pipe = sio.load(path, trusted=untrusted)
    assert not marker.exists()  # loading alone does not run it ...
    with pytest.raises(ValueError):
        pipe.predict_proba([[0.0, 0.0]])
    assert marker.exists()  # ... the first predict does


@pytest.mark.parametrize("detector", ["interpdetect", "raglens"])
def test_code_in_a_skops_file_is_refused_by_load(tmp_path: Path, hostile_artifact, detector):
    marker = hostile_artifact(tmp_path, detector)
    with pytest.raises(DataError) as err:
        detector_class(detector).load(tmp_path / detector)
    msg = str(err.value)
    assert "refusing to load" in msg and "function or type reference" in msg
    assert "numpy.full_like" in msg or "assert_run_python_script" in msg
    assert str(tmp_path / detector) in msg
    assert f"ragscope train --detectors {detector}" in msg
    assert not marker.exists()


def test_allowlists_are_exact_types_not_packages(tmp_path: Path) -> None:
    from sklearn.preprocessing import FunctionTransformer, MinMaxScaler

    # Classes from an allowed package but not in the list, and a function reference.
    for obj, name in (
        (MinMaxScaler().fit([[0.0], [1.0]]), "MinMaxScaler"),
        (FunctionTransformer(func=len), "builtins.len"),
    ):
        path = tmp_path / f"{name}.skops"
        sio.dump(obj, path)
        with pytest.raises(DataError, match=f"refusing to load.*{name}"):
            load_skops(path, INTERPDETECT_TYPES)


def test_skops_zip_bombs_and_junk_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.skops"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DataError, match="not a readable skops file"):
        load_skops(junk, INTERPDETECT_TYPES)
    bomb = tmp_path / "bomb.skops"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("schema.json", "{}")
        z.writestr("big.npy", b"\0" * (2 * 1024 * 1024))
    from core.base import safeio

    with pytest.raises(DataError, match="unpacks to"):
        with zipfile.ZipFile(bomb) as z:
            safeio.check_zip(z, source=str(bomb), max_bytes=1024 * 1024)
    deep = tmp_path / "deep.skops"
    with zipfile.ZipFile(deep, "w") as z:
        z.writestr("schema.json", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match="nested too deeply"):
        load_skops(deep, INTERPDETECT_TYPES)


# --------------------------------------------------------------------------- every path in


def _hostile_root(tmp_path: Path, hostile_artifact, model_key: str) -> tuple[Path, Path]:
    root = tmp_path / "shared-detectors"
    marker = hostile_artifact(root, "interpdetect", model_key=model_key)
    return root, marker


def test_cli_evaluate_artifacts_refuses_it(tmp_path, hostile_artifact, tiny_model, capsys):
    root, marker = _hostile_root(tmp_path, hostile_artifact, tiny_model.info.key)
    args = ["evaluate", "--model", "tiny", "--dataset", "demo", "--detectors", "interpdetect"]
    code = main([*args, "--artifacts", str(root), "--out", str(tmp_path / "run")])
    assert code == 2
    assert "refusing to load" in capsys.readouterr().err
    assert not marker.exists()


def test_cli_token_thresholds_folder_refuses_it(tmp_path, hostile_artifact, tiny_model, capsys):
    root, marker = _hostile_root(tmp_path, hostile_artifact, tiny_model.info.key)
    before = (root / "interpdetect" / "cfg.json").read_bytes()
    args = ["token-thresholds", "--model", "tiny", "--dataset", "demo", "--folder", str(root)]
    assert main(args) == 2
    assert "refusing to load" in capsys.readouterr().err
    assert not marker.exists()
    assert (root / "interpdetect" / "cfg.json").read_bytes() == before  # nothing rewritten


def test_detectors_dir_env_refuses_it(tmp_path, hostile_artifact, tiny_model, monkeypatch, capsys):
    root, marker = _hostile_root(tmp_path, hostile_artifact, tiny_model.info.key)
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(root))
    args = ["mitigate", "--model", "tiny", "--dataset", "demo", "--detectors", "interpdetect"]
    assert main(args) == 2
    assert "refusing to load" in capsys.readouterr().err
    assert main(["artifacts", "verify"]) == 1
    assert "refusing to load" in capsys.readouterr().err
    assert not marker.exists()


def test_seal_refuses_it_and_restores_cfg(tmp_path, hostile_artifact, capsys) -> None:
    marker = hostile_artifact(tmp_path, "interpdetect")
    folder = tmp_path / "interpdetect"
    cfg = json.loads((folder / "cfg.json").read_text())
    del cfg["files"]
    (folder / "cfg.json").write_text(json.dumps(cfg))
    before = (folder / "cfg.json").read_bytes()
    with pytest.raises(DataError, match="refusing to load"):
        seal_artifact(folder)
    assert (folder / "cfg.json").read_bytes() == before
    assert main(["artifacts", "seal", str(folder)]) == 1
    assert not marker.exists()


# --------------------------------------------------------------------------- hashes


@pytest.fixture
def nll_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "nll"
    shutil.copytree(SHIPPED / "nll", dst)
    return dst


def _load(folder: Path):
    return detector_class("nll").load(folder)


def test_an_edited_file_is_refused(nll_copy: Path) -> None:
    w = json.loads((nll_copy / "weights.json").read_text())
    (nll_copy / "weights.json").write_text(json.dumps(w) + " ")
    with pytest.raises(DataError, match="weights.json does not match the SHA-256.*ragscope train"):
        _load(nll_copy)


def test_extra_missing_and_linked_files_are_refused(nll_copy: Path, tmp_path: Path) -> None:
    (nll_copy / "notes.txt").write_text("hi")
    with pytest.raises(DataError, match="does not record: notes.txt"):
        _load(nll_copy)
    (nll_copy / "notes.txt").unlink()
    os.symlink(tmp_path / "elsewhere", nll_copy / "link")
    with pytest.raises(DataError, match="symbolic link"):
        _load(nll_copy)
    (nll_copy / "link").unlink()
    os.mkfifo(nll_copy / "pipe")  # reading it would block forever
    with pytest.raises(DataError, match="not a regular file"):
        _load(nll_copy)
    (nll_copy / "pipe").unlink()
    weights = (nll_copy / "weights.json").read_bytes()
    (nll_copy / "weights.json").unlink()
    with pytest.raises(DataError, match="need cfg.json and weights.json"):
        _load(nll_copy)
    (nll_copy / "weights.json").write_bytes(weights)
    assert _load(nll_copy).threshold_ > 0


def test_an_artifact_without_hashes_names_seal_and_seal_fixes_it(nll_copy: Path, capsys) -> None:
    cfg = json.loads((nll_copy / "cfg.json").read_text())
    del cfg["files"]
    (nll_copy / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(DataError, match="records no file hashes.*ragscope artifacts seal"):
        _load(nll_copy)
    assert main(["artifacts", "seal", str(nll_copy)]) == 0
    assert _load(nll_copy).threshold_ == cfg["threshold"]
    bad = {**cfg, "files": {"weights.json": "not-a-digest"}}
    (nll_copy / "cfg.json").write_text(json.dumps(bad))
    with pytest.raises(DataError, match="SHA-256 hex digests"):
        _load(nll_copy)


def test_hostile_json_in_artifacts_is_a_data_error(nll_copy: Path, reseal, monkeypatch) -> None:
    good = (nll_copy / "weights.json").read_text()
    for text, reason in (
        ("[" * 5000 + "]" * 5000, "nested too deeply"),
        ('{"a": ' + "9" * 5000 + "}", "unreadable JSON value"),
        ('{"a": 1', "invalid JSON at line 1"),
        ("[1, 2]", "must hold a JSON object"),
    ):
        (nll_copy / "weights.json").write_text(text)
        reseal(nll_copy)
        with pytest.raises(DataError, match=reason):
            _load(nll_copy)
    (nll_copy / "weights.json").write_text(good)
    reseal(nll_copy)
    import core.learning.artifact as base

    monkeypatch.setattr(base, "ARTIFACT_JSON_LIMIT", 100)
    with pytest.raises(DataError, match="over the 100-byte limit"):
        _load(nll_copy)


def test_read_artifact_checks_before_reading_weights(nll_copy: Path) -> None:
    (nll_copy / "weights.json").write_bytes(b"\xff\xfe not even utf-8")
    with pytest.raises(DataError, match="does not match the SHA-256"):
        read_artifact(nll_copy, name="nll", model_key=None)


# --------------------------------------------------------------------------- safeio


def test_parse_json_locates_errors_and_accepts_a_bom() -> None:
    assert parse_json(b'\xef\xbb\xbf{"a": 1}', source="x") == {"a": 1}
    with pytest.raises(DataError, match=r"x: invalid JSON at line 3, column 5"):
        parse_json('{\n "a": 1,\n    }', source="x")
    with pytest.raises(DataError, match=r"byte 2: invalid start byte"):  # 1-based
        parse_json(b"{\xff}", source="x")


def test_read_bounded_refuses_big_and_special_files(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(DataError, match="101 bytes, over the 100-byte limit"):
        read_bounded(big, 100)
    assert read_bounded(big, 101) == b"x" * 101
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(DataError, match="not a regular file"):
        read_bounded(tmp_path / "fifo", 100)


# --------------------------------------------------------------------------- SAE folders


@pytest.fixture
def sae_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "sae"
    shutil.copytree(repo_root() / "assets" / "sae" / "smollm2-135m-instruct", dst)
    return dst


def test_sae_folders_are_hash_checked_json_and_safetensors(sae_copy: Path, tmp_path) -> None:
    from core.signals.sae import load_sae

    assert load_sae(sae_copy).layer >= 0
    weights = sae_copy / "sae_weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(DataError, match="does not match the SHA-256.*ragscope sae train"):
        load_sae(sae_copy)
    data[-1] ^= 1
    (tmp_path / "real.safetensors").write_bytes(bytes(data))
    weights.unlink()
    os.symlink(tmp_path / "real.safetensors", weights)
    with pytest.raises(DataError, match="symbolic link"):
        load_sae(sae_copy)
    weights.unlink()
    os.mkfifo(weights)
    with pytest.raises(DataError, match="not a regular file"):
        load_sae(sae_copy)
    weights.unlink()
    weights.write_bytes(bytes(data))
    good_cfg = (sae_copy / "cfg.json").read_text()
    (sae_copy / "cfg.json").write_text("[" * 10_000 + "]" * 10_000)
    with pytest.raises(DataError, match="nested too deeply"):
        load_sae(sae_copy)
    (sae_copy / "cfg.json").write_text(good_cfg)
    assert load_sae(sae_copy).layer >= 0


# --------------------------------------------------------------------------- feature cache


def test_damaged_feature_cache_entries_are_misses(tmp_path: Path, toy_example) -> None:
    import io

    import numpy as np

    from core.base.examples import example_hash
    from core.detectors import make_detector
    from core.learning.contract import Features
    from core.pipeline.extract import FeatureCache
    from core.storage import Store

    f = Features(
        detector="nll", example_id=toy_example.id, model="m", names=("a",), response=np.ones(1)
    )
    assert Features.from_bytes(f.to_bytes()).names == ("a",)
    buf = io.BytesIO()
    np.savez(buf, response=np.array([object()], dtype=object), meta=np.zeros(1, np.uint8))
    for blob in (b"junk", buf.getvalue(), f.to_bytes()[:40]):
        with pytest.raises(DataError, match="feature cache"):
            Features.from_bytes(blob)
    store = Store(tmp_path / "db.sqlite3")
    cache, det = FeatureCache(store), make_detector("nll")
    cache.put("m", toy_example, det, f)
    assert cache.get("m", toy_example, det) is not None
    store.put_analysis(
        example_hash=example_hash(toy_example),
        model="m",
        detector="nll",
        config_hash=det.config.feature_hash(),
        result=b"damaged",
        dataset="x",
        example_id=toy_example.id,
    )
    assert cache.get("m", toy_example, det) is None


# --------------------------------------------------------------------------- fitted models

CRASH_PREDICT = """
import sys, numpy as np, skops.io as sio
pipe = sio.load(sys.argv[1], trusted=sio.get_untrusted_types(file=sys.argv[1]))
pipe.predict_proba(np.zeros((2, 3)))
"""


def _tree_artifact(root: Path, corrupt, *, forest: bool = False, width: int = 3) -> Path:
    """An interpdetect artifact whose pipeline (scaler + a real fitted tree or forest on
    ``width`` features) had ``corrupt(state)`` applied to a tree's node arrays, every hash
    recorded as an attacker would."""
    import numpy as np
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.tree import DecisionTreeClassifier

    from core.detectors import make_detector
    from core.learning.artifact import write_artifact

    X = np.random.default_rng(0).normal(size=(60, width))
    y = (X[:, 0] > 0).astype(int)
    clf = (
        RandomForestClassifier(n_estimators=3, max_depth=3, random_state=0)
        if forest
        else DecisionTreeClassifier(max_depth=3, random_state=0)
    )
    pipe = Pipeline([("scale", StandardScaler()), ("clf", clf)]).fit(X, y)
    tree = (pipe[-1].estimators_[1] if forest else pipe[-1]).tree_
    state = tree.__getstate__()
    state["nodes"] = state["nodes"].copy()
    corrupt(state)
    tree.__setstate__(state)
    names = [f"ECS_L0H{i}" for i in range(3)]
    folder = root / "interpdetect"
    write_artifact(
        folder,
        name="interpdetect",
        config=make_detector("interpdetect").config,
        model_key="any",
        weights={"names": names, "kept": names, "classifier": "rf" if forest else "lr"},
        extra={"threshold": 0.5, "train": {}},
        files={"pipeline.skops": lambda p: sio.dump(pipe, p)},
    )
    return folder


def _set(field: str, index: int, value: float):
    def corrupt(state: dict) -> None:
        state["nodes"][field][index] = value

    return corrupt


def _both_children(state: dict) -> None:
    state["nodes"]["left_child"][0] = 10**8
    state["nodes"]["right_child"][0] = 10**8


def test_a_tree_that_would_crash_predict_is_refused_by_load_and_verify(tmp_path, capsys) -> None:
    import subprocess
    import sys

    folder = _tree_artifact(tmp_path, _both_children)
    # The hole: skops loads it and the first predict kills the process (SIGSEGV).
    crash = subprocess.run(
        [sys.executable, "-c", CRASH_PREDICT, str(folder / "pipeline.skops")],
        capture_output=True,
        timeout=120,
    )
    assert crash.returncode != 0 and b"Traceback" not in crash.stderr
    with pytest.raises(DataError) as err:
        detector_class("interpdetect").load(folder)
    msg = str(err.value)
    assert msg.startswith(f"{folder}: pipeline.skops, step 'clf': node 0 of ")
    assert "left child 100000000 is outside (0, " in msg
    assert "ragscope train --detectors interpdetect" in msg
    assert main(["artifacts", "verify", str(folder)]) == 1
    assert "left child 100000000" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("corrupt", "forest", "reason"),
    [
        (_set("feature", 0, 10**8), False, "node 0 of .*: split feature 100000000 is outside"),
        (_set("feature", 0, -5), False, "node 0 of .*: split feature -5 is outside"),
        (_set("threshold", 0, float("nan")), False, "split threshold nan is not finite"),
        (_set("right_child", 0, -1), False, "one child is -1 and the other is not"),
        (_set("left_child", 0, 0), False, r"node 0 of .*: left child 0 is outside \(0, "),
        (_set("feature", 0, 10**8), True, "step 'clf', tree 1: node 0 .*split feature 100000000"),
    ],
    ids=["feature", "negative-feature", "nan-threshold", "lone-leaf", "cycle", "forest"],
)
def test_inconsistent_tree_nodes_are_refused(tmp_path, corrupt, forest, reason) -> None:
    folder = _tree_artifact(tmp_path, corrupt, forest=forest)
    with pytest.raises(DataError, match=reason):
        detector_class("interpdetect").load(folder)


def test_a_leaf_with_a_split_feature_is_refused(tmp_path) -> None:
    def leaf_feature(state: dict) -> None:
        leaf = int(next(i for i, c in enumerate(state["nodes"]["left_child"]) if c == -1))
        state["nodes"]["feature"][leaf] = 1

    with pytest.raises(DataError, match="leaf feature 1 is not -2"):
        detector_class("interpdetect").load(_tree_artifact(tmp_path, leaf_feature))


def test_a_pipeline_of_another_width_than_the_detector_gives_is_refused(tmp_path) -> None:
    folder = _tree_artifact(tmp_path, lambda state: None, width=4)  # kept: 3 columns
    with pytest.raises(DataError, match="step 'scale': it reads 4 features, but the detector"):
        detector_class("interpdetect").load(folder)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("split_indices", 10**8, "split feature 100000000 is outside"),
        ("left_children", 10**8, "left child 100000000 is outside"),
        ("split_conditions", float("nan"), "split threshold nan is not finite"),
    ],
)
def test_an_xgboost_booster_with_bad_trees_is_refused(tmp_path, reseal, key, value, reason):
    folder = tmp_path / "spad"
    shutil.copytree(SHIPPED / "spad", folder)
    model = json.loads((folder / "model.json").read_text())
    tree = model["learner"]["gradient_booster"]["model"]["trees"][0]
    tree[key][0] = value
    (folder / "model.json").write_text(json.dumps(model))
    reseal(folder)
    with pytest.raises(DataError, match=f"model.json, tree 0: node 0 of .*{reason}"):
        detector_class("spad").load(folder)


def test_a_booster_xgboost_refuses_is_named_without_its_backtrace(tmp_path, reseal) -> None:
    folder = tmp_path / "spad"
    shutil.copytree(SHIPPED / "spad", folder)
    model = json.loads((folder / "model.json").read_text())
    model["learner"]["objective"]["name"] = "no:such"
    (folder / "model.json").write_text(json.dumps(model))
    reseal(folder)
    with pytest.raises(DataError, match="XGBoostError: Unknown objective function") as e:
        detector_class("spad").load(folder)
    message = str(e.value).removeprefix(str(folder))
    assert "\n" not in message and ".cc:" not in message and "candidate" not in message
    assert len(message) < 300


def test_a_booster_over_the_size_caps_is_refused_before_xgboost_parses_it(
    tmp_path, reseal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trees, nodes per tree and bytes are capped (counted in the file, not taken from its
    parameters), so a booster's load cost is bounded by what SPAD can need."""
    import xgboost

    from core.base import safeio

    parsed: list[object] = []
    real = xgboost.Booster.load_model
    monkeypatch.setattr(
        xgboost.Booster, "load_model", lambda self, f: parsed.append(f) or real(self, f)
    )
    model = json.loads((SHIPPED / "spad" / "model.json").read_text())
    gb = model["learner"]["gradient_booster"]["model"]
    many = json.loads(json.dumps(model))
    mg = many["learner"]["gradient_booster"]["model"]
    mg["trees"] = [gb["trees"][0]] * (safeio.MAX_BOOSTER_TREES + 1)
    mg["tree_info"] = [0] * len(mg["trees"])
    deep = json.loads(json.dumps(model))
    tree = deep["learner"]["gradient_booster"]["model"]["trees"][0]
    tree["left_children"] = [-1] * (safeio.MAX_TREE_NODES + 1)
    cases = {
        "many": (json.dumps(many), "4,001 trees, over the 4,000"),
        "deep": (json.dumps(deep), "tree 0: it has 2,048 nodes, over the 2,047"),
        "big": (json.dumps(model) + " " * safeio.MAX_BOOSTER_BYTES, "over"),
    }
    for name, (text, reason) in cases.items():
        folder = tmp_path / name / "spad"
        shutil.copytree(SHIPPED / "spad", folder)
        (folder / "model.json").write_text(text)
        reseal(folder)
        with pytest.raises(DataError, match=reason):
            detector_class("spad").load(folder)
    assert parsed == []  # every one refused before XGBoost read a byte


def test_non_finite_linear_weights_are_refused(nll_copy: Path, reseal) -> None:
    w = json.loads((nll_copy / "weights.json").read_text())
    w["response"]["coef"][1] = float("nan")
    (nll_copy / "weights.json").write_text(json.dumps(w))
    reseal(nll_copy)
    with pytest.raises(DataError, match="response_model_: coef holds a non-finite value"):
        _load(nll_copy)
    w["response"]["coef"][1] = 0.0
    w["response"]["scale"][0] = 0.0
    (nll_copy / "weights.json").write_text(json.dumps(w))
    reseal(nll_copy)
    with pytest.raises(DataError, match="its scale holds a value <= 0"):
        _load(nll_copy)


def test_an_ebm_whose_terms_read_missing_features_is_refused(tmp_path, reseal) -> None:
    from core.learning.artifact import read_skops

    folder = tmp_path / "raglens"
    shutil.copytree(SHIPPED / "raglens", folder)
    ebm = read_skops(folder / "ebm.skops", RAGLENS_TYPES, "raglens")
    ebm.term_features_[0] = (10**6,)
    sio.dump(ebm, folder / "ebm.skops")
    reseal(folder)
    with pytest.raises(DataError, match=r"ebm.skops: term 0 reads features \[1000000\] outside"):
        detector_class("raglens").load(folder)
    ebm.term_features_[0] = (0,)
    ebm.term_scores_[0] = ebm.term_scores_[0][:-1]
    sio.dump(ebm, folder / "ebm.skops")
    reseal(folder)
    with pytest.raises(DataError, match="ebm.skops, term 0: the score table has shape"):
        detector_class("raglens").load(folder)


# --------------------------------------------------------------------------- cfg.json values


def _edit_cfg(folder: Path, reseal, edit) -> None:
    cfg = json.loads((folder / "cfg.json").read_text())
    edit(cfg)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    reseal(folder)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1e9, 1.5, "0.5", True, 10**400])
@pytest.mark.parametrize("key", ["threshold", "token_threshold"])
def test_thresholds_outside_the_score_range_are_refused(nll_copy, reseal, capsys, key, value):
    _edit_cfg(nll_copy, reseal, lambda cfg: cfg.update({key: value}))
    with pytest.raises(DataError, match=f"'{key}' must be a number in \\[0, 1\\]"):
        _load(nll_copy)
    assert main(["artifacts", "verify", str(nll_copy)]) == 1
    assert f"'{key}' must be a number in [0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ({"threshold": float("nan")}, "threshold must be a finite number"),
        ({"gap_tokens": 10**9}, "gap_tokens must be an integer"),
        ({"extend": "document"}, "extend must be one of"),
        ({"measured": {"f1": "x" * 10_000}}, "measured must map"),
        ({"code": "__import__('os')"}, "span_rule must be an object with keys"),
    ],
)
def test_a_hostile_span_rule_is_refused_by_load_and_verify(nll_copy, reseal, capsys, edit, reason):
    good = {
        "threshold": 0.3,
        "answer_weight": 0.0,
        "gate": True,
        "gap_tokens": 2,
        "extend": "words",
        "chosen": "cross-validation",
        "measured": {"f1": 0.4},
    }
    _edit_cfg(nll_copy, reseal, lambda cfg: cfg.update(span_rule={**good, **edit}))
    with pytest.raises(DataError, match=reason):
        _load(nll_copy)
    assert main(["artifacts", "verify", str(nll_copy)]) == 1
    assert reason in capsys.readouterr().err
    _edit_cfg(nll_copy, reseal, lambda cfg: cfg.update(span_rule=good))
    assert _load(nll_copy).span_rule_ == SpanRule.from_json(good)  # a sound one loads


@pytest.mark.parametrize(("a", "b"), [(1e308, 0.0), (1.0, -1e308), (-2.0, 0.0)])
def test_absurd_calibrations_are_refused(nll_copy, reseal, a, b) -> None:
    _edit_cfg(nll_copy, reseal, lambda cfg: cfg["calibration"].update(a=a, b=b))
    with pytest.raises(DataError, match="a Platt calibrator needs 0 <= a <= 100"):
        _load(nll_copy)


@pytest.fixture
def cortex_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "cortex"
    shutil.copytree(SHIPPED / "cortex", dst)
    return dst


@pytest.mark.parametrize(
    ("hidden", "reason"),
    [
        ([30000, 30000], "hidden must be 1 to 8 widths of 1 to 4096"),
        ([2**40], "hidden must be 1 to 8 widths of 1 to 4096"),
        ([8] * 9, "hidden must be 1 to 8 widths of 1 to 4096"),
        (["256", 128], r"field 'hidden.0': Input should be a valid integer, got '256'"),
        ([4096, 4096], "mlp.safetensors holds 6 arrays whose shapes are not those of the MLP"),
    ],
)
def test_cortex_hidden_widths_are_bounded_before_anything_is_allocated(
    cortex_copy, reseal, capsys, hidden, reason
) -> None:
    import time

    _edit_cfg(cortex_copy, reseal, lambda cfg: cfg["config"].update(hidden=hidden))
    start = time.monotonic()
    with pytest.raises(DataError, match=reason):
        detector_class("cortex").load(cortex_copy)
    assert time.monotonic() - start < 2.0
    assert main(["artifacts", "verify", str(cortex_copy)]) == 1
    assert "hidden" in capsys.readouterr().err or "shapes" in reason


@pytest.mark.parametrize(
    ("option", "value", "reason"),
    [
        ("layer", "1", r"field 'layer': Input should be a valid integer, got '1'"),
        ("smooth", 1, r"field 'smooth': Input should be a valid boolean, got 1"),
        ("lr", float("nan"), r"field 'lr': Input should be a finite number"),
        ("inputs", "x", r"field 'inputs': Input should be 'delta' or 'delta_residual'"),
    ],
)
def test_config_options_must_have_their_exact_types(cortex_copy, reseal, option, value, reason):
    _edit_cfg(cortex_copy, reseal, lambda cfg: cfg["config"].update({option: value}))
    with pytest.raises(DataError, match=f"cfg.json: cfg.json's config: {reason}"):
        detector_class("cortex").load(cortex_copy)


def test_raglens_sae_outside_the_artifact_and_assets_is_refused(tmp_path, reseal, capsys):
    folder = tmp_path / "raglens"
    shutil.copytree(SHIPPED / "raglens", folder)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(repo_root() / "assets" / "sae" / "smollm2-135m-instruct", elsewhere)
    for spec in (str(elsewhere), "../elsewhere", "/etc", "~"):
        _edit_cfg(folder, reseal, lambda cfg, s=spec: cfg["config"].update(sae=s))
        with pytest.raises(DataError, match="raglens.sae names .* outside this artifact"):
            detector_class("raglens").load(folder)
    assert main(["artifacts", "verify", str(folder)]) == 1
    assert "outside this artifact and the shipped assets" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("version", "described"),
    [("1", 'the string "1"'), (1.0, "the number 1.0"), (True, "true"), (None, "null")],
)
def test_the_artifact_version_must_be_the_integer_1(nll_copy, reseal, version, described):
    _edit_cfg(nll_copy, reseal, lambda cfg: cfg.update(artifact_version=version))
    with pytest.raises(DataError, match=f"artifact_version must be the integer 1, got {described}"):
        _load(nll_copy)


# --------------------------------------------------------------------------- size and links


def test_an_oversized_artifact_is_refused_before_any_byte_is_hashed(nll_copy, capsys) -> None:
    import time

    cfg = json.loads((nll_copy / "cfg.json").read_text())
    for i in range(3):  # sparse: 600 MiB that cost no disk
        with (nll_copy / f"blob{i}.bin").open("wb") as f:
            f.truncate(200 * 1024 * 1024)
        cfg["files"][f"blob{i}.bin"] = "0" * 64
    (nll_copy / "cfg.json").write_text(json.dumps(cfg))
    start = time.monotonic()
    with pytest.raises(DataError, match=r"over the 536,870,912-byte \(512 MiB\) limit") as err:
        _load(nll_copy)
    assert str(err.value).startswith(f"{nll_copy}: the artifact holds 629,")
    with pytest.raises(DataError, match="512 MiB"):
        seal_artifact(nll_copy)
    assert main(["artifacts", "verify", str(nll_copy)]) == 1
    assert "512 MiB" in capsys.readouterr().err
    assert time.monotonic() - start < 5.0


def test_seal_refuses_a_linked_member_before_writing_anything(tmp_path: Path) -> None:
    folder = tmp_path / "ensemble"
    shutil.copytree(SHIPPED / "ensemble", folder)
    target = tmp_path / "outside" / "nll"
    shutil.move(folder / "members" / "nll", target)
    os.symlink(target, folder / "members" / "nll")
    cfg = json.loads((target / "cfg.json").read_text())
    del cfg["files"]
    (target / "cfg.json").write_text(json.dumps(cfg))  # what seal would rewrite
    before = {p: p.read_bytes() for p in (target / "cfg.json", folder / "cfg.json")}
    with pytest.raises(DataError, match=r"symbolic link \(members/nll\)"):
        seal_artifact(folder)
    assert main(["artifacts", "seal", str(folder)]) == 1
    assert {p: p.read_bytes() for p in before} == before


def test_token_thresholds_never_opens_a_file_an_artifact_names(
    tmp_path, nll_copy, reseal, tiny_model, capsys
) -> None:
    secret = tmp_path / "secret.jsonl"
    secret.write_text("not for the artifact to choose\n")
    root = nll_copy.parent
    for spec in (str(secret), f"{secret}[:3]", "../secret.jsonl"):
        _edit_cfg(
            nll_copy,
            reseal,
            lambda cfg, s=spec: cfg.update(
                model=tiny_model.info.key, trained_on={"recipe": {"dataset": s}}
            ),
        )
        args = ["token-thresholds", "--model", "tiny", "--folder", str(root)]
        assert main([*args, "--detectors", "nll"]) == 2
        err = capsys.readouterr().err
        assert "which ragscope does not open on an artifact's word; give --dataset" in err


def test_replacing_writes_whole_files_or_leaves_the_old_one(tmp_path: Path) -> None:
    """What ragscope writes goes to a new file renamed over the old one only once whole:
    an error mid-write keeps the old text and leaves no partial file; a symlink at the
    destination is replaced, its target untouched."""
    dest = tmp_path / "out" / "run.json"
    replace_file(dest, "first\n")
    with pytest.raises(RuntimeError), replacing(dest) as f:
        f.write("half of a new")
        raise RuntimeError("stopped")
    assert dest.read_text(encoding="utf-8") == "first\n"
    assert [p.name for p in dest.parent.iterdir()] == ["run.json"]
    target = tmp_path / "someone-elses.txt"
    target.write_text("theirs", encoding="utf-8")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    replace_file(link, b"ours")
    assert not link.is_symlink() and link.read_bytes() == b"ours"
    assert target.read_text(encoding="utf-8") == "theirs"
