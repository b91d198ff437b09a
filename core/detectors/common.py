"""What several detectors read the same way: head and layer feature names, the
per-run PKS matrix shared between ReDeEP and InterpDetect (computed once per run), the
answers whose token labels are known (token-level training sets), and
:class:`FittedDetector`, the one ``save`` / ``load`` of every fitted detector.

Not a detector: detectors import it, never each other (the ensemble goes through the
registry).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.engine.model import LoadedModel
from core.learning.artifact import load_fitted, save_fitted
from core.learning.contract import DetectorBase, Features, Run, check_fit_inputs, require_fitted
from core.learning.labels import response_labels
from core.signals.lens import pks_from_trace

Writers = dict[str, Callable[[Path], None]]
"""An artifact's own files: file name -> a function writing that path."""


def head_name(layer: int, head: int) -> str:
    return f"ECS_L{layer}H{head}"


def layer_name(layer: int) -> str:
    return f"PKS_L{layer}"


def parse_head(name: str) -> tuple[int, int]:
    """``"ECS_L3H7"`` -> ``(3, 7)``."""
    body = name.removeprefix("ECS_L")
    layer, head = body.split("H")
    return int(layer), int(head)


def shared_pks(run: Run, model: LoadedModel, *, final_norm: bool) -> np.ndarray:
    """``[layer, resp]`` PKS of the run, computed once for every detector that asks."""

    def compute() -> np.ndarray:
        assert run.trace is not None
        # float32 divergences: 3x faster, error < 1e-6 bits (see core.signals.lens.jsd_bits).
        return pks_from_trace(model, run.trace, final_norm=final_norm, precision="float32")

    return run.shared(("pks", final_norm), compute)


def known_token_labels(features: Features, example: RAGExample) -> np.ndarray | None:
    """Gold label per token of ``features``, where it is known: gold spans label their
    tokens, a faithful answer without spans is all faithful, and a hallucinated answer
    without spans (which of its tokens are wrong is unknown) gives ``None``."""
    if features.token_offsets is None:
        return None
    lab = features.token_labels(example)
    if lab is None and example.label is False:
        lab = np.zeros(features.token_offsets.shape[0], dtype=np.int8)
    return lab


def token_training_set(
    features: Sequence[Features], examples: Sequence[RAGExample]
) -> tuple[list[int], list[np.ndarray], list[np.ndarray]]:
    """The answers with token features and known token labels (:func:`known_token_labels`):
    their indices, token feature matrices and token labels."""
    idx, xs, ys = [], [], []
    for i, (f, ex) in enumerate(zip(features, examples, strict=True)):
        if f.tokens is None:
            continue
        lab = known_token_labels(f, ex)
        if lab is not None:
            idx.append(i)
            xs.append(f.tokens)
            ys.append(lab)
    return idx, xs, ys


class FittedDetector(DetectorBase, ABC):
    """A detector that learns, and its one persistence: :meth:`save` writes
    :meth:`fitted_state` (the ``weights.json`` object and the files it writes itself)
    through :func:`~core.learning.artifact.save_fitted` once :attr:`fitted_attr` is set;
    :meth:`load` reads an artifact through :func:`~core.learning.artifact.load_fitted`,
    which makes the detector from the recorded config and lets :meth:`restore_state` set
    what it learned (anything :data:`~core.learning.contract.MALFORMED` or
    :meth:`damage_errors` raises there is a damaged artifact), then
    :meth:`after_load` check the whole detector. A subclass declares :attr:`fitted_attr`
    and writes :meth:`fitted_state` and :meth:`restore_state`."""

    #: The attribute that is set once the detector is fitted (what ``save`` requires).
    fitted_attr: ClassVar[str]
    #: What reading a damaged file of this detector raises besides ``MALFORMED``.
    load_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    @abstractmethod
    def fitted_state(self) -> tuple[dict[str, Any], Writers]:
        """What :meth:`save` writes: the ``weights.json`` object and the detector's own
        files (called once fitted)."""

    @abstractmethod
    def restore_state(self, folder: Path, w: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
        """Set what the detector learned from an artifact's weights (``w``) and
        ``cfg.json`` (already verified); raise on anything malformed."""

    def after_load(self, folder: Path, w: Mapping[str, Any]) -> None:
        """Checks that need the whole loaded detector (its threshold and model key
        restored, its models checked); nothing by default."""

    @classmethod
    def damage_errors(cls) -> tuple[type[BaseException], ...]:
        """:attr:`load_errors` (a detector whose library is imported lazily names its
        error type here)."""
        return cls.load_errors

    def save(self, folder: str | Path, *, extra: Mapping[str, Any] | None = None) -> Path:
        require_fitted(self, self.fitted_attr, self.name)
        weights, files = self.fitted_state()
        return save_fitted(self, folder, weights=weights, extra=extra, files=files)

    @classmethod
    def load(cls, folder: str | Path, *, model_key: str | None = None) -> Self:
        path = Path(folder)
        read: list[Mapping[str, Any]] = []

        def fill(det: Any, w: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
            read.append(w)
            det.restore_state(path, w, cfg)

        det: Self = load_fitted(cls, folder, model_key, fill, errors=cls.damage_errors())
        det.after_load(path, read[0])
        return det

    def labelled_inputs(
        self, features: Sequence[Features], examples: Sequence[RAGExample]
    ) -> tuple[str, np.ndarray]:
        """The model key (one model, one set of columns: ``check_fit_inputs``) and the
        answer labels of a fit that needs both classes.

        Raises:
            DataError: The labels are all one class (or the inputs do not match).
        """
        model_key = check_fit_inputs(self.name, features, examples, same_columns=True)
        y = response_labels(examples)
        if len(set(y.tolist())) < 2:
            raise DataError(f"{self.name} needs faithful and hallucinated training answers")
        return model_key, y
