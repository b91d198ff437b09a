"""Detector sets: which folder of artifacts is loaded, by name or by path."""

from __future__ import annotations

from pathlib import Path

import pytest

import core.base.paths
from core.base.errors import DataError
from core.base.paths import (
    CUSTOM_SET,
    DEFAULT_SET,
    detector_set_dir,
    detector_set_name,
    detector_set_names,
    shipped_dir,
)


@pytest.fixture
def assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(core.base.paths, "assets_dir", lambda: tmp_path)
    monkeypatch.delenv("RAGSCOPE_DETECTORS_DIR", raising=False)
    monkeypatch.delenv("RAGSCOPE_DETECTOR_SET", raising=False)
    for name in ("builtin", "zeta", "Bad Name", ".hidden"):
        (tmp_path / "detector-sets" / name).mkdir(parents=True)
    (tmp_path / "detector-sets" / "a-file").write_text("not a set")
    return tmp_path


def test_sets_are_default_then_named_folders(assets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert detector_set_names() == (DEFAULT_SET, "builtin", "zeta")
    assert shipped_dir() == assets / "detectors" and detector_set_name() == DEFAULT_SET
    monkeypatch.setenv("RAGSCOPE_DETECTOR_SET", "builtin")
    assert shipped_dir() == assets / "detector-sets" / "builtin"
    assert detector_set_name() == "builtin"
    # A folder of artifacts wins over a set name, and is called "custom".
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(assets / "mine"))
    assert shipped_dir() == assets / "mine" and detector_set_name() == CUSTOM_SET


@pytest.mark.parametrize("name", ["nope", "Bad Name", "../detectors", ".hidden", "a-file", ""])
def test_unknown_or_malformed_set_names_are_refused_naming_the_sets(
    assets: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    if not name:
        # An empty variable means "not set": the default set.
        monkeypatch.setenv("RAGSCOPE_DETECTOR_SET", name)
        assert shipped_dir() == assets / "detectors"
        return
    with pytest.raises(DataError, match="default, builtin, zeta"):
        detector_set_dir(name)
    monkeypatch.setenv("RAGSCOPE_DETECTOR_SET", name)
    with pytest.raises(DataError, match=r"no detector set .*RAGSCOPE_DETECTOR_SET"):
        shipped_dir()


def test_the_shipped_sets_hold_artifacts_for_the_embedded_model() -> None:
    names = detector_set_names()
    assert names[0] == DEFAULT_SET and {"builtin", "ragtruth", "fast"} <= set(names)
    for name in names:
        folder = detector_set_dir(name)
        # every set has its answer-level judge; all but the cheap one have every detector
        assert (folder / "ensemble" / "cfg.json").is_file(), f"set {name} lacks its ensemble"
        if name != "fast":
            assert (folder / "spad" / "cfg.json").is_file(), f"set {name} lacks spad"
