"""Where ragscope's files live: the checkout, its asset folders, the user cache.

One owner for every location; each honours its environment override (tests, or
artifacts trained for another model) and none touches the disk.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from core.base.errors import DataError


def repo_root() -> Path:
    """The ragscope checkout (the folder holding ``core/`` and ``assets/``)."""
    return Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """Base directory for ragscope's caches (env ``RAGSCOPE_CACHE_DIR``)."""
    env = os.environ.get("RAGSCOPE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ragscope"


def assets_dir() -> Path:
    """``assets/`` in the checkout: shipped artifacts, runs, SAEs, corpora, screenshots."""
    return repo_root() / "assets"


DEFAULT_SET = "default"
"""The detector set loaded unless ``RAGSCOPE_DETECTOR_SET`` names another."""
CUSTOM_SET = "custom"
"""What :func:`detector_set_name` says when ``RAGSCOPE_DETECTORS_DIR`` points at a folder."""
_SET_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


def detector_sets_dir() -> Path:
    """``assets/detector-sets/``: the named alternatives to the default set."""
    return assets_dir() / "detector-sets"


def is_set_name(name: str) -> bool:
    """Whether ``name`` is spelled as a shipped set's name (lower-case letters, digits,
    ``_`` and ``-``; at most 64)."""
    return bool(_SET_NAME.fullmatch(name))


def detector_set_names() -> tuple[str, ...]:
    """The shipped detector sets: ``default`` (``assets/detectors``), then every folder
    of :func:`detector_sets_dir` whose name is a valid set name, sorted."""
    root = detector_sets_dir()
    named = (
        sorted(p.name for p in root.iterdir() if p.is_dir() and _SET_NAME.fullmatch(p.name))
        if root.is_dir()
        else []
    )
    return (DEFAULT_SET, *(n for n in named if n != DEFAULT_SET))


def detector_set_dir(name: str) -> Path:
    """The folder of the shipped detector set ``name``.

    Raises:
        DataError: ``name`` is not a set name or no such set is shipped (the
            message lists the sets there are).
    """
    if name == DEFAULT_SET:
        return assets_dir() / "detectors"
    if not _SET_NAME.fullmatch(name) or not (detector_sets_dir() / name).is_dir():
        raise DataError(
            f"no detector set {name!r}; the shipped sets are "
            f"{', '.join(detector_set_names())} (set RAGSCOPE_DETECTOR_SET to one of them, "
            "or RAGSCOPE_DETECTORS_DIR to a folder of artifacts)"
        )
    return detector_sets_dir() / name


def detector_set_name() -> str:
    """The detector set :func:`shipped_dir` resolves to: ``custom`` when
    ``RAGSCOPE_DETECTORS_DIR`` is set, else ``RAGSCOPE_DETECTOR_SET`` or ``default``."""
    if os.environ.get("RAGSCOPE_DETECTORS_DIR"):
        return CUSTOM_SET
    return os.environ.get("RAGSCOPE_DETECTOR_SET") or DEFAULT_SET


def shipped_dir() -> Path:
    """Where the loaded detector artifacts live: ``assets/detectors/<name>/`` in the
    checkout (the ``default`` set, trained on real labelled RAG answers).

    ``RAGSCOPE_DETECTORS_DIR`` points at any folder of artifacts (tests, or artifacts
    trained for another model); else ``RAGSCOPE_DETECTOR_SET`` picks a shipped set by
    name (:func:`detector_set_names`, e.g. ``builtin``).

    Raises:
        DataError: ``RAGSCOPE_DETECTOR_SET`` names no shipped set.
    """
    env = os.environ.get("RAGSCOPE_DETECTORS_DIR")
    if env:
        return Path(env)
    return detector_set_dir(os.environ.get("RAGSCOPE_DETECTOR_SET") or DEFAULT_SET)


def shipped_sae_dir(model_name: str = "smollm2-135m-instruct") -> Path:
    """Where the shipped SAE for a model lives (``RAGSCOPE_SAE_DIR`` overrides)."""
    env = os.environ.get("RAGSCOPE_SAE_DIR")
    if env:
        return Path(env).expanduser()
    return assets_dir() / "sae" / model_name


def runs_dir() -> Path:
    """Evaluation runs saved by ``ragscope evaluate`` (in the user cache)."""
    return cache_dir() / "runs"


def shipped_runs_dir() -> Path:
    """Evaluation runs shipped with ragscope (``assets/runs``): the shipped artifacts' numbers.

    ``RAGSCOPE_SHIPPED_RUNS_DIR`` points elsewhere (tests).
    """
    env = os.environ.get("RAGSCOPE_SHIPPED_RUNS_DIR")
    return Path(env) if env else assets_dir() / "runs"


TRAINED_SET = "trained"
"""The detector set's name when the loaded detectors were trained on this machine for a
model no shipped set covers (:func:`model_detectors_dir`)."""


def trained_detectors_dir() -> Path:
    """Detectors trained on this machine for models that ship none, one folder per model
    (:func:`model_detectors_dir`): ``RAGSCOPE_TRAINED_DIR``, else
    ``<cache dir>/detectors``."""
    env = os.environ.get("RAGSCOPE_TRAINED_DIR")
    return Path(env).expanduser() if env else cache_dir() / "detectors"


def model_slug(model_key: str) -> str:
    """A folder name for a model key: its display name in lower-case letters, digits and
    dashes (at most 48), then 12 hex digits of the key's SHA-256 (keys differ in their
    sizes and dtype, which the name leaves out)."""
    name = re.sub(r"[^a-z0-9]+", "-", model_key.split("|", 1)[0].lower()).strip("-")[:48]
    digest = hashlib.sha256(model_key.encode("utf-8")).hexdigest()[:12]
    return f"{name.strip('-') or 'model'}-{digest}"


def model_detectors_dir(model_key: str) -> Path:
    """Where detectors trained here for the model ``model_key`` live (one subfolder per
    detector, like a shipped set): ``<trained dir>/<model slug>``."""
    return trained_detectors_dir() / model_slug(model_key)


def adapted_sets_dir(model_key: str) -> Path:
    """Where sets adapted here to a dataset from its reviews live for the model
    ``model_key`` (one folder per derived set): ``<trained dir>/adapted/<model slug>``
    (no model slug is ``adapted``: each ends in 12 hex digits)."""
    return trained_detectors_dir() / "adapted" / model_slug(model_key)


def builtin_dir() -> Path:
    """``assets/builtin`` in the checkout."""
    return assets_dir() / "builtin"
