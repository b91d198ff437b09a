"""Import sae-lens next to TransformerLens 4.

sae-lens (6.54) still imports three TransformerLens 3 modules that TransformerLens
4 removed (upstream: decoderesearch/SAELens issue #738), so ``import sae_lens``
fails at its top level although the parts ragscope uses (SAE classes, the
trainer, save/load) never touch them. :func:`import_sae_lens` registers small
stand-ins for exactly those names before importing it, and only when the real
module is missing, so a fixed sae-lens or an older TransformerLens is used as is:

- ``transformer_lens.HookedTransformer``: ``HookedRootModule`` (TransformerLens 4
  keeps the class at the package top level), ``Loss`` / ``Output`` (type aliases),
  and ``HookedTransformer`` (a class that refuses to be built: ragscope drives
  TransformerBridge, never a HookedTransformer);
- ``transformer_lens.components.mlps.can_be_used_as_mlp.CanBeUsedAsMLP`` (only used
  by sae-lens's HookedSAETransformer, which ragscope does not use);
- ``transformer_lens.utils``: the three helpers sae-lens imports, from their new
  homes in ``transformer_lens.utilities``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

_SHIMMED: list[str] = []
_IMPORT_LOCK = threading.Lock()
"""Held for the whole first import: ``sae_lens`` enters ``sys.modules`` long before
its ``__init__`` registers the SAE architectures, so a second thread must wait for
the import to finish, not take the half-built module (``KeyError: 'topk'``)."""


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name, f"ragscope stand-in for {name} (see core.engine.sae_compat)")
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    _SHIMMED.append(name)
    return mod


class _NoHookedTransformer:
    """Stand-in for TransformerLens 3's HookedTransformer (removed in TransformerLens 4)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ImportError(
            "HookedTransformer is not available under TransformerLens 4; ragscope loads "
            "models as TransformerBridge (core.engine.model.load_model)"
        )

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        cls()


class _NoCanBeUsedAsMLP:
    """Stand-in for a TransformerLens 3 base class only HookedSAETransformer uses."""


def _missing(name: str) -> bool:
    if name in sys.modules:
        return False
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:
        return True


def install_shims() -> list[str]:
    """Register the stand-ins that are missing; returns the module names added."""
    import transformer_lens

    added_before = len(_SHIMMED)
    if _missing("transformer_lens.HookedTransformer"):
        _module(
            "transformer_lens.HookedTransformer",
            HookedRootModule=transformer_lens.HookedRootModule,
            HookedTransformer=_NoHookedTransformer,
            Loss=Any,
            Output=Any,
        )
        # `from transformer_lens import HookedTransformer` must find a name, not the
        # package's module __getattr__ (which raises ImportError in TransformerLens 4).
        vars(transformer_lens).setdefault("HookedTransformer", _NoHookedTransformer)
    if _missing("transformer_lens.components"):
        _module("transformer_lens.components")
        _module("transformer_lens.components.mlps")
        _module(
            "transformer_lens.components.mlps.can_be_used_as_mlp",
            CanBeUsedAsMLP=_NoCanBeUsedAsMLP,
        )
    if _missing("transformer_lens.utils"):
        from transformer_lens.utilities.defaults_utils import USE_DEFAULT_VALUE
        from transformer_lens.utilities.lm_utils import lm_cross_entropy_loss
        from transformer_lens.utilities.tokenize_utils import get_tokens_with_bos_removed

        _module(
            "transformer_lens.utils",
            USE_DEFAULT_VALUE=USE_DEFAULT_VALUE,
            get_tokens_with_bos_removed=get_tokens_with_bos_removed,
            lm_cross_entropy_loss=lm_cross_entropy_loss,
        )
    return _SHIMMED[added_before:]


def import_sae_lens() -> types.ModuleType:
    """``sae_lens``, imported with the stand-ins it needs under TransformerLens 4.

    Thread-safe: a thread that asks while another is importing waits for the whole
    module (the app judges answers and loads SAEs from several threads at once).
    """
    with _IMPORT_LOCK:
        install_shims()
        return importlib.import_module("sae_lens")
