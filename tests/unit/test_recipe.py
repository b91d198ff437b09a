"""Training recipes as core objects (:mod:`core.evaluation.recipe`, :mod:`core.evaluation.train`): every shipped
artifact's recorded recipe reads back, writes back the same and rebuilds its recorded
command; hostile recipes are refused with the field named; ``train()`` trains a small
recipe on the tiny model and records it in one ``trained_on`` shape for both procedures."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from core.base.errors import DataError
from core.base.paths import repo_root
from core.cli import build_parser
from core.engine.model import LoadedModel
from core.evaluation.cv_run import CALIBRATIONS
from core.evaluation.recipe import (
    RECIPE_CALIBRATIONS,
    RECIPE_VERSION,
    TrainRecipe,
    options_from_flags,
    trained_on_record,
)
from core.evaluation.train import TrainCancelled, TrainOptions, TrainResult, cv_options, train
from core.pipeline.sets import TrainedOn

SHIPPED = sorted(
    [
        *(repo_root() / "assets" / "detectors").glob("*/cfg.json"),
        *(repo_root() / "assets" / "detector-sets").glob("*/*/cfg.json"),
    ]
)
TRAINED_ON_KEYS = {"dataset", "datasets", "recipe", "data_hashes", "n"}


def _recorded(cfg: Path) -> dict[str, Any]:
    return json.loads(cfg.read_text())["trained_on"]["recipe"]


def test_every_shipped_artifact_records_a_recipe() -> None:
    assert len(SHIPPED) >= 30  # assets/detectors and both shipped sets
    assert all(_recorded(p).get("command") for p in SHIPPED)


@pytest.mark.parametrize("cfg", SHIPPED, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_a_shipped_recipe_round_trips_and_rebuilds_its_command(cfg: Path) -> None:
    d = _recorded(cfg)
    recipe = TrainRecipe.from_dict(d)
    back = recipe.to_dict()
    # Every recorded field writes back as recorded; only defaults of old recipes are added
    # (a recipe without version is version 1; without options, it had none).
    for k, v in d.items():
        if k != "command":
            assert back[k] == v, k
    assert {k: back[k] for k in set(back) - set(d)} in (
        {},
        {"version": 1},
        {"version": 1, "options": {}},
    )
    assert TrainRecipe.from_dict(back) == recipe
    # The command: the recorded one. Recipes recorded since the builder shell-quotes
    # JSON words hold it quoted; the old builder joined words with spaces unquoted (a
    # shell would have split `{"spad":...}` apart), and those rebuild quoted.
    command = recipe.command()
    if "'" in d["command"] or not any(c in d["command"] for c in '{}[]"'):
        assert command == d["command"]
    else:
        assert shlex.split(command) == d["command"].split(" ")
    # And the command line parses back into the very same recipe.
    ns = build_parser().parse_args(shlex.split(command)[1:])
    assert TrainRecipe.from_args(ns) == (
        recipe if recipe.version == RECIPE_VERSION else TrainRecipe.from_dict({**d, "version": 2})
    )


def test_a_recipe_from_the_command_line_records_what_it_was_given() -> None:
    ns = build_parser().parse_args(
        [
            "train",
            "--model",
            "tiny",
            "--dataset",
            "builtin,demo",
            "--cv",
            "3",
            "--detectors",
            "nll,ensemble",
            "--set",
            'ensemble.member_configs={"spad": {"missing": "nan"}}',
            "--set",
            "nll.answer=true",
            "--set",
            "ensemble.scorer=logistic",
        ]
    )
    recipe = TrainRecipe.from_args(ns)
    assert recipe.procedure == "cv" and recipe.calibration == "crossfit"
    assert recipe.options == {
        "ensemble": {"member_configs": {"spad": {"missing": "nan"}}, "scorer": "logistic"},
        "nll": {"answer": True},
    }
    assert recipe.command() == (
        "ragscope train --model tiny --dataset builtin,demo --cv 3 --calibration crossfit "
        "--seed 0 --detectors nll,ensemble "
        """--set 'ensemble.member_configs={"spad":{"missing":"nan"}}' """
        "--set ensemble.scorer=logistic --set nll.answer=true"
    )
    assert options_from_flags(shlex.split(recipe.command())[15::2]) == recipe.detector_options()
    # A calibration choice without --cv is refused, not silently dropped.
    ns = build_parser().parse_args(["train", "--calibration", "split"])
    with pytest.raises(DataError, match="add --cv K") as err:
        TrainRecipe.from_args(ns)
    assert err.value.field == "calibration"
    # Without --detectors: the default three, as `ragscope train` trains.
    ns = build_parser().parse_args(["train", "--model", "tiny"])
    assert TrainRecipe.from_args(ns).detectors == ("nll", "context_gain", "lexical")


GOOD: dict[str, Any] = {
    "version": 2,
    "model": "tiny",
    "dataset": "builtin",
    "test_dataset": None,
    "detectors": ["nll"],
    "limit": 40,
    "seed": 0,
    "options": {},
}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": 3}, "version"),
        ({"version": "2"}, "version"),
        ({"model": None}, "model"),
        ({"model": "--device=cuda"}, "model"),
        ({"model": "tiny\x00"}, "model"),
        ({"dataset": ["builtin"]}, "dataset"),
        ({"dataset": "builtin\n--out /etc"}, "dataset"),
        ({"detectors": "nll"}, "detectors"),
        ({"detectors": []}, "detectors"),
        ({"detectors": ["nll", "nll"]}, "detectors"),
        ({"detectors": ["nll", "rm -rf /"]}, "detectors"),
        ({"detectors": ["no_such_detector"]}, "detectors"),
        ({"limit": 0}, "limit"),
        ({"limit": 1.5}, "limit"),
        ({"limit": True}, "limit"),
        ({"seed": -1}, "seed"),
        ({"options": []}, "options"),
        ({"options": {"nll": 3}}, "options"),
        ({"options": {"no_such": {}}}, "options"),
        ({"options": {"nll": {"x": float("nan")}}}, "options"),
        ({"options": {"nll": {"x": {"y": {"z": [[[[[[[[1]]]]]]]]}}}}}, "options"),
        ({"options": {"nll": {"x": "a" * 70_000}}}, "options"),
        ({"procedure": "magic"}, "procedure"),
        ({"procedure": "cv"}, "cv"),
        ({"procedure": "cv", "cv": 1}, "cv"),
        ({"procedure": "cv", "cv": 5, "calibration": "isotonic"}, "calibration"),
        ({"procedure": "cv", "cv": 5, "criterion": "accuracy"}, "criterion"),
        ({"procedure": "cv", "cv": 5, "test_dataset": "demo"}, "test_dataset"),
        ({"calibration": "split"}, "calibration"),
        ({"shell": "rm -rf /"}, "shell"),
    ],
)
def test_a_hostile_recipe_is_refused_with_its_field_named(
    change: dict[str, Any], field: str
) -> None:
    with pytest.raises(DataError) as err:
        TrainRecipe.from_dict({**GOOD, **change})
    assert err.value.field == field, err.value
    assert "training recipe" in str(err.value)


def test_a_recipe_is_frozen_and_reads_as_json_only() -> None:
    with pytest.raises(DataError, match="JSON object"):
        TrainRecipe.from_dict(["not", "a", "recipe"])
    recipe = TrainRecipe.from_dict({**GOOD, "options": {"nll": {"x": [1, 2]}}})
    with pytest.raises(TypeError):
        recipe.options["nll"]["x"] = 3  # type: ignore[index]
    d = recipe.to_dict()
    d["options"]["nll"]["x"].append(3)  # a copy: the recipe is unchanged
    assert recipe.to_dict()["options"] == {"nll": {"x": [1, 2]}}
    assert json.loads(json.dumps(recipe.to_dict())) == recipe.to_dict()
    assert RECIPE_CALIBRATIONS == CALIBRATIONS


def test_a_version_1_recipe_rebuilds_as_it_was_then() -> None:
    old = TrainRecipe.from_dict(
        {k: v for k, v in {**GOOD, "detectors": ["ensemble"]}.items() if k != "version"}
    )
    assert old.version == 1 and old.fit_calibration == "split"
    assert old.detector_options() == {"ensemble": {"stacking": "split"}}
    new = TrainRecipe.from_dict({**GOOD, "detectors": ["ensemble"], "procedure": "cv", "cv": 3})
    assert new.fit_calibration == "crossfit" and new.detector_options() == {}


def _small(**kw: Any) -> TrainRecipe:
    return TrainRecipe(model="tiny", dataset="builtin", detectors=("nll", "lexical"), **kw)


@pytest.fixture
def cache_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "db.sqlite3"))
    return tmp_path


@pytest.mark.parametrize("cv", [None, 3])
def test_train_runs_a_recipe_and_writes_one_trained_on_shape(
    tiny_model: LoadedModel, cache_here: Path, cv: int | None
) -> None:
    recipe = _small(limit=48, cv=cv, calibration="crossfit" if cv else None)
    out = cache_here / "out"
    result = train(recipe, out, model=tiny_model, options=TrainOptions(bootstrap=0))
    assert isinstance(result, TrainResult) and result.recipe == recipe
    assert result.auroc_from == ("3-fold CV" if cv else "test split")
    assert set(result.auroc()) == {"nll", "lexical"}
    for name in recipe.detectors:
        cfg = json.loads((result.artifacts[name] / "cfg.json").read_text())
        node = cfg["trained_on"]
        assert set(node) == TRAINED_ON_KEYS
        assert node["recipe"] == recipe.to_dict() and node["dataset"] == "builtin"
        assert node["datasets"] == ["builtin"]
        assert set(node["n"]) == ({"builtin"} if cv else {"train", "validation", "test"})
        assert set(node["data_hashes"]) == ({"all", "builtin"} if cv else set(node["n"]))
        # The one reader reads what the one writer wrote.
        read = TrainedOn.from_cfg(cfg)
        assert read.datasets == ("builtin",) and read.recipe == recipe.to_dict()
        assert read.n_train == (node["n"]["builtin"] if cv else node["n"]["train"]) > 0
        assert cfg["threshold_criterion"] == ("balanced_accuracy" if cv else "f1")


def test_train_stops_when_cancelled_and_saves_nothing(
    tiny_model: LoadedModel, cache_here: Path
) -> None:
    asked: list[int] = []

    def cancel() -> bool:
        asked.append(1)
        return len(asked) > 3  # a few examples in

    out = cache_here / "out"
    with pytest.raises(TrainCancelled):
        train(_small(limit=48), out, model=tiny_model, cancel=cancel)
    assert len(asked) == 4 and not out.exists()


def test_trained_on_record_names_its_parts() -> None:
    assert trained_on_record(None, dataset="x", parts={}, fitted=[]) == {
        "dataset": "x",
        "datasets": [],
        "recipe": {},
        "data_hashes": {},
        "n": {},
    }


def test_a_cv_recipe_gives_its_cross_validation_by_one_function(tmp_path: Path) -> None:
    """What a cross-validated recipe runs (folds, seed, criterion, calibration) comes
    from the recipe; the bootstrap, name and checkpoint from the run's options."""
    recipe = TrainRecipe(
        model="tiny", dataset="demo", detectors=("nll",), seed=3, cv=4, calibration="split"
    )
    opts = cv_options(recipe, TrainOptions(bootstrap=50, name="run"), checkpoint=tmp_path)
    assert (opts.k, opts.seed, opts.calibration, opts.n_boot, opts.name, opts.checkpoint) == (
        4,
        3,
        recipe.fit_calibration,
        50,
        "run",
        tmp_path,
    )
    assert opts.criterion == recipe.fit_criterion
    assert opts.calibrate_on == recipe.calibrate_on_names
    with pytest.raises(DataError, match="cv"):
        cv_options(replace(recipe, cv=None), TrainOptions())
