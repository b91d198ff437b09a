"""A detector fitted on a few labelled examples in seconds, so pages that read a fitted
detector work before a real one is trained (few examples, a short search: not one to
trust; the app says so)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.detectors import make_detector
from core.engine.model import LoadedModel
from core.learning.contract import Detector
from core.pipeline.extract import FeatureCache, extract_features


@dataclass(frozen=True, kw_only=True, eq=False)
class QuickFit:
    """A detector fitted on a few examples.

    Attributes:
        detector: The fitted detector.
        model: :attr:`~core.engine.model.LoadedModel.instance_key` of the model its features came from.
        dataset_label: The dataset it was fitted on.
        split: The split its examples came from (or the caller's word for "any").
        ids: The training examples.
        n_hallucinated: Hallucinated training examples.
        n_faithful: Faithful training examples.
        seconds: Extraction and fit wall time.
        fit_id: Identifies the fit (cache keys).
    """

    detector: Detector
    model: str
    dataset_label: str
    split: str
    ids: tuple[str, ...]
    n_hallucinated: int
    n_faithful: int
    seconds: float
    fit_id: str


def quick_fit(
    model: LoadedModel,
    examples: Sequence[RAGExample],
    name: str,
    *,
    options: Mapping[str, Any],
    cache: FeatureCache | None,
    dataset_label: str,
    split: str,
    progress: Callable[[int, int], None] | None = None,
) -> QuickFit:
    """Extract detector ``name``'s features of ``examples`` (through ``cache``) and fit it
    with ``options`` on the labelled ones that could be analysed.

    Raises:
        DataError: Fewer than two examples of each class could be analysed.
        StorageError: The feature cache cannot be read.
        ModelError: The model cannot run the detector.
    """
    t0 = time.perf_counter()
    ext = extract_features(
        model, examples, [make_detector(name)], cache=cache, progress=progress, on_error="skip"
    )
    kept = [
        (f, e) for f, e in zip(ext.features[name], ext.examples, strict=True) if e.label is not None
    ]
    n_hal = sum(1 for _, e in kept if e.label)
    n_fai = len(kept) - n_hal
    if min(n_hal, n_fai) < 2:
        raise DataError(
            f"a quick {name} fit needs at least two hallucinated and two faithful answers; "
            f"{dataset_label} gave {n_hal} and {n_fai}. Pick a labelled dataset (the built-in "
            "labelled corpus has both) or read more examples"
        )
    det = make_detector(name, **options)
    det.fit([f for f, _ in kept], [e for _, e in kept])
    ids = tuple(e.id for _, e in kept)
    fit_id = hashlib.sha256(
        json.dumps([model.instance_key, dataset_label, split, ids]).encode("utf-8")
    ).hexdigest()[:16]
    return QuickFit(
        detector=det,
        model=model.instance_key,
        dataset_label=dataset_label,
        split=split,
        ids=ids,
        n_hallucinated=n_hal,
        n_faithful=n_fai,
        seconds=time.perf_counter() - t0,
        fit_id=fit_id,
    )
