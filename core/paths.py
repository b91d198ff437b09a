"""Where ragscope's files live: the checkout, its asset folders, the user cache.

One owner for every location; each honours its environment override (tests, or
artifacts trained for another model) and none touches the disk.
"""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The ragscope checkout (the folder holding ``core/`` and ``assets/``)."""
    return Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Base directory for ragscope's caches (env ``RAGSCOPE_CACHE_DIR``)."""
    env = os.environ.get("RAGSCOPE_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ragscope"


def assets_dir() -> Path:
    """``assets/`` in the checkout: shipped artifacts, runs, SAEs, corpora, screenshots."""
    return repo_root() / "assets"


def shipped_dir() -> Path:
    """Where shipped artifacts live: ``assets/detectors/<name>/`` in the checkout.

    ``RAGSCOPE_DETECTORS_DIR`` points elsewhere (tests, or artifacts trained
    for another model).
    """
    env = os.environ.get("RAGSCOPE_DETECTORS_DIR")
    return Path(env) if env else assets_dir() / "detectors"


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


def builtin_dir() -> Path:
    """``assets/builtin`` in the checkout."""
    return assets_dir() / "builtin"
