"""Detector sets (core.pipeline.sets): one rule picks the set for a model, each artifact's facts
come from one typed card, and a set is loaded once."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

import core.base.paths
import core.learning.artifact
from core.base.paths import assets_dir, model_detectors_dir
from core.pipeline.sets import EXPERTS_FILE, TrainedOn, load_set, resolve_set, set_detector

KEY = json.loads((assets_dir() / "detectors" / "nll" / "cfg.json").read_text())["model"]


@pytest.fixture
def no_set_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ("RAGSCOPE_DETECTORS_DIR", "RAGSCOPE_DETECTOR_SET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RAGSCOPE_TRAINED_DIR", str(tmp_path / "trained"))
    return tmp_path


def _copy(name: str, to: Path, src: Path | None = None) -> Path:
    to.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree((src or assets_dir() / "detectors") / name, to / name))


def test_the_default_set_loads_every_shipped_artifact_with_its_card(no_set_env: Path) -> None:
    dset = load_set(KEY)
    assert (dset.name, dset.error, dset.broken) == ("default", None, ())
    assert dset.folder == assets_dir() / "detectors"
    names = sorted(p.name for p in dset.folder.iterdir() if (p / "cfg.json").is_file())
    assert sorted(dset.names) == names and len(names) == 12
    assert dset.judge_name == "ensemble"
    ens = dset.card("ensemble")
    assert ens.training.datasets == (
        "builtin",
        "dolly_ac_dev",
        "finqa_qwen3_interpdetect",
        "ragtruth_qa_dev",
    )
    assert ens.training.counts["ragtruth_qa_dev"] == 420
    assert ens.n_train == 1800 + 138 + 256 + 420
    assert ens.auroc_from == "5-fold CV" and 0.5 < (ens.auroc or 0) < 1
    assert ens.calibrated and "ragtruth_qa_dev" in ens.calibrations
    assert ens.training.recipe is not None and ens.training.recipe["procedure"] == "cv"
    assert ens.trained_on == "builtin + dolly_ac_dev + finqa_qwen3_interpdetect + ragtruth_qa_dev"
    assert ens.token_threshold == pytest.approx(ens.detector.token_threshold_)
    assert [c.detector for c in dset.detectors] == dset.fitted


def test_one_rule_picks_the_set(no_set_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_set()[:2] == ("default", assets_dir() / "detectors")
    monkeypatch.setenv("RAGSCOPE_DETECTOR_SET", "ragtruth")
    assert resolve_set()[0] == "ragtruth"
    # A name asked for beats the environment's.
    assert resolve_set("builtin")[:2] == ("builtin", assets_dir() / "detector-sets" / "builtin")
    name, folder, error = resolve_set("no-such-set")
    assert (name, folder) == ("default", assets_dir() / "detectors")
    assert error is not None and "ragtruth" in error and "builtin" in error
    assert resolve_set("custom")[2] is not None  # not a name to ask for
    custom = no_set_env / "custom"
    _copy("nll", custom)
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(custom))
    dset = load_set(KEY)
    assert (dset.name, dset.folder, dset.names) == ("custom", custom, ("nll",))
    assert load_set(KEY, "ragtruth").name == "ragtruth"


def test_the_set_trained_here_applies_to_every_command(
    no_set_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A folder with nothing for the model: the detectors trained on this machine for it
    # are the set, for the app and for mitigate / bench (set_detector) alike.
    empty = no_set_env / "empty"
    empty.mkdir()
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(empty))
    with pytest.raises(Exception, match="no redeep_token"):
        set_detector(KEY, "redeep_token")
    _copy("redeep_token", model_detectors_dir(KEY))
    dset = load_set(KEY)
    assert (dset.name, dset.names) == ("trained", ("redeep_token",))
    assert set_detector(KEY, "redeep_token") is dset.card("redeep_token").detector


def test_a_set_is_loaded_once_and_again_when_a_file_changes(
    no_set_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = no_set_env / "two"
    _copy("nll", folder)
    _copy("lexical", folder)
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(folder))
    reads: Counter[str] = Counter()
    real = core.learning.artifact.read_artifact_cfg

    def counted(path: Path) -> dict:
        reads[str(path)] += 1
        return real(path)

    monkeypatch.setattr(core.learning.artifact, "read_artifact_cfg", counted)
    first = load_set(KEY)
    # Each cfg.json: once when listing, once verified by the detector's loader.
    assert set(reads.values()) == {2} and len(reads) == 2
    again = load_set(KEY)
    assert again.card("nll").detector is first.card("nll").detector
    assert sum(reads.values()) == 4  # nothing read again
    cfg = folder / "nll" / "cfg.json"
    st = cfg.stat()
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert load_set(KEY).card("nll").detector is not first.card("nll").detector


def test_a_broken_artifact_is_listed_and_the_others_load(
    no_set_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = no_set_env / "mixed"
    _copy("nll", folder)
    bad = _copy("lexical", folder)
    (bad / "weights.json").write_text("{}")  # no longer the file its cfg.json sealed
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(folder))
    dset = load_set(KEY)
    assert dset.names == ("nll",)
    assert [b.name for b in dset.broken] == ["lexical"]
    with pytest.raises(Exception, match="lexical artifact cannot be loaded"):
        dset.card("lexical")
    assert dset.subset(["nll"]).names == ("nll",)


def test_trained_on_reads_both_recorded_shapes_and_ignores_malformed_facts() -> None:
    split = TrainedOn.from_cfg(
        {"trained_on": {"dataset": "builtin", "n": {"train": 1260, "validation": 270}}}
    )
    assert (split.label, split.n_train, split.recipe) == ("builtin", 1260, None)
    cv = TrainedOn.from_cfg(
        {
            "trained_on": {
                "dataset": "builtin,shared:x",
                "datasets": ["builtin", "x"],
                "n": {"builtin": 10, "x": 5},
                "recipe": {"procedure": "cv"},
                "data_hashes": {"all": "ab"},
            }
        }
    )
    assert (cv.label, cv.n_train, cv.spec) == ("builtin + x", 15, "builtin,shared:x")
    assert cv.recipe == {"procedure": "cv"} and cv.data_hashes == {"all": "ab"}
    junk = TrainedOn.from_cfg(
        {"trained_on": {"datasets": [1], "n": {"train": "many", "x": -1}, "recipe": []}}
    )
    assert (junk.datasets, junk.n_train, junk.counts, junk.recipe) == ((), None, {}, None)
    assert TrainedOn.from_cfg({"trained_on": "x", "train": {"n_train": 7}}).n_train == 7


def _with_experts(no_set_env: Path, monkeypatch: pytest.MonkeyPatch, experts: object) -> Path:
    """A custom set: the default set's artifacts, and an experts file saying ``experts``."""
    folder = Path(shutil.copytree(assets_dir() / "detectors", no_set_env / "custom"))
    text = experts if isinstance(experts, str) else json.dumps(experts)
    (folder / EXPERTS_FILE).write_text(text, encoding="utf-8")
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(folder))
    return folder


def test_a_set_defers_to_its_expert_for_the_experts_dataset_and_its_other_splits(
    no_set_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _with_experts(no_set_env, monkeypatch, {"experts": ["ragtruth", "fast", "nope", "custom"]})
    dset = load_set(KEY)
    assert dset.name == "custom" and len(dset.names) == 12
    assert set(dset.experts) == {"ragtruth_qa_dev"}
    expert = dset.experts["ragtruth_qa_dev"]
    assert (expert.name, expert.deferred_from) == ("ragtruth", "custom")
    problems = " | ".join(dset.expert_problems)
    assert len(dset.expert_problems) == 3
    assert "'fast' must be trained on one dataset alone" in problems
    assert "no detector set 'nope'" in problems and "the set itself" in problems
    for ds in ("ragtruth_qa_dev", "ragtruth_qa_test", "RAGTruth_QA_dev"):
        assert dset.for_dataset(ds) is expert
    for ds in (None, "", "builtin", "dolly_ac_dev", "ragtruth_summary_dev"):
        assert dset.for_dataset(ds) is dset
    # A subset keeps the same detectors in its expert; the cache id names the expert.
    two = dset.subset(["nll", "ensemble"])
    assert two.for_dataset("ragtruth_qa_test").names == ("nll", "ensemble")
    assert expert.cache_id in dset.cache_id
    # The shipped default set defers RAGTruth answers to the ragtruth set, usable as is.
    monkeypatch.delenv("RAGSCOPE_DETECTORS_DIR")
    default = load_set(KEY)
    assert default.name == "default" and default.expert_problems == ()
    assert {ds: e.name for ds, e in default.experts.items()} == {"ragtruth_qa_dev": "ragtruth"}
    assert default.experts["ragtruth_qa_dev"].names == default.names


def test_the_experts_are_checked_once_and_again_when_a_file_changes(
    no_set_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _with_experts(no_set_env, monkeypatch, {"experts": ["ragtruth"]})
    first = load_set(KEY)
    assert set(first.experts) == {"ragtruth_qa_dev"}
    assert load_set(KEY).experts["ragtruth_qa_dev"] is first.experts["ragtruth_qa_dev"]
    (folder / EXPERTS_FILE).write_text('{"experts": []}', encoding="utf-8")
    assert load_set(KEY).experts == {}
    (folder / EXPERTS_FILE).unlink()
    assert load_set(KEY).experts == {} and load_set(KEY).expert_problems == ()


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '["ragtruth"]',
        '{"experts": "ragtruth"}',
        '{"experts": ["ragtruth"], "also": 1}',
        '{"experts": ["../detectors"]}',
        '{"experts": ["ragtruth", "ragtruth"]}',
        json.dumps({"experts": [f"s{i}" for i in range(9)]}),
        "[" * 100_000,
    ],
    ids=["text", "list", "string", "extra-key", "path", "twice", "too-many", "huge"],
)
def test_a_malformed_experts_file_is_named_and_the_set_still_loads(
    no_set_env: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    folder = _with_experts(no_set_env, monkeypatch, text)
    dset = load_set(KEY)
    assert len(dset.names) == 12 and dset.experts == {}
    assert len(dset.expert_problems) == 1 and str(folder / EXPERTS_FILE) in dset.expert_problems[0]


def test_an_expert_reading_other_features_is_refused(
    no_set_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _with_experts(no_set_env, monkeypatch, {"experts": ["ragtruth"]})
    shutil.rmtree(folder / "spad")  # the expert's spad would need features the set never reads
    dset = load_set(KEY)
    assert dset.experts == {}
    assert (
        "the spad of the expert set 'ragtruth' reads other features than the custom set's"
        in dset.expert_problems[0]
    )


def test_an_expert_with_a_broken_artifact_is_refused(
    no_set_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = no_set_env / "detector-sets"
    expert = Path(shutil.copytree(assets_dir() / "detector-sets" / "ragtruth", shipped / "rt"))
    (expert / "spad" / "cfg.json").write_text("{", encoding="utf-8")
    monkeypatch.setattr(core.base.paths, "detector_sets_dir", lambda: shipped)
    _with_experts(no_set_env, monkeypatch, {"experts": ["rt"]})
    dset = load_set(KEY)
    assert dset.experts == {}
    assert "the spad of the expert set 'rt' cannot be loaded" in dset.expert_problems[0]
