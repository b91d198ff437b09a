"""Cross-detector agreement over a dataset: where detectors agree, with each other and
with gold, and the answers they disagree on most.

Everything here is pure pandas / numpy on the detectors' verdicts
(:func:`core.review.dataset_verdicts` reads them):

- :func:`verdict_table`: one row per answer, each detector's score and call;
- :func:`score_correlation`: the pairwise (Spearman by default) correlation of scores;
- :func:`gold_matrix`: per answer and detector, whether the call matches gold;
- :func:`pairwise_gold`: per pair of detectors, the share of answers both get right,
  only one gets right, or both get wrong;
- :func:`disagreements`: answers ranked by how split the detectors' calls are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from core.base.examples import RAGExample
from core.learning.contract import Verdict
from core.learning.metrics import correlation_warning, evidence_warning

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, kw_only=True, eq=False)
class VerdictTable:
    """Detectors' verdicts on a dataset, aligned by answer.

    Attributes:
        example_ids: The answers, shape ``[n]``.
        detectors: The detectors, in column order.
        scores: ``[n, d]`` response scores.
        calls: ``[n, d]`` calls (1 = hallucinated at the detector's threshold).
        gold: ``[n]`` gold labels (1 hallucinated, 0 faithful, -1 unlabelled).
        left_out: Detectors asked for but left out, with why: those whose calibration
            carries no signal on any of the answers (a constant score and no call,
            :attr:`core.learning.contract.Verdict.no_signal`: no correlation, no call to
            compare with gold).
    """

    example_ids: tuple[str, ...]
    detectors: tuple[str, ...]
    scores: np.ndarray
    calls: np.ndarray
    gold: np.ndarray
    left_out: Mapping[str, str] = field(default_factory=dict)

    def frame(self) -> pd.DataFrame:
        """One row per answer: ``example``, ``gold`` and each detector's score."""
        import pandas as pd

        df = pd.DataFrame(self.scores, columns=list(self.detectors))
        df.insert(0, "gold", self.gold)
        df.insert(0, "example", list(self.example_ids))
        return df


def verdict_table(
    examples: Sequence[RAGExample],
    verdicts: Mapping[str, Mapping[str, Verdict]],
    detectors: Sequence[str],
) -> VerdictTable:
    """The table of the answers every detector judged (others are left out), without the
    detectors that carry no signal on any of them (:attr:`VerdictTable.left_out`).

    A call is the verdict's ``hallucinated`` (a verdict without signal on some answers
    only calls none there), else, for a detector without a threshold, ``score >= 0.5``.
    """
    rows = [e for e in examples if all(d in verdicts.get(e.id, {}) for d in detectors)]
    left_out = {
        d: next(iter(verdicts[e.id][d].no_signal for e in rows))
        for d in detectors
        if rows and all(verdicts[e.id][d].no_signal is not None for e in rows)
    }
    detectors = [d for d in detectors if d not in left_out]
    scores = np.asarray(
        [[verdicts[e.id][d].score for d in detectors] for e in rows], dtype=np.float64
    ).reshape(len(rows), len(detectors))
    calls = np.asarray(
        [
            [
                int(
                    bool(v.hallucinated)
                    if v.hallucinated is not None or v.no_signal is not None
                    else v.score >= 0.5
                )
                for v in (verdicts[e.id][d] for d in detectors)
            ]
            for e in rows
        ],
        dtype=np.int8,
    ).reshape(len(rows), len(detectors))
    gold = np.asarray([-1 if e.label is None else int(e.label) for e in rows], dtype=np.int8)
    return VerdictTable(
        example_ids=tuple(e.id for e in rows),
        detectors=tuple(detectors),
        scores=scores,
        calls=calls,
        gold=gold,
        left_out={d: str(why) for d, why in left_out.items()},
    )


def agreement_evidence(table: VerdictTable) -> tuple[str | None, str | None]:
    """Why the table's score correlations and its comparisons with gold are not to be
    read as facts, each ``None`` when there is enough (:func:`core.learning.metrics.correlation_warning`
    over its answers, :func:`core.learning.metrics.evidence_warning` over its labelled ones)."""
    gold = table.gold[table.gold >= 0]
    return (
        correlation_warning(len(table.example_ids)),
        evidence_warning(gold, "The labelled answers"),
    )


def score_correlation(table: VerdictTable, method: str = "spearman") -> pd.DataFrame:
    """``[d, d]`` correlation of the detectors' scores (pandas ``DataFrame.corr``)."""
    import pandas as pd

    return pd.DataFrame(table.scores, columns=list(table.detectors)).corr(method=method)


def gold_matrix(table: VerdictTable) -> np.ndarray:
    """``[n, d]``: 1 where the call matches gold, 0 where it does not, -1 without gold."""
    right = (table.calls == table.gold[:, None]).astype(np.int8)
    right[table.gold < 0] = -1
    return right


def pairwise_gold(table: VerdictTable) -> pd.DataFrame:
    """Per ordered pair (A, B) of detectors, over the labelled answers: the shares that
    both get right, only A, only B, and neither (rows sum to 1)."""
    import pandas as pd

    right = gold_matrix(table)
    right = right[table.gold >= 0]
    rows = []
    n = right.shape[0]
    for i, a in enumerate(table.detectors):
        for j, b in enumerate(table.detectors):
            if j <= i:
                continue
            ra, rb = right[:, i] == 1, right[:, j] == 1
            rows.append(
                {
                    "A": a,
                    "B": b,
                    "both right": float((ra & rb).sum() / n) if n else float("nan"),
                    "only A": float((ra & ~rb).sum() / n) if n else float("nan"),
                    "only B": float((~ra & rb).sum() / n) if n else float("nan"),
                    "neither": float((~ra & ~rb).sum() / n) if n else float("nan"),
                    "n": n,
                }
            )
    return pd.DataFrame(rows, columns=["A", "B", "both right", "only A", "only B", "neither", "n"])


def disagreements(table: VerdictTable) -> pd.DataFrame:
    """Answers by how split the calls are, most split first.

    Columns: ``example``, ``gold``, ``flagged by`` (share of detectors calling it
    hallucinated), ``split`` (``min(share, 1 - share)``, 0.5 = an even split),
    ``score spread`` (standard deviation of the scores, the tie-break) and each
    detector's call.
    """
    import pandas as pd

    share = table.calls.mean(axis=1) if table.calls.size else np.zeros(0)
    split = np.round(np.minimum(share, 1.0 - share), 9)  # equal splits tie exactly
    spread = table.scores.std(axis=1) if table.scores.size else np.zeros(0)
    df = pd.DataFrame(
        {
            "example": list(table.example_ids),
            "gold": table.gold,
            "flagged by": share,
            "split": split,
            "score spread": spread,
        }
    )
    for k, d in enumerate(table.detectors):
        df[d] = table.calls[:, k]
    return df.sort_values(["split", "score spread"], ascending=False, kind="stable").reset_index(
        drop=True
    )
