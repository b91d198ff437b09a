"""Training recipes: what rebuilds a trained detector set, and what an artifact records.

A :class:`TrainRecipe` holds the inputs of one training run (model, datasets,
detectors and their options, limit, seed, the procedure: one split or K-fold
cross-validation with its calibration and threshold criterion). Every artifact a run
saves records it under ``cfg.json["trained_on"]["recipe"]`` (:func:`trained_on_record`,
the one writer of ``trained_on``), ``ragscope train --reproduce`` reads it back
(:meth:`TrainRecipe.from_dict`, which refuses anything it does not write: artifact
folders are sent around), and :meth:`TrainRecipe.command` is the one builder of a
``ragscope train`` command line, for the CLI, background jobs and every page's hint.

The training loop itself is :func:`core.evaluation.train.train` (a layer above, beside
cross-validation).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from core.base.errors import DataError
from core.base.examples import RAGExample, control_character
from core.data import data_hash
from core.detectors import DETECTORS, available_detectors

RECIPE_VERSION = 2
"""Version 2: calibration (``--cv``) and the ensemble's stacking cross-fitted by default;
recipes without a version are version 1 and rebuild with both on the validation split."""
DEFAULT_DETECTORS: tuple[str, ...] = DETECTORS.trained_by_default()
"""What ``ragscope train`` trains without ``--detectors`` (the detectors' trait)."""
Procedure = Literal["split", "cv"]
RecipeCalibration = Literal["crossfit", "split"]
RECIPE_CALIBRATIONS: tuple[RecipeCalibration, ...] = ("crossfit", "split")
"""``--calibration`` choices (:data:`core.evaluation.crossval.CALIBRATIONS`, which a test holds equal)."""
Criterion = Literal["balanced_accuracy", "f1"]
CRITERIA: tuple[Criterion, ...] = ("balanced_accuracy", "f1")
MAX_FOLDS = 100
_KEYS = frozenset(
    {
        "version",
        "model",
        "dataset",
        "test_dataset",
        "detectors",
        "limit",
        "seed",
        "options",
        "procedure",
        "cv",
        "calibrate_on",
        "calibration",
        "criterion",
        "command",
    }
)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
_MAX_TEXT = 2000
_MAX_OPTION_BYTES = 64 * 1024
_MAX_DEPTH = 8


def _refuse(field_name: str, why: str) -> DataError:
    return DataError(f"a training recipe's {field_name} {why}", field=field_name)


def _text(name: str, value: object, *, optional: bool = False) -> str | None:
    """A one-line value of an option: a string, not an option's look-alike, no control
    characters (it becomes one argument of a command line)."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _refuse(name, f"must be a non-empty string, not {str(value)[:80]!r}")
    if len(value) > _MAX_TEXT:
        raise _refuse(name, f"is {len(value)} characters long (at most {_MAX_TEXT})")
    if value.startswith("-"):
        raise _refuse(name, f"cannot start with '-' ({value[:80]!r})")
    if (bad := control_character(value)) is not None:
        raise _refuse(name, f"{value[:80]!r} holds the control character U+{ord(bad[1]):04X}")
    return value


def _count(name: str, value: object, *, low: int, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        span = f"from {low}" if high is None else f"from {low} to {high}"
        raise _refuse(name, f"must be a whole number {span}, not {str(value)[:40]!r}")
    if high is not None and value > high:
        raise _refuse(name, f"must be at most {high}, not {value}")
    return value


def _detector_name(name: str, value: object, known: set[str]) -> str:
    if not isinstance(value, str) or not value or not set(value) <= _NAME_CHARS:
        raise _refuse(name, f"names a detector {str(value)[:40]!r} that is not a detector name")
    if value not in known:
        raise _refuse(name, f"names the unknown detector {value!r}; known: {sorted(known)}")
    return value


def _json_value(name: str, value: object, depth: int = 0) -> Any:
    """A copy of a JSON option value (strings, finite numbers, booleans, null, lists and
    objects with string keys), refusing anything else."""
    if depth > _MAX_DEPTH:
        raise _refuse(name, f"nests deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _refuse(name, f"holds the number {value!r}; write finite numbers")
        return value
    if isinstance(value, list | tuple):
        return [_json_value(name, v, depth + 1) for v in value]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise _refuse(name, "has an object with a key that is not a string")
        return {k: _json_value(name, v, depth + 1) for k, v in value.items()}
    raise _refuse(name, f"holds a {type(value).__name__}, not a JSON value")


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _flag_value(value: Any) -> str:
    """How ``--set NAME.OPTION=VALUE`` writes ``value`` so that :func:`options_from_flags`
    reads it back: a string bare when it does not parse as JSON, else compact JSON."""
    if isinstance(value, str) and value:
        try:
            json.loads(value)
        except json.JSONDecodeError:
            return value
    return json.dumps(_thaw(value), separators=(",", ":"), ensure_ascii=False)


def options_from_flags(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``--set NAME.OPTION=VALUE`` flags -> ``{name: {option: value}}`` (values read as JSON
    when they parse, else as strings: ``scorer=logistic``, ``pool=sum``, ``topk_frac=0.2``).

    Raises:
        DataError: A flag that is not ``NAME.OPTION=VALUE``.
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        name, dot, option = key.partition(".")
        if not (eq and dot and name and option):
            raise DataError(
                f"--set {item!r}: write DETECTOR.OPTION=VALUE, e.g. redeep_token.scorer=logistic"
            )
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(name, {})[option] = value
    return out


@dataclass(frozen=True, kw_only=True)
class TrainRecipe:
    """The inputs that rebuild one training run (what ``ragscope train`` records).

    Attributes:
        model: The model as ``--model`` names it (``embedded``, ``tiny``, a hub id, ...).
        dataset: ``--dataset`` (several comma-separated with cross-validation).
        detectors: Registered detector names, in training order.
        test_dataset: ``--test-dataset`` (one split only: test on all of this one).
        limit: ``--limit`` (about this many examples, whole sources; ``None``: all).
        seed: ``--seed`` (the split and fold seed).
        options: Detector name -> its config options (``--set NAME.OPTION=VALUE``).
        cv: ``--cv K``: K-fold cross-validated metrics, then a final fit on every answer
            (``None``: one train/validation/test split).
        calibrate_on: With ``cv``: ``--calibrate-on`` (comma-separated dataset names).
        calibration: With ``cv``: ``crossfit`` or ``split`` (``None``: unrecorded, read
            as the version's default, :attr:`fit_calibration`).
        criterion: What the answer threshold maximises (``None``: balanced accuracy with
            ``cv``, F1 on one split).
        version: The recipe's semantics (:data:`RECIPE_VERSION`; 1: recorded before
            cross-fitting existed).

    Raises:
        DataError: A value ``ragscope train`` would refuse, naming the field.
    """

    model: str
    dataset: str
    detectors: tuple[str, ...]
    test_dataset: str | None = None
    limit: int | None = None
    seed: int = 0
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    cv: int | None = None
    calibrate_on: str | None = None
    calibration: RecipeCalibration | None = None
    criterion: Criterion | None = None
    version: int = RECIPE_VERSION

    def __post_init__(self) -> None:
        _count("version", self.version, low=1, high=RECIPE_VERSION)
        _text("model", self.model)
        _text("dataset", self.dataset)
        _text("test_dataset", self.test_dataset, optional=True)
        _text("calibrate_on", self.calibrate_on, optional=True)
        known = set(available_detectors())
        if not isinstance(self.detectors, tuple) or not self.detectors:
            raise _refuse("detectors", "must name at least one detector")
        for d in self.detectors:
            _detector_name("detectors", d, known)
        if len(set(self.detectors)) != len(self.detectors):
            raise _refuse("detectors", f"name a detector twice: {list(self.detectors)}")
        if self.limit is not None:
            _count("limit", self.limit, low=1)
        _count("seed", self.seed, low=0)
        if self.cv is not None:
            _count("cv", self.cv, low=2, high=MAX_FOLDS)
        if self.calibration is not None and self.calibration not in RECIPE_CALIBRATIONS:
            raise _refuse("calibration", f"must be one of {RECIPE_CALIBRATIONS}")
        if self.criterion is not None and self.criterion not in CRITERIA:
            raise _refuse("criterion", f"must be one of {CRITERIA}")
        if self.cv is None and (self.calibrate_on or self.calibration):
            raise _refuse(
                "calibration", "(and calibrate_on) belong to cross-validated training (cv)"
            )
        if self.cv is not None and self.test_dataset is not None:
            raise _refuse("test_dataset", "does not combine with cross-validation (cv)")
        if not isinstance(self.options, Mapping):
            raise _refuse("options", "must be an object of detector name -> options")
        opts: dict[str, Any] = {}
        for name, o in self.options.items():
            _detector_name("options", name, known)
            if not isinstance(o, Mapping) or not all(isinstance(k, str) and k for k in o):
                raise _refuse("options", f"of {name} must be an object of option -> value")
            opts[name] = _json_value("options", o)
        if len(json.dumps(opts)) > _MAX_OPTION_BYTES:
            raise _refuse("options", f"are longer than {_MAX_OPTION_BYTES} bytes")
        object.__setattr__(self, "options", _freeze(opts))

    # -------------------------------------------------------------------- reading

    @property
    def procedure(self) -> Procedure:
        return "cv" if self.cv is not None else "split"

    @property
    def fit_calibration(self) -> RecipeCalibration:
        """The calibration it fits with: recorded, else ``crossfit`` (version 2) or
        ``split`` (version 1, before cross-fitting)."""
        if self.version < 2:
            return "split"
        return self.calibration or "crossfit"

    @property
    def fit_criterion(self) -> Criterion:
        return self.criterion or ("balanced_accuracy" if self.cv is not None else "f1")

    @property
    def calibrate_on_names(self) -> list[str] | None:
        raw = self.calibrate_on
        return [x.strip() for x in raw.split(",") if x.strip()] if raw else None

    def detector_options(self) -> dict[str, dict[str, Any]]:
        """The options each detector is made with (plain dicts), those of version 1
        rebuilding the ensemble's stacking on the validation split as it was then."""
        opts = {n: dict(_thaw(o)) for n, o in self.options.items()}
        composite = DETECTORS.composite()
        if self.version < 2 and composite in self.detectors:
            opts.setdefault(composite, {}).setdefault("stacking", "split")
        return opts

    def with_detectors(self, names: Sequence[str]) -> TrainRecipe:
        """The same recipe for ``names`` only (their options kept, the others' dropped)."""
        keep = tuple(names)
        return replace(
            self, detectors=keep, options={n: o for n, o in self.options.items() if n in keep}
        )

    # -------------------------------------------------------------------- writing

    def argv(self, *, out: str | None = None, device: str | None = None) -> list[str]:
        """The ``ragscope`` arguments of :meth:`command` (``train ...``)."""
        args = ["train", "--model", self.model, "--dataset", self.dataset]
        if self.cv is not None:
            args += ["--cv", str(self.cv)]
            if self.calibrate_on:
                args += ["--calibrate-on", self.calibrate_on]
            if self.criterion:
                args += ["--criterion", self.criterion]
            if self.calibration:
                args += ["--calibration", self.calibration]
        elif self.criterion:
            args += ["--criterion", self.criterion]
        if self.test_dataset:
            args += ["--test-dataset", self.test_dataset]
        if self.limit:
            args += ["--limit", str(self.limit)]
        args += ["--seed", str(self.seed), "--detectors", ",".join(self.detectors)]
        for name, o in self.options.items():
            args += [x for k, v in o.items() for x in ("--set", f"{name}.{k}={_flag_value(v)}")]
        if device is not None:
            args += ["--device", device]
        if out is not None:
            args += ["--out", out]
        return args

    def command(self, *, out: str | None = None, device: str | None = None) -> str:
        """The ``ragscope train ...`` command line that runs this recipe (shell-quoted;
        the one builder of a train command), writing into ``out`` on ``device`` when
        given (neither is part of the recipe)."""
        return "ragscope " + shlex.join(self.argv(out=out, device=device))

    def to_dict(self) -> dict[str, Any]:
        """What an artifact records (``trained_on.recipe``; JSON types only)."""
        d: dict[str, Any] = {
            "version": self.version,
            "model": self.model,
            "dataset": self.dataset,
            "test_dataset": self.test_dataset,
            "detectors": list(self.detectors),
            "limit": self.limit,
            "seed": self.seed,
            "options": {n: dict(_thaw(o)) for n, o in self.options.items()},
        }
        if self.cv is not None:
            d.update(
                procedure="cv",
                cv=self.cv,
                calibrate_on=self.calibrate_on,
                calibration=self.calibration,
                criterion=self.criterion,
            )
        elif self.criterion is not None:
            d["criterion"] = self.criterion
        d["command"] = self.command()
        return d

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> TrainRecipe:
        """The recipe of a ``ragscope train`` command line (its parsed options).

        Raises:
            DataError: An option combination ``train`` refuses (named).
        """
        cv = getattr(ns, "cv", None)
        calibrate_on = getattr(ns, "calibrate_on", None)
        calibration = getattr(ns, "calibration", None)
        if cv is None and (calibrate_on or calibration):
            raise DataError(
                "--calibration and --calibrate-on choose how cross-validated training "
                "calibrates; add --cv K, or leave them out",
                field="calibration",
            )
        names = [d for d in (getattr(ns, "detectors", None) or "").split(",") if d]
        return cls(
            model=ns.model,
            dataset=ns.dataset,
            test_dataset=getattr(ns, "test_dataset", None),
            detectors=tuple(names or DEFAULT_DETECTORS),
            limit=getattr(ns, "limit", None),
            seed=getattr(ns, "seed", 0),
            options=options_from_flags(getattr(ns, "set", None) or []),
            cv=cv,
            calibrate_on=calibrate_on,
            calibration=(calibration or "crossfit") if cv is not None else None,
            criterion=getattr(ns, "criterion", None),
        )

    @classmethod
    def from_dict(cls, d: object) -> TrainRecipe:
        """A recorded recipe, read as untrusted (``cfg.json`` is anyone's to edit): the
        fields :meth:`to_dict` writes, of exactly their types; ``command`` is derived
        and not read. A recipe without ``version`` is version 1, without ``options``
        has none.

        Raises:
            DataError: Not an object, an unknown field, or a field of the wrong type or
                value (named).
        """
        if not isinstance(d, Mapping):
            raise DataError(f"a training recipe must be a JSON object, not {type(d).__name__}")
        unknown = sorted(str(k)[:40] for k in d if k not in _KEYS)
        if unknown:
            raise DataError(
                f"a training recipe has unknown fields {unknown[:10]}; known: {sorted(_KEYS)}",
                field=unknown[0],
            )
        detectors = d.get("detectors")
        if not isinstance(detectors, list):
            raise _refuse("detectors", "must be a list of detector names")
        options = d.get("options", {})
        if not isinstance(options, dict):
            raise _refuse("options", "must be an object of detector name -> options")
        procedure = d.get("procedure", "cv" if d.get("cv") is not None else "split")
        if procedure not in ("cv", "split"):
            raise _refuse("procedure", f"must be 'cv' or 'split', not {str(procedure)[:40]!r}")
        cv = d.get("cv")
        if (procedure == "cv") != (cv is not None):
            raise _refuse("cv", f"{cv!r} does not fit the procedure {procedure!r}")
        return cls(
            version=d.get("version", 1),
            model=d.get("model"),  # type: ignore[arg-type]  # checked in __post_init__
            dataset=d.get("dataset"),  # type: ignore[arg-type]  # checked in __post_init__
            test_dataset=d.get("test_dataset"),
            detectors=tuple(detectors),
            limit=d.get("limit"),
            seed=d.get("seed", 0),
            options=options,
            cv=cv,
            calibrate_on=d.get("calibrate_on"),
            calibration=d.get("calibration"),
            criterion=d.get("criterion"),
        )


def trained_on_record(
    recipe: TrainRecipe | None,
    *,
    dataset: str,
    parts: Mapping[str, Sequence[RAGExample]],
    fitted: Sequence[RAGExample],
    all_hash: str | None = None,
) -> dict[str, Any]:
    """``cfg.json["trained_on"]`` (its one writer, for cross-validated and split training).

    Args:
        recipe: The run's recipe (``None``: a fit outside ``ragscope train``, recorded
            as an empty recipe that ``--reproduce`` refuses).
        dataset: The ``--dataset`` spec it was trained with.
        parts: The answers the run read, by part: each dataset's (cross-validated
            training: every answer fitted) or each split's (``train``/``validation``/
            ``test``).
        fitted: The answers it was fitted and calibrated on (their datasets are named).
        all_hash: The hash of all the answers, when the run has one.

    Returns:
        ``{"dataset", "datasets", "recipe", "data_hashes", "n"}``: the spec, the training
        datasets by name, the recipe, each part's data hash (and ``all``) and size.
    """
    hashes = {"all": all_hash} if all_hash else {}
    return {
        "dataset": dataset,
        "datasets": sorted({e.provenance.dataset or "unknown" for e in fitted}),
        "recipe": recipe.to_dict() if recipe is not None else {},
        "data_hashes": {**hashes, **{k: data_hash(list(v)) for k, v in parts.items()}},
        "n": {k: len(v) for k, v in parts.items()},
    }
