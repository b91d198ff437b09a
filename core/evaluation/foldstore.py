"""Fold checkpoints: a long cross-validation resumes where it stopped.

Refitting a stacked ensemble on 2,600 answers takes close to an hour per fold on a
2-core CPU, longer than a working session may last. :func:`core.evaluation.crossval.cross_validate`
therefore saves each (detector, fold) once it is scored: the test answers' calibrated
and raw scores, flags, the dataset-calibrated ones, the fold's threshold and the token
scores, as one ``.npz`` of plain arrays (read back with ``allow_pickle`` off), named by
a hash of everything the fold's result depends on (:func:`fold_key`: the detector's
config, the data and its order, the folds, the procedure's options, the model and the
code of ``core/``). Rerunning the same command reads the folds already done instead of
refitting them; any change to what a fold depends on gives another name, so a stale
fold is never read. A file that is damaged, foreign or inconsistent is ignored (and
the fold refitted), never trusted. The checkpoints of a command that was stopped and
never rerun are pruned after :data:`STALE_DAYS` (:func:`prune_stale`; any code change
makes them unreadable anyway).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from core.base.errors import DataError
from core.base.paths import cache_dir, repo_root
from core.base.safeio import MiB, check_zip, parse_json, read_bounded, replace_file
from core.learning.contract import MALFORMED, Verdict

FOLD_FORMAT = 1
FOLD_FILE_LIMIT = 256 * MiB
"""Largest fold file read back (a fold of 2,600 answers with token scores is ~1 MiB)."""
_ARRAYS = frozenset(
    {
        "meta",
        "test",
        "scores",
        "raw",
        "flagged",
        "own_scores",
        "own_flagged",
        "token_lengths",
        "token_scores",
        "token_offsets",
    }
)


STALE_DAYS = 14
"""A command's checkpoint folder untouched this long is dropped (:func:`prune_stale`)."""


def folds_dir() -> Path:
    """Where fold checkpoints go by default (under the cache folder)."""
    return cache_dir() / "cv-folds"


@cache
def code_hash() -> str:
    """Hash of the source of ``core/`` (any code change makes older folds stale)."""
    h = hashlib.sha256()
    root = repo_root() / "core"
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def fold_key(parts: Mapping[str, Any]) -> str:
    """The checkpoint name of one fold: a hash of ``parts`` (JSON-able), the code and
    the format."""
    blob = json.dumps(
        {**parts, "code": code_hash(), "format": FOLD_FORMAT}, sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class FoldResult:
    """One detector's scores of one fold's test answers (aligned with ``test``).

    Attributes:
        test: Indices of the test answers in the cross-validation's example list.
        scores, raw, flagged: Calibrated score, raw score and flag of each.
        own_scores, own_flagged: The same under the answer's dataset's own calibration.
        threshold: The fold's answer threshold.
        config_hash: The fitted detector's config hash.
        token_scores, token_offsets: Per answer, its token scores and offsets (or
            ``None``).
        token_threshold: The fold's token threshold (its detector's
            ``token_threshold_``: what it flags spans at), or ``None``.
    """

    test: np.ndarray
    scores: np.ndarray
    raw: np.ndarray
    flagged: np.ndarray
    own_scores: np.ndarray
    own_flagged: np.ndarray
    threshold: float
    config_hash: str
    token_scores: tuple[np.ndarray | None, ...]
    token_offsets: tuple[np.ndarray | None, ...]
    token_threshold: float | None = None

    def verdict(self, j: int, detector: str, example_id: str) -> Verdict:
        """The ``j``-th test answer's verdict, as far as the pooled metrics read it."""
        return Verdict(
            detector=detector,
            example_id=example_id,
            score=float(self.scores[j]),
            hallucinated=bool(self.flagged[j]),
            token_scores=self.token_scores[j],
            token_offsets=self.token_offsets[j],
            raw_score=float(self.raw[j]),
        )


def fold_result(
    test: np.ndarray,
    verdicts: Sequence[Verdict],
    own: Sequence[Verdict],
    threshold: float,
    config_hash: str,
    token_threshold: float | None = None,
) -> FoldResult:
    """A fold's result from its test answers' verdicts (``own``: dataset-calibrated)."""
    return FoldResult(
        test=np.asarray(test, dtype=np.int64),
        scores=np.asarray([v.score for v in verdicts], dtype=np.float64),
        raw=np.asarray(
            [v.raw_score if v.raw_score is not None else v.score for v in verdicts],
            dtype=np.float64,
        ),
        flagged=np.asarray([bool(v.hallucinated) for v in verdicts], dtype=bool),
        own_scores=np.asarray([v.score for v in own], dtype=np.float64),
        own_flagged=np.asarray([bool(v.hallucinated) for v in own], dtype=bool),
        threshold=float(threshold),
        config_hash=config_hash,
        token_scores=tuple(
            None if v.token_scores is None or v.token_offsets is None else v.token_scores
            for v in verdicts
        ),
        token_offsets=tuple(
            None if v.token_scores is None or v.token_offsets is None else v.token_offsets
            for v in verdicts
        ),
        token_threshold=None if token_threshold is None else float(token_threshold),
    )


def save_fold(folder: str | Path, key: str, r: FoldResult) -> Path:
    """Write ``r`` as ``folder/key.npz`` (atomically: a killed write leaves no file)."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    # fold_result keeps token scores and offsets together: both or neither.
    lengths = np.asarray([-1 if t is None else len(t) for t in r.token_scores], dtype=np.int64)
    tok = [np.asarray(t, dtype=np.float32).reshape(-1) for t in r.token_scores if t is not None]
    off = [np.asarray(o, dtype=np.int64).reshape(-1, 2) for o in r.token_offsets if o is not None]
    meta = {
        "format": FOLD_FORMAT,
        "threshold": r.threshold,
        "config_hash": r.config_hash,
        "token_threshold": r.token_threshold,
    }
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
        test=r.test.astype(np.int64),
        scores=r.scores,
        raw=r.raw,
        flagged=r.flagged,
        own_scores=r.own_scores,
        own_flagged=r.own_flagged,
        token_lengths=lengths,
        token_scores=np.concatenate(tok) if tok else np.zeros(0, np.float32),
        token_offsets=np.concatenate(off) if off else np.zeros((0, 2), np.int64),
    )
    path = d / f"{key}.npz"
    return replace_file(path, buf.getvalue())


def load_fold(folder: str | Path, key: str, test: np.ndarray) -> FoldResult | None:
    """The fold saved as ``folder/key.npz`` for these test answers, or ``None`` when
    there is none or it cannot be trusted (damaged, foreign, another test set)."""
    path = Path(folder) / f"{key}.npz"
    if not path.exists():
        return None
    try:
        return _read(read_bounded(path, FOLD_FILE_LIMIT, what="fold checkpoint"), test)
    except MALFORMED + (DataError, zipfile.BadZipFile, EOFError, OSError):
        return None


def _read(blob: bytes, test: np.ndarray) -> FoldResult:
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        check_zip(zf, source="fold checkpoint", max_members=len(_ARRAYS))
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        if set(z.files) != _ARRAYS:
            raise DataError("a fold checkpoint holds other arrays than expected")
        a = {k: z[k] for k in z.files}
    meta = parse_json(a["meta"].tobytes(), source="fold checkpoint")
    if not isinstance(meta, dict) or meta.get("format") != FOLD_FORMAT:
        raise DataError("a fold checkpoint of another format")
    threshold, config_hash = meta.get("threshold"), meta.get("config_hash")
    token_threshold = meta.get("token_threshold")
    if (
        type(threshold) is not float
        or type(config_hash) is not str
        or (token_threshold is not None and type(token_threshold) is not float)
    ):
        raise DataError("a fold checkpoint's header is malformed")
    n = len(test)
    want = np.asarray(test, dtype=np.int64)
    if a["test"].dtype != np.int64 or not np.array_equal(a["test"], want):
        raise DataError("a fold checkpoint of other test answers")
    for k in ("scores", "raw", "own_scores"):
        v = a[k]
        if v.dtype != np.float64 or v.shape != (n,) or not np.all(np.isfinite(v)):
            raise DataError(f"a fold checkpoint's {k} are malformed")
        if k != "raw" and not np.all((v >= 0) & (v <= 1)):
            raise DataError(f"a fold checkpoint's {k} are outside [0, 1]")
    for k in ("flagged", "own_flagged"):
        if a[k].dtype != np.bool_ or a[k].shape != (n,):
            raise DataError(f"a fold checkpoint's {k} are malformed")
    lengths, tok, off = a["token_lengths"], a["token_scores"], a["token_offsets"]
    if lengths.dtype != np.int64 or lengths.shape != (n,) or np.any(lengths < -1):
        raise DataError("a fold checkpoint's token lengths are malformed")
    total = int(lengths[lengths > 0].sum())
    if (
        tok.dtype != np.float32
        or tok.shape != (total,)
        or off.dtype != np.int64
        or off.shape != (total, 2)
        or not np.all(np.isfinite(tok))
    ):
        raise DataError("a fold checkpoint's token scores are malformed")
    scores: list[np.ndarray | None] = []
    offsets: list[np.ndarray | None] = []
    at = 0
    for m in lengths.tolist():
        if m < 0:
            scores.append(None)
            offsets.append(None)
            continue
        scores.append(tok[at : at + m])
        offsets.append(off[at : at + m])
        at += m
    return FoldResult(
        test=want,
        scores=a["scores"],
        raw=a["raw"],
        flagged=a["flagged"],
        own_scores=a["own_scores"],
        own_flagged=a["own_flagged"],
        threshold=threshold,
        config_hash=config_hash,
        token_scores=tuple(scores),
        token_offsets=tuple(offsets),
        token_threshold=token_threshold,
    )


def clear_folds(folder: str | Path, keys: Sequence[str]) -> None:
    """Remove these folds' checkpoints (once the run they belong to is saved)."""
    for k in keys:
        (Path(folder) / f"{k}.npz").unlink(missing_ok=True)


def prune_stale(root: str | Path | None = None, days: float = STALE_DAYS) -> list[Path]:
    """Remove the checkpoint folders under ``root`` (default :func:`folds_dir`) whose
    files were all last written more than ``days`` ago: those of commands stopped and
    never rerun. Returns the folders removed; a folder that cannot be read is left."""
    base = Path(root) if root is not None else folds_dir()
    if not base.is_dir():
        return []
    cutoff = time.time() - days * 86400
    gone = []
    for d in sorted(base.iterdir()):
        if not d.is_dir() or d.is_symlink():
            continue
        try:
            newest = max([d.stat().st_mtime, *(f.stat().st_mtime for f in d.iterdir())])
        except OSError:
            continue
        if newest < cutoff:
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    return gone
