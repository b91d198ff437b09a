"""Label-persistence smoothing of token scores (CORTEX, ``specs/cortex.md``).

A hallucinated span runs over several tokens, so a token's label tends to be
its neighbour's. The smoother reads the token scores ``s_1..s_T`` of one answer
as the emissions of a two-state chain over the tokens:

- ``P(z_1)`` uniform, ``P(z_{i+1} = z_i) = p_stay``;
- ``phi_i(1) = s_i``, ``phi_i(0) = 1 - s_i``, with ``s`` clipped to
  ``[1e-4, 1 - 1e-4]``;

and returns the posterior ``P(z_i = 1 | s_1..s_T)`` by the forward-backward
algorithm in log space (stable for answers of any length), vectorised over a
batch of answers of different lengths. ``p_stay = 0.5`` returns the clipped
scores unchanged; ``p_stay -> 1`` spreads a flag over the whole answer.

It reads nothing but scores in [0, 1], so any detector's token scores can be
smoothed (:func:`smooth_tokens`); CORTEX uses ``p_stay = 0.993`` for its token
output and ``0.93`` for its answer score (:func:`answer_score`).

A plainer smoother, :func:`window_mean`, averages each token's logit with its
neighbours' over a centred window (SAPLMA's token probe picks its width on
validation tokens, among :data:`TOKEN_WINDOWS`; :func:`window_probs` does the same to
token probabilities, for CORTEX's and Lookback Lens's ``token_window`` option).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.ndimage import uniform_filter1d

from core.base.errors import DataError

CLIP = 1e-4
P_STAY_TOKEN = 0.993
P_STAY_ANSWER = 0.93
TOKEN_WINDOWS: tuple[int, ...] = (1, 5, 9, 15, 25)
"""Window widths (tokens) a token scorer may choose among on validation; 1 is no
smoothing."""
MAX_WINDOW = 255


def check_window(width: object, option: str | None = None) -> int:
    """``width`` as a window width: an odd int in ``[1, MAX_WINDOW]`` (files are hostile:
    anything else raises a DataError, naming the config ``option`` when given)."""
    if type(width) is not int or not 1 <= width <= MAX_WINDOW or width % 2 == 0:
        raise DataError(
            f"a token window must be an odd int in [1, {MAX_WINDOW}], got {width!r}",
            field=option,
        )
    return width


def window_mean(values: np.ndarray, width: int) -> np.ndarray:
    """One answer's token values ``[T]`` (logits, say) each averaged with its neighbours':
    the centred mean over ``width`` tokens, the edge values repeated past the answer's
    ends; ``width == 1`` returns them unchanged (as float64)."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    w = check_window(width)
    if w == 1 or v.size == 0:
        return v
    return uniform_filter1d(v, size=w, mode="nearest")


def window_peak(values: np.ndarray, width: int) -> float:
    """The highest of one answer's token values (logits) averaged over centred windows
    of ``width`` (:func:`window_mean`): where its most suspect stretch sits."""
    return float(window_mean(values, width).max())


def window_probs(probs: np.ndarray, width: int) -> np.ndarray:
    """Token probabilities ``[T]`` averaged with their neighbours' in logit space (each
    clipped to ``[CLIP, 1 - CLIP]``; :func:`window_mean`), back as float32
    probabilities; ``width == 1`` returns them unchanged."""
    p = np.asarray(probs, dtype=np.float32).reshape(-1)
    if check_window(width) == 1 or p.size == 0:
        return p
    q = np.clip(p.astype(np.float64), CLIP, 1.0 - CLIP)
    z = window_mean(np.log(q / (1.0 - q)), width)
    return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)


def _check_p(p_stay: float) -> float:
    p = float(p_stay)
    if not 0.0 <= p <= 1.0 or np.isnan(p):
        raise DataError(
            f"p_stay must be in [0, 1], got {p_stay!r} ({P_STAY_TOKEN} is CORTEX's default)"
        )
    return p


def forward_backward(
    scores: np.ndarray, lengths: np.ndarray | Sequence[int], p_stay: float
) -> np.ndarray:
    """Posterior ``P(z_i = 1 | s)`` for a padded batch of answers.

    Args:
        scores: ``[batch, T]`` token scores in [0, 1]; entries at ``i >= lengths[b]``
            are ignored (padding).
        lengths: ``[batch]`` number of real tokens of each answer.
        p_stay: Probability that the next token keeps this token's label.

    Returns:
        ``[batch, T]`` float64 posteriors (padding positions are NaN).

    Raises:
        DataError: ``p_stay`` outside [0, 1], scores outside [0, 1] or NaN, or
            lengths that do not fit the batch.
    """
    p = _check_p(p_stay)
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2:
        raise DataError(f"scores must be [batch, T], got shape {s.shape}")
    n = np.asarray(lengths, dtype=np.int64).reshape(-1)
    b, t_max = s.shape
    if n.shape[0] != b or (n < 0).any() or (n > t_max).any():
        raise DataError(f"lengths {n.tolist()} do not fit scores of shape {s.shape}")
    valid = np.arange(t_max)[None, :] < n[:, None]
    real = s[valid]
    if real.size and (np.isnan(real).any() or real.min() < 0.0 or real.max() > 1.0):
        raise DataError("token scores must be probabilities in [0, 1] without NaN")
    c = np.clip(np.where(valid, s, 0.5), CLIP, 1.0 - CLIP)
    # Emissions [b, T, 2] (state 0 = faithful, 1 = hallucinated); padding emits
    # log 1 for both states, which leaves the real positions' posteriors exact.
    log_e = np.stack([np.log1p(-c), np.log(c)], axis=-1)
    log_e[~valid] = 0.0
    with np.errstate(divide="ignore"):
        log_a = np.log(np.array([[p, 1.0 - p], [1.0 - p, p]]))  # [from, to]
    fwd = np.empty((b, t_max, 2))
    bwd = np.zeros((b, t_max, 2))
    if t_max == 0:
        return np.empty((b, 0))
    fwd[:, 0] = np.log(0.5) + log_e[:, 0]
    for i in range(1, t_max):
        fwd[:, i] = log_e[:, i] + np.logaddexp.reduce(fwd[:, i - 1, :, None] + log_a, axis=1)
    for i in range(t_max - 2, -1, -1):
        nxt = log_e[:, i + 1] + bwd[:, i + 1]  # [b, 2] over the next state
        bwd[:, i] = np.logaddexp.reduce(log_a[None] + nxt[:, None, :], axis=2)
    log_post = fwd + bwd
    post = np.exp(log_post[..., 1] - np.logaddexp(log_post[..., 0], log_post[..., 1]))
    post[~valid] = np.nan
    return post


def smooth_tokens(
    scores: np.ndarray | Sequence[np.ndarray] | Sequence[float], p_stay: float = P_STAY_TOKEN
) -> np.ndarray | list[np.ndarray]:
    """Smoothed token scores of one answer (a 1-D array) or of several (a list of arrays).

    Args:
        scores: One answer's token scores ``[T]``, or a list of such arrays.
        p_stay: See :func:`forward_backward`.

    Returns:
        Float32 posteriors with the input's shape(s).
    """
    single = isinstance(scores, np.ndarray) and scores.ndim == 1
    if not single and len(scores) and np.ndim(scores[0]) == 0:
        single = True  # a plain list of floats
    seqs = (
        [np.asarray(scores, dtype=np.float64)]
        if single
        else [np.asarray(x, dtype=np.float64).reshape(-1) for x in scores]
    )
    if not seqs:
        return []
    lengths = np.asarray([x.shape[0] for x in seqs])
    batch = np.full((len(seqs), int(lengths.max(initial=0))), 0.5)
    for k, x in enumerate(seqs):
        batch[k, : x.shape[0]] = x
    post = forward_backward(batch, lengths, p_stay)
    out = [post[k, : lengths[k]].astype(np.float32) for k in range(len(seqs))]
    return out[0] if single else out


def answer_score(
    token_scores: np.ndarray | Sequence[float], p_stay: float = P_STAY_ANSWER
) -> float:
    """CORTEX's answer-level score: the highest token score after smoothing with ``p_stay``."""
    s = np.asarray(token_scores, dtype=np.float64).reshape(-1)
    if s.size == 0:
        return 0.0
    return float(np.max(smooth_tokens(s, p_stay)))


def token_flags(token_scores: Sequence[float] | np.ndarray, threshold: float) -> np.ndarray:
    """Which tokens are flagged: those scoring at or above ``threshold`` (a NaN score never
    is). Every flag drawn from token scores (spans, counts, the pages' marks) comes from here."""
    s = np.asarray(token_scores, dtype=np.float64).reshape(-1)
    with np.errstate(invalid="ignore"):
        return s >= threshold


def flagged_spans(
    token_scores: np.ndarray, offsets: np.ndarray, threshold: float
) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the maximal runs of tokens scoring ``>= threshold``
    (:func:`token_flags`)."""
    flag = token_flags(token_scores, threshold)
    out: list[tuple[int, int]] = []
    j = 0
    while j < flag.shape[0]:
        if not flag[j]:
            j += 1
            continue
        k = j
        while k + 1 < flag.shape[0] and flag[k + 1]:
            k += 1
        out.append((int(offsets[j, 0]), int(offsets[k, 1])))
        j = k + 1
    return out


def span_overlap_f1(
    predicted: Sequence[tuple[int, int]], gold: Sequence[tuple[int, int]]
) -> dict[str, float | int | None]:
    """Span-level precision / recall / F1 by overlap.

    A predicted span counts as correct when it overlaps some gold span, a gold
    span as found when some predicted span overlaps it. With neither kind of
    span the answer is trivially right (F1 1.0); with only one kind, F1 is 0.
    """

    def hits(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> int:
        return sum(any(x0 < y1 and y0 < x1 for y0, y1 in b) for x0, x1 in a)

    n_p, n_g = len(predicted), len(gold)
    if n_p == 0 and n_g == 0:
        return {"precision": 1.0, "recall": 1.0, "f1": 1.0, "n_predicted": 0, "n_gold": 0}
    p = hits(predicted, gold) / n_p if n_p else 0.0
    r = hits(gold, predicted) / n_g if n_g else 0.0
    f1 = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return {"precision": p, "recall": r, "f1": f1, "n_predicted": n_p, "n_gold": n_g}
