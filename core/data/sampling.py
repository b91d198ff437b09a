"""Which answers to review first: the orderings of a dataset's answer queue.

- ``random``: a fixed random permutation of the dataset's answers (seeded by the
  dataset's name, so every reviewer and every session sees the same order). Any prefix
  of it is a simple random sample of the dataset, so what reviewers decide on it
  estimates the set's calibration and error rates on the whole dataset without bias:
  the sample the adaptation's calibration needs (:data:`ORDERING_PURPOSE`).
- ``uncertainty``: the answers whose probability is nearest the decision threshold
  first (active learning): the reviews that change a refit most, but a biased sample
  (every answer near the threshold), so they never calibrate.
- ``stratified``: the answers split into :data:`STRATA` equal-count bins by score and
  taken round-robin across them (randomly within a bin): each prefix covers the whole
  score range, so a few reviews show how the detector behaves at every score.

Uncertainty and stratified orders need the set's verdict on an answer; answers not
scanned yet follow the scanned ones, in the random order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from core.base.errors import DataError
from core.storage import ORDERINGS, ScannedAnswer

STRATA = 5
"""Score bins of the stratified order."""


ORDERING_PURPOSE: Mapping[str, str] = {
    "random": "an unbiased sample of the dataset: reviews drawn this way calibrate the set "
    "for this dataset and give honest error rates (the adaptation's calibration and "
    "threshold use only these)",
    "uncertainty": "the answers nearest the threshold first: the reviews that teach a refit "
    "most, but a biased sample, so they are used for refitting only, never to calibrate",
    "stratified": "answers spread evenly over the score range: a quick look at how the "
    "set behaves at every score; used for refitting only, never to calibrate",
}
"""What each ordering is for, in words (the Review page shows it)."""


def dataset_seed(dataset: str) -> int:
    """The random order's seed: the same for a dataset in every process and session."""
    return int.from_bytes(hashlib.sha256(dataset.encode("utf-8")).digest()[:8], "big")


def random_order(ids: Sequence[str], dataset: str) -> list[str]:
    """``ids`` in the dataset's fixed random order (:func:`dataset_seed`)."""
    rng = np.random.default_rng(dataset_seed(dataset))
    return [ids[i] for i in rng.permutation(len(ids))]


def order_answers(
    ids: Sequence[str],
    how: str,
    *,
    dataset: str,
    scanned: Mapping[str, ScannedAnswer] | None = None,
) -> list[str]:
    """The dataset's answers (``ids``) in the order ``how`` (:data:`ORDERINGS`).

    Args:
        ids: Every answer of the dataset, by id (duplicates are an error).
        how: ``random``, ``uncertainty`` or ``stratified``.
        dataset: The dataset's name (seeds the random order).
        scanned: The set's verdict on each scanned answer, by id (uncertainty and
            stratified order these; the others follow in the random order).

    Raises:
        DataError: An unknown ordering, or an id given twice.
    """
    if how not in ORDERINGS:
        raise DataError(f"the answer order must be one of {ORDERINGS}, got {how!r}")
    if len(set(ids)) != len(ids):
        raise DataError(f"{dataset!r} has answers with the same id; give each answer its own id")
    base = random_order(ids, dataset)
    if how == "random":
        return base
    known = scanned or {}
    rank = {i: k for k, i in enumerate(base)}  # ties and within-bin order: the random one
    scored = [i for i in base if i in known]
    rest = [i for i in base if i not in known]
    if how == "uncertainty":
        scored.sort(key=lambda i: (known[i].margin, rank[i]))
        return scored + rest
    by_score = sorted(scored, key=lambda i: (known[i].probability, rank[i]))
    bins = [list(b) for b in np.array_split(np.array(by_score, dtype=object), STRATA) if len(b)]
    for b in bins:
        b.sort(key=rank.__getitem__)
    out: list[str] = []
    for k in range(max((len(b) for b in bins), default=0)):
        out.extend(b[k] for b in bins if k < len(b))
    return out + rest


def next_to_scan(
    ids: Sequence[str], *, dataset: str, scanned: Collection[str], n: int
) -> list[str]:
    """The next ``n`` answers to scan: those not scanned yet, in the dataset's random
    order (so the scanned answers are always a random sample of the dataset, which the
    uncertainty and stratified orders then sort)."""
    return [i for i in random_order(ids, dataset) if i not in scanned][: max(n, 0)]


def to_rescan(ids: Sequence[str], *, dataset: str, scanned: Collection[str], n: int) -> list[str]:
    """The first ``n`` answers already scanned, in the dataset's random order (the answers
    :func:`next_to_scan` gave first): the same sample scanned again, e.g. at a lower
    threshold after a scan that flagged nothing."""
    return [i for i in random_order(ids, dataset) if i in scanned][: max(n, 0)]
