"""Artifact folders: how a fitted detector is saved, verified and loaded.

An artifact folder holds ``cfg.json`` (detector name, config and its hash, the model
key it was trained on, library versions, training facts, threshold, calibration and
metrics, and the SHA-256 of every other file) and the learner's weights
(``weights.json``, safetensors, skops). :func:`save_fitted` / :func:`load_fitted` are
what every detector's ``save`` / ``load`` build on; :func:`read_artifact` verifies every
file against the recorded hashes before anything else is read, so nothing unverified or
unbounded is ever parsed, and :func:`read_skops` accepts only allowlisted exact types.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.base.errors import DataError, ModelError, RagscopeError, brief
from core.base.safeio import (
    FittedAt,
    MiB,
    SkopsType,
    check_fitted,
    json_default,
    load_skops,
    read_json_file,
    sha256_file,
)
from core.learning.calibration import PlattCalibrator, read_dataset_calibrations
from core.learning.contract import ARTIFACT_VERSION, MALFORMED, DetectorConfig, require_fitted
from core.learning.span_rule import SpanRule


def library_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("ragscope", "torch", "transformers", "transformer-lens", "scikit-learn", "numpy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            continue
    return out


ARTIFACT_JSON_LIMIT = 64 * MiB
"""Largest ``cfg.json`` / ``weights.json`` read from an artifact."""
MAX_ARTIFACT_BYTES = 512 * MiB
"""Most bytes an artifact folder may hold in all (members included), checked from the
files' sizes before any byte is hashed: every load re-hashes every file. The largest
shipped artifact (the ensemble with its members) holds under 5 MiB."""
ARTIFACT_FILE_LIMIT = MAX_ARTIFACT_BYTES
"""Largest single file an artifact may hold (hashed in chunks, never read whole)."""
MAX_ARTIFACT_FILES = 1000
_HEX64 = re.compile(r"[0-9a-f]{64}")


def _artifact_files(folder: Path) -> dict[str, Path]:
    """Every file of an artifact folder but its own ``cfg.json``: relative POSIX name ->
    path, recursively (an ensemble holds its members' folders).

    Raises:
        DataError: A symlink, a special file (FIFO, device, ...), or too many files.
    """
    out: dict[str, Path] = {}
    stack = [folder]
    while stack:
        d = stack.pop()
        try:
            entries = sorted(d.iterdir())
        except OSError as e:
            raise DataError(f"cannot list the artifact ({e.strerror or e})", source=str(d)) from e
        for p in entries:
            rel = p.relative_to(folder).as_posix()
            if p.is_symlink():
                raise DataError(
                    f"the artifact holds a symbolic link ({rel}); artifacts hold plain files "
                    "only, copy the real file in or retrain",
                    source=str(folder),
                )
            if p.is_dir():
                stack.append(p)
            elif p.is_file():
                if rel != "cfg.json":
                    out[rel] = p
            else:
                raise DataError(
                    f"the artifact holds {rel}, which is not a regular file", source=str(folder)
                )
            if len(out) > MAX_ARTIFACT_FILES:
                raise DataError(
                    f"the artifact holds over {MAX_ARTIFACT_FILES} files; is this the right "
                    "folder?",
                    source=str(folder),
                )
    return out


def artifact_files(folder: str | Path) -> dict[str, Path]:
    """Every file of an artifact folder but its ``cfg.json`` (relative name -> path),
    after checking the folder holds only plain files and folders and at most
    :data:`MAX_ARTIFACT_BYTES` in all, from the sizes alone (nothing is read).

    Raises:
        DataError: A symbolic link anywhere in it (its ``cfg.json``, a member's folder),
            a special file, too many files or too many bytes (naming the folder, its
            size and the cap).
    """
    path = Path(folder)
    files = _artifact_files(path)
    cfg = path / "cfg.json"
    total = sum(p.lstat().st_size for p in files.values())
    total += cfg.lstat().st_size if cfg.is_file() else 0
    if total > MAX_ARTIFACT_BYTES:
        raise DataError(
            f"the artifact holds {total:,} bytes in {len(files) + 1} files, over the "
            f"{MAX_ARTIFACT_BYTES:,}-byte ({MAX_ARTIFACT_BYTES // MiB} MiB) limit for a "
            "detector artifact (every load re-hashes every byte); is this the right folder?",
            source=str(path),
        )
    return files


def artifact_hashes(folder: str | Path) -> dict[str, str]:
    """SHA-256 of every file of an artifact folder but its ``cfg.json``, by relative name
    (what ``cfg.json`` records under ``files``).

    Raises:
        DataError: A file over :data:`ARTIFACT_FILE_LIMIT`, a symlink or special file.
    """
    out: dict[str, str] = {}
    for rel, p in sorted(artifact_files(folder).items()):
        size = p.stat().st_size
        if size > ARTIFACT_FILE_LIMIT:
            raise DataError(
                f"{rel} is {size:,} bytes, over the {ARTIFACT_FILE_LIMIT:,}-byte limit per "
                "artifact file",
                source=str(folder),
            )
        out[rel] = sha256_file(p)
    return out


def verify_artifact(folder: str | Path, cfg: Mapping[str, Any], *, name: str) -> None:
    """Check an artifact's files against the SHA-256 hashes its ``cfg.json`` records.

    Every file must be recorded (nothing unverified is ever read) and match its hash.

    Raises:
        DataError: No hashes recorded (an artifact from before ragscope recorded them),
            a malformed record, a missing, extra, changed, linked or oversized file.
            The message names the file and the fix.
    """
    path = Path(folder)
    retrain = f"retrain it with `ragscope train --detectors {name}`"
    files = cfg.get("files")
    if files is None:
        raise DataError(
            "the artifact records no file hashes (made before ragscope recorded them, or "
            f"edited); {retrain}, or, if you made it yourself, record them with "
            f"`ragscope artifacts seal {path}` (which first checks that it loads safely)",
            source=str(path),
        )
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and _HEX64.fullmatch(v) for k, v in files.items()
    ):
        raise DataError(
            f"cfg.json's 'files' must map file names to SHA-256 hex digests; {retrain}",
            source=str(path),
        )
    present = artifact_files(path)
    unrecorded = sorted(set(present) - set(files))
    if unrecorded:
        raise DataError(
            f"the artifact holds files its cfg.json does not record: {', '.join(unrecorded[:5])}; "
            f"remove them or {retrain}",
            source=str(path),
        )
    missing = sorted(set(files) - set(present))
    if missing:
        raise DataError(
            f"the artifact is missing {', '.join(missing[:5])}; {retrain}", source=str(path)
        )
    for rel in sorted(files):
        p = present[rel]
        size = p.stat().st_size
        if size > ARTIFACT_FILE_LIMIT:
            raise DataError(
                f"{rel} is {size:,} bytes, over the {ARTIFACT_FILE_LIMIT:,}-byte limit; {retrain}",
                source=str(path),
            )
        if sha256_file(p) != files[rel]:
            raise DataError(
                f"{rel} does not match the SHA-256 recorded in cfg.json (damaged or edited "
                f"since it was written); {retrain}",
                source=str(path),
            )


def write_artifact(
    folder: str | Path,
    *,
    name: str,
    config: DetectorConfig,
    model_key: str,
    weights: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
    files: Mapping[str, Callable[[Path], None]] | None = None,
) -> Path:
    """Write an artifact folder (created): ``weights.json``, the learner's own ``files``
    (name -> a function writing that path), then ``cfg.json`` last, recording the
    SHA-256 of every other file in the folder under ``files``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "weights.json").write_text(json.dumps(weights, indent=1, default=json_default) + "\n")
    for fname, write in (files or {}).items():
        write(out / fname)
    cfg = {
        "detector": name,
        "artifact_version": ARTIFACT_VERSION,
        "config": config.to_dict(),
        "config_hash": config.config_hash(),
        "model": model_key,
        "versions": library_versions(),
        **(extra or {}),
        "files": artifact_hashes(out),
    }
    (out / "cfg.json").write_text(json.dumps(cfg, indent=2, default=json_default) + "\n")
    return out


def save_fitted(
    detector: Any,
    folder: str | Path,
    *,
    weights: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
    files: Mapping[str, Callable[[Path], None]] | None = None,
) -> Path:
    """Every fitted detector's ``save``: :func:`write_artifact` with the detector's name,
    config and model key, and what :func:`fitted_extra` records beside ``extra``.

    Raises:
        NotFittedError: The detector has not been fitted (no model key yet).
    """
    require_fitted(detector, "model_key_", detector.name)
    return write_artifact(
        folder,
        name=detector.name,
        config=detector.config,
        model_key=detector.model_key_,
        weights=weights,
        extra=fitted_extra(detector, extra),
        files=files,
    )


def read_artifact_cfg(path: Path) -> dict[str, Any]:
    cfg = read_json_file(path, ARTIFACT_JSON_LIMIT, what="artifact cfg.json")
    if not isinstance(cfg, dict):
        raise DataError("cfg.json must hold a JSON object", source=str(path))
    return cfg


def read_artifact(folder: str | Path, *, name: str, model_key: str | None) -> tuple[dict, dict]:
    """Read, verify and check an artifact folder; returns ``(cfg, weights)``.

    ``cfg.json`` is read first (bounded), then every other file is checked against the
    hashes it records (:func:`verify_artifact`) before anything else is read.

    Raises:
        DataError: missing, malformed, oversized, unrecorded or changed files, or
            another detector's artifact.
        ModelError: the artifact was trained on another model than ``model_key``.
    """
    path = Path(folder)
    cfg_path, w_path = path / "cfg.json", path / "weights.json"
    if not cfg_path.is_file() or not w_path.is_file():
        raise DataError(
            f"no detector artifact here (need cfg.json and weights.json); train one with "
            f"`ragscope train --detectors {name}`",
            source=str(path),
        )
    retrain = f"retrain it with `ragscope train --detectors {name}`"
    try:
        cfg = read_artifact_cfg(cfg_path)
    except DataError as e:
        raise DataError(f"{e.reason}; {retrain}", source=str(cfg_path)) from e
    if cfg.get("detector") != name:
        raise DataError(
            f"artifact is for detector {cfg.get('detector')!r}, not {name!r}", source=str(path)
        )
    version = cfg.get("artifact_version")
    if type(version) is not int:
        raise DataError(
            f"artifact_version must be the integer {ARTIFACT_VERSION}, got "
            f"{describe_json(version)}; {retrain}",
            source=str(cfg_path),
        )
    if version != ARTIFACT_VERSION:
        raise DataError(
            f"artifact version {version} is not {ARTIFACT_VERSION}; {retrain}", source=str(path)
        )
    if model_key is not None and cfg.get("model") != model_key:
        raise ModelError(
            f"{path} was trained on model {cfg.get('model')!r}, not {model_key!r}; load the model it "
            f"was made for or retrain it with `ragscope train --detectors {name} --model ...`"
        )
    verify_artifact(path, cfg, name=name)
    try:
        weights = read_json_file(w_path, ARTIFACT_JSON_LIMIT, what="artifact weights.json")
    except DataError as e:
        raise DataError(f"{e.reason}; {retrain}", source=str(w_path)) from e
    if not isinstance(weights, dict):
        raise DataError(f"weights.json must hold a JSON object; {retrain}", source=str(w_path))
    return cfg, weights


def describe_json(value: object) -> str:
    """A JSON value and its type, for messages: ``the string "1"``, ``the number 1.5``."""
    if isinstance(value, str):
        text = json.dumps(value[:40]) + ("..." if len(value) > 40 else "")
        return f"the string {text}"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int) and abs(value) >= 10**18:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    return f"a JSON {'list' if isinstance(value, list) else 'object'}"


def artifact_info(folder: str | Path) -> dict[str, Any]:
    """``cfg.json`` of an artifact folder, unchecked (for listings).

    Raises:
        DataError: No readable ``cfg.json`` there.
    """
    path = Path(folder) / "cfg.json"
    try:
        return read_artifact_cfg(path)
    except DataError as e:
        raise DataError(f"cannot read artifact config ({e.reason})", source=str(path)) from e


def _diff(a: Any, b: Any, where: str, rtol: float, atol: float, out: list[str]) -> None:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{where}.{k}: only in {'the original' if k in a else 'the rebuild'}")
            else:
                _diff(a[k], b[k], f"{where}.{k}", rtol, atol, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{where}: length {len(a)} vs {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{where}[{i}]", rtol, atol, out)
    elif isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool):
        if not np.isclose(float(a), float(b), rtol=rtol, atol=atol, equal_nan=True):
            out.append(f"{where}: {a!r} vs {b!r}")
    elif a != b:
        out.append(f"{where}: {a!r} vs {b!r}")


def cfg_at(cfg: object, *path: str) -> object:
    """``cfg[path[0]][path[1]]...``, or ``None`` where a level is missing."""
    node = cfg
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _count(value: object) -> int | None:
    """``value`` when it is a count (a non-negative int), else ``None``."""
    return value if type(value) is int and value >= 0 else None


def cfg_number(value: object) -> float | None:
    """``value`` as a float when it is a number (not a bool), else ``None``."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True, kw_only=True)
class TrainedOn:
    """What an artifact was trained on (the one reader of ``cfg.json["trained_on"]``).

    Attributes:
        spec: The ``--dataset`` it was trained with (e.g. ``builtin,shared:ragtruth_qa_dev``).
        datasets: The training datasets by name (from the answers' provenance).
        counts: Answers per training dataset (cross-validated training), or per split
            (``train``/``validation``/``test``, trained on one split).
        n_train: The answers it was fitted on.
        recipe: The recorded training recipe (what ``ragscope train --reproduce`` runs).
        data_hashes: Hashes of the training data, all and per dataset.
    """

    spec: str | None = None
    datasets: tuple[str, ...] = ()
    counts: Mapping[str, int] = field(default_factory=dict)
    n_train: int | None = None
    recipe: Mapping[str, Any] | None = None
    data_hashes: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any]) -> TrainedOn:
        """Read an artifact's ``cfg.json``; missing or malformed facts are left empty
        (an artifact records what its ragscope version knew)."""
        node = cfg.get("trained_on")
        node = node if isinstance(node, dict) else {}
        sets = node.get("datasets")
        datasets = (
            tuple(sets) if isinstance(sets, list) and all(isinstance(x, str) for x in sets) else ()
        )
        raw = node.get("n")
        counts = (
            {k: n for k, v in raw.items() if isinstance(k, str) and (n := _count(v)) is not None}
            if isinstance(raw, dict)
            else {}
        )
        n_train: int | None
        if "train" in counts:
            n_train = counts["train"]
        elif datasets:
            n_train = sum(counts.get(d, 0) for d in datasets) or None
        else:
            n_train = _count(cfg_at(cfg, "train", "n_train"))
        spec = node.get("dataset")
        if not datasets and isinstance(spec, str) and spec:
            datasets = (spec,)
        recipe = node.get("recipe")
        hashes = node.get("data_hashes")
        return cls(
            spec=spec if isinstance(spec, str) else None,
            datasets=datasets,
            counts=counts,
            n_train=n_train,
            recipe=recipe if isinstance(recipe, dict) and recipe else None,
            data_hashes=(
                {k: v for k, v in hashes.items() if isinstance(k, str) and isinstance(v, str)}
                if isinstance(hashes, dict)
                else {}
            ),
        )

    @property
    def label(self) -> str | None:
        """The training data in words: ``builtin + ragtruth_qa_dev``; ``None`` unrecorded."""
        return " + ".join(self.datasets) if self.datasets else None


def compare_artifacts(
    original: str | Path, rebuilt: str | Path, *, rtol: float = 1e-4, atol: float = 1e-6
) -> list[str]:
    """Differences between two artifact folders that matter for reproduction.

    Compares the detector, model, config hash, training data hashes, threshold
    and every weight (numbers to ``rtol``/``atol``); ignores creation-time
    details such as library versions and metrics. Empty list: reproduced.
    """
    out: list[str] = []
    ca, cb = artifact_info(original), artifact_info(rebuilt)
    for k in ("detector", "model", "config_hash"):
        _diff(ca.get(k), cb.get(k), k, rtol, atol, out)
    _diff(
        dict(TrainedOn.from_cfg(ca).data_hashes),
        dict(TrainedOn.from_cfg(cb).data_hashes),
        "trained_on.data_hashes",
        rtol,
        atol,
        out,
    )
    _diff(ca.get("threshold"), cb.get("threshold"), "threshold", rtol, atol, out)
    wa = read_json_file(Path(original) / "weights.json", ARTIFACT_JSON_LIMIT)
    wb = read_json_file(Path(rebuilt) / "weights.json", ARTIFACT_JSON_LIMIT)
    _diff(wa, wb, "weights", rtol, atol, out)
    return out


def load_fitted(
    cls: Any,
    folder: str | Path,
    model_key: str | None,
    fill: Callable[[Any, Mapping[str, Any], Mapping[str, Any]], None],
    *,
    errors: tuple[type[BaseException], ...] = (),
) -> Any:
    """A fitted detector from its artifact folder, for every detector's ``load``.

    Reads and checks ``cfg.json`` and ``weights.json`` (:func:`read_artifact`), makes
    the detector from its recorded config, lets ``fill(detector, weights, cfg)``
    restore what it learned, then what every artifact records (:func:`restore_fitted`).
    Anything a damaged artifact raises (:data:`MALFORMED`, plus ``errors``) becomes a
    :class:`DataError` naming the folder and the retrain command; ragscope's own
    errors raised by ``fill`` pass through as they are.
    """
    cfg, w = read_artifact(folder, name=cls.name, model_key=model_key)
    retrain = f"retrain it with `ragscope train --detectors {cls.name}`"
    try:
        config = cls.Config.from_untrusted(cfg.get("config"))
    except DataError as e:
        raise DataError(
            f"cfg.json's config: {e}; {retrain}", source=str(Path(folder) / "cfg.json")
        ) from e
    try:
        det = cls(config)
        fill(det, w, cfg)
    except RagscopeError:  # already says what is wrong (e.g. a DataError of fill's)
        raise
    except (*MALFORMED, *errors) as e:
        raise DataError(
            f"malformed {cls.name} artifact ({brief(e)}); {retrain}",
            source=str(folder),
        ) from e
    try:
        restore_fitted(det, cfg)
    except MALFORMED + (DataError,) as e:
        raise DataError(f"malformed cfg.json ({e}); {retrain}", source=str(folder)) from e
    # Before anything predicts: native predictors trust the indices a model holds.
    for label, (model, width) in det.fitted_models().items():
        check_fitted(model, width=width, where=FittedAt(str(folder), label, retrain))
    return det


def fitted_extra(detector: Any, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What every artifact's ``cfg.json`` records beside the weights (threshold, training
    facts), plus ``extra``: the ``extra`` of :func:`write_artifact` in every ``save``."""
    out = {"threshold": detector.threshold_, "train": detector.train_info_}
    cal = getattr(detector, "calibration_", None)
    if cal is not None:
        out["calibration"] = cal.to_json()
    by_dataset = getattr(detector, "dataset_calibration_", None)
    if by_dataset:
        out["calibration_by_dataset"] = {n: c.to_json() for n, c in sorted(by_dataset.items())}
    rule = getattr(detector, "span_rule_", None)
    if rule is not None:
        out["span_rule"] = rule.to_json()
    return {**out, **(extra or {})}


def _threshold(value: object, key: str) -> float:
    """A decision threshold from ``cfg.json``: a finite number in [0, 1], the range of
    the scores it is compared with (outside it a detector flags always or never)."""
    # NaN fails the range too; no float() of a huge int
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise DataError(
            f"'{key}' must be a number in [0, 1] (scores are probabilities), got "
            f"{describe_json(value)}"
        )
    return float(value)


def restore_fitted(detector: Any, cfg: Mapping[str, Any]) -> None:
    """Set what every artifact's ``cfg.json`` records on a loaded detector: the model
    key, the decision threshold, the token threshold (best token F1 on validation, for
    flagging spans; ``None`` when not recorded) and the training facts."""
    if not isinstance(cfg["model"], str):
        raise DataError(f"'model' must be a model key, got {describe_json(cfg['model'])}")
    detector.model_key_ = cfg["model"]
    detector.threshold_ = _threshold(cfg.get("threshold", 0.5), "threshold")
    tok = cfg.get("token_threshold")
    detector.token_threshold_ = _threshold(tok, "token_threshold") if tok is not None else None
    rule = cfg.get("span_rule")
    detector.span_rule_ = SpanRule.from_json(rule) if rule is not None else None
    train = cfg.get("train", {})
    if not isinstance(train, dict):
        raise DataError(f"'train' must be a JSON object, got {describe_json(train)}")
    detector.train_info_ = dict(train)
    cal = cfg.get("calibration")
    detector.calibration_ = PlattCalibrator.from_json(cal) if cal is not None else None
    by_dataset = cfg.get("calibration_by_dataset")
    detector.dataset_calibration_ = (
        read_dataset_calibrations(by_dataset) if by_dataset is not None else {}
    )
    if detector.dataset_calibration_ and detector.calibration_ is None:
        raise DataError("calibration_by_dataset without a pooled calibration")


def read_skops(path: Path, allowed: Iterable[SkopsType], name: str) -> Any:
    """A detector's skops file, holding only the exact types in ``allowed``
    (:func:`core.base.safeio.load_skops`; never a function or method reference).

    Raises:
        DataError: A type outside the allowlist (named, with the file and the retrain
            command), or a malformed file.
        FileNotFoundError: No such file (callers turn it into their own DataError).
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path.name} is missing")
    return load_skops(path, allowed, retrain=f"retrain it with `ragscope train --detectors {name}`")
