"""Source-grouped splits of labelled examples and their content hashes.

A source (same question and passages, or the dataset's own ``provenance.group``) never
crosses splits; a dataset's own train/validation/test split is kept when it declares one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np

from core.base.errors import DataError
from core.base.examples import RAGExample, example_hash, source_key
from core.data.catalog import resolve_dataset

SPLITS = ("train", "validation", "test")


def split_examples(
    examples: Sequence[RAGExample],
    fractions: tuple[float, float, float] = (0.7, 0.15, 0.15),
    seed: int = 0,
) -> dict[str, list[RAGExample]]:
    """Train / validation / test lists; a source never crosses splits.

    When every example declares ``provenance.split`` (one of train, validation,
    test) that split is kept; otherwise sources are assigned by a seeded hash.
    """
    if abs(sum(fractions) - 1.0) > 1e-6 or min(fractions) < 0:
        raise DataError(f"split fractions must be >= 0 and sum to 1, got {fractions}")
    out: dict[str, list[RAGExample]] = {s: [] for s in SPLITS}
    declared = [e.provenance.split for e in examples]
    if examples and all(s in SPLITS for s in declared) and len(set(declared)) > 1:
        for e in examples:
            out[e.provenance.split].append(e)  # type: ignore[index]  # every split was checked in SPLITS above
        return out
    keys = sorted({source_key(e) for e in examples})
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(keys))
    n = len(keys)
    n_train = round(fractions[0] * n)
    n_val = round(fractions[1] * n)
    assign: dict[str, str] = {}
    for rank, idx in enumerate(order):
        assign[keys[idx]] = (
            "train" if rank < n_train else ("validation" if rank < n_train + n_val else "test")
        )
    for e in examples:
        out[assign[source_key(e)]].append(e)
    return out


def stratified_head(examples: Sequence[RAGExample], n: int) -> list[RAGExample]:
    """A deterministic subset of about ``n`` examples that keeps whole sources together."""
    groups: dict[str, list[RAGExample]] = {}
    for e in examples:
        groups.setdefault(source_key(e), []).append(e)
    out: list[RAGExample] = []
    for key in sorted(groups, key=lambda k: hashlib.sha256(k.encode()).hexdigest()):
        if len(out) >= n:
            break
        out.extend(groups[key])
    return out


def make_splits(
    train_spec: str, test_spec: str | None = None, *, limit: int | None = None, seed: int = 0
) -> tuple[str, str | None, dict[str, list[RAGExample]]]:
    """Resolve dataset specs into train / validation / test splits.

    Args:
        train_spec: The dataset to split (see :func:`core.data.catalog.resolve_dataset`).
        test_spec: Cross-dataset mode: learn on all of ``train_spec``'s train split,
            pick thresholds on its validation split, and test on all of this one.
        limit: Use about this many examples of each dataset (whole sources).
        seed: Split seed (for datasets without their own split).

    Returns:
        ``(train_name, test_name, splits)``; ``test_name`` is ``None`` without
        ``test_spec``.

    Raises:
        DataError: A dataset cannot be resolved or read.
    """

    train_name, train_all = resolve_dataset(train_spec, on_error="skip")
    if limit:
        train_all = stratified_head(train_all, limit)
    splits = split_examples(train_all, seed=seed)
    test_name = None
    if test_spec:
        test_name, test_all = resolve_dataset(test_spec, on_error="skip")
        if limit:
            test_all = stratified_head(test_all, limit)
        splits["test"] = test_all
        if test_name == train_name:
            test_name = f"{test_name} (again)"
    return train_name, test_name, splits


def data_hash(examples: Sequence[RAGExample]) -> str:
    """Content hash of a labelled dataset (text + labels), order-independent."""
    rows = sorted(
        json.dumps([example_hash(e), e.label, [(s.start, s.end, s.type) for s in e.spans]])
        for e in examples
    )
    return hashlib.sha256("\n".join(rows).encode("utf-8")).hexdigest()[:16]
