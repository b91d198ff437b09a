"""Audit reports: one answer, or a dataset summary, as one self-contained HTML file.

Nothing in a report is fetched when it is opened: styles are inline and the first
plotly figure carries plotly.js itself (the later ones reuse it), so the file opens
offline in any browser and can be archived with a review.

- :func:`answer_report_html`: the example (question, passages, answer with gold and
  accepted spans), every detector's verdict, and per detector its explanation view:
  the token heatmap of its token scores, the largest contributions to its score, the
  SHAP waterfall (SPAD), the top SAE features with their cached LLM explanations
  (RAGLens) and the mean ECS of each candidate head on the answer (ReDeEP,
  InterpDetect); then the reviewers' decisions on the answer's flagged spans.
- :func:`dataset_report_html`: the detectors' scores on a dataset (AUROC where
  labelled), their correlation, where each call matches gold, how each pair does
  together, and the review queue's state with the reviewers' agreement.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from app.components.agreement_charts import correlation_figure, gold_matrix_figure
from app.components.gam_charts import contributions_figure
from app.components.head_charts import mean_ecs_figure
from app.components.heatmap import token_heatmap_html
from app.components.highlight import Mark, marked_html
from app.components.set_spans import span_background, span_rows
from app.components.shap_charts import waterfall_figure
from core.analysis.detector_agreement import pairwise_gold, score_correlation
from core.analysis.shap_values import shap_values
from core.detectors.common import parse_head
from core.detectors.raglens import INTERCEPT
from core.learning.contract import flag_threshold
from core.learning.labels import span_labels as gold_labels
from core.pipeline.judge import AnswerVerdict
from core.review import agreement

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from core.analysis.detector_agreement import VerdictTable
    from core.base.examples import RAGExample
    from core.learning.contract import Features, Verdict
    from core.review import ReviewItem

GOLD_MARK = "#f7c6c6"
ACCEPTED_MARK = "#ffd6a5"
TOKEN_CMAP = ((0.0, "#ffffff"), (0.5, "#f4b183"), (1.0, "#c0392b"))
STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;
margin:24px auto;padding:0 16px;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:0}h2{margin-top:1.6em;border-bottom:1px solid #ddd}
.meta{color:#666;font-size:.9em}.box{border:1px solid #e3e3e3;border-radius:8px;
padding:10px 14px;margin:8px 0}table.rs{border-collapse:collapse;font-size:.92em}
table.rs td,table.rs th{border:1px solid #ddd;padding:4px 8px;text-align:left}
table.rs th{background:#f5f5f5}.flag{color:#b03a2e;font-weight:600}.ok{color:#2e7d32}
"""


class _Figures:
    """Plotly figures as HTML divs; the first carries plotly.js, the rest reuse it."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, fig: go.Figure) -> str:
        self.n += 1
        return fig.to_html(
            full_html=False,
            include_plotlyjs=self.n == 1,
            config={"displaylogo": False, "responsive": True},
        )


def _esc(x: object) -> str:
    return html.escape(str(x))


def _table(rows: Sequence[Mapping[str, object]], cls: str = "rs") -> str:
    if not rows:
        return "<p class='meta'>None.</p>"
    cols = list(rows[0])
    head = "".join(f"<th>{_esc(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{_esc(r.get(c, ''))}</td>" for c in cols) + "</tr>" for r in rows
    )
    return f"<table class='{cls}'><tr>{head}</tr>{body}</table>"


def _page(title: str, body: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{_esc(title)}</h1><p class='meta'>ragscope audit report · {stamp}</p>"
        f"{body}</body></html>"
    )


def _threshold(detector: object, verdict: Verdict) -> float | None:
    """The threshold ``verdict`` was flagged at (its own calibration's), else the
    detector's pooled one; ``None`` when it has none."""
    if verdict.threshold is not None:
        return verdict.threshold
    return getattr(detector, "threshold_", None)


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else format(v, spec)


def head_ecs_figure(features: Features, *, title: str) -> go.Figure | None:
    """Mean ECS of each candidate head over the answer's tokens, on a layer x head grid
    (``None`` when the features hold no per-token ECS columns)."""

    if features.tokens is None or not features.tokens.size:
        return None
    cols = [(i, parse_head(n)) for i, n in enumerate(features.token_names) if n.startswith("ECS_L")]
    if not cols:
        return None
    n_layers = 1 + max(ly for _, (ly, _) in cols)
    n_heads = 1 + max(h for _, (_, h) in cols)
    grid = np.full((n_layers, n_heads), np.nan)
    for i, (ly, h) in cols:
        grid[ly, h] = float(np.nanmean(features.tokens[:, i]))
    return mean_ecs_figure(grid, title=title)


def _detector_section(
    name: str,
    verdict: Verdict,
    detector: Any,
    features: Features | None,
    example: RAGExample,
    figures: _Figures,
    explanations: Mapping[str, str],
) -> str:

    parts = [f"<h3 id='det-{_esc(name)}'>{_esc(name)}</h3>"]
    why = f" ({_esc(verdict.no_signal)})" if verdict.no_signal else ""
    parts.append(
        f"<p>score <b>{verdict.score:.3f}</b> · threshold {_fmt(_threshold(detector, verdict))}"
        f" · <span class='{'flag' if verdict.hallucinated else 'ok'}'>"
        f"{_esc(verdict.call)}</span>{why}</p>"
    )
    if verdict.token_scores is not None and verdict.token_offsets is not None:
        offs = np.asarray(verdict.token_offsets)
        tokens = [example.response[a:b] for a, b in offs]
        labels = gold_labels(offs, example)
        parts.append(
            f"<p class='meta'>Token scores (flag threshold {flag_threshold(detector):.3f}); gold "
            "tokens underlined.</p>"
            + token_heatmap_html(
                tokens,
                np.asarray(verdict.token_scores, dtype=float),
                labels=None if labels is None else labels.tolist(),
                value_name=f"{name} token score",
                vmin=0.0,
                vmax=1.0,
                cmap=TOKEN_CMAP,
            )
        )
    kind = getattr(detector, "explanation_kind", "values")  # a trait of the class
    if kind == "shap" and features is not None:
        try:
            parts.append(figures(waterfall_figure(shap_values(detector, [features]), 0)))
        except Exception as e:  # the report still shows the rest  # noqa: BLE001
            parts.append(f"<p class='meta'>SHAP waterfall unavailable: {_esc(e)}</p>")
    elif verdict.explanation and kind == "contributions":
        fig = contributions_figure(dict(verdict.explanation), top=10)
        fig.update_yaxes(automargin=True)
        parts.append(figures(fig))
    elif verdict.explanation:
        top = sorted(verdict.explanation.items(), key=lambda kv: -abs(kv[1]))[:10]
        parts.append(
            "<p class='meta'>What the score was read from</p>"
            + _table([{"feature": k, "value": f"{v:.4g}"} for k, v in top])
        )
    if getattr(detector, "explains_sae_features", False):
        items = sorted(
            ((k, v) for k, v in verdict.explanation.items() if k != INTERCEPT),
            key=lambda kv: -abs(kv[1]),
        )[:8]
        rows = [
            {
                "feature": k,
                "contribution": f"{v:+.3f}",
                "explanation": explanations.get(k, "(none cached; explain it on the Feature "
                                                   "explanations page)"),
            }
            for k, v in items
        ]  # fmt: skip
        parts.append("<p><b>Top SAE features</b></p>" + _table(rows))
    if getattr(detector, "reads_heads", False) and features is not None:
        fig = head_ecs_figure(features, title=f"{name}: mean ECS of each head on this answer")
        if fig is not None:
            parts.append(figures(fig))
    return "<div class='box'>" + "".join(parts) + "</div>"


def _spans_section(answer: AnswerVerdict, response: str) -> str:
    """Where and why: the set's spans shaded by score, and one row per span."""
    out = [f"<h2>Where and why</h2><p>{_esc(answer.summary)}</p>"]
    d = answer.span_decision
    if not answer.spans:
        note = d.note if d is not None and d.note else "The set flags no span."
        return "".join(out) + f"<p class='meta'>{_esc(note)}</p>"
    marks = [
        Mark(s.start, s.end, span_background(s.score), f"{s.type}: {s.reason}")
        for s in answer.spans
    ]
    out.append(
        "<div class='box'><b>Answer</b> <span class='meta'>(the set's spans; darker: a "
        f"higher score)</span>{marked_html(response, marks)}</div>"
    )
    out.append(_table(span_rows(answer).to_dict("records")))
    if d is not None and d.rule is not None:
        out.append(f"<p class='meta'>Spans: {_esc(d.rule.describe())}.</p>")
    return "".join(out)


def _example_parts(
    example: RAGExample, *, model_name: str, dataset: str | None, reviews: Sequence[ReviewItem]
) -> list[str]:
    """The report's header line, question, passages and marked answer."""
    body: list[str] = []
    gold = (
        "unlabelled" if example.label is None else "hallucinated" if example.label else "faithful"
    )
    meta = [
        f"example <code>{_esc(example.id)}</code>",
        f"model {_esc(model_name)}",
        f"gold: {gold}",
    ]
    if dataset:
        meta.insert(1, f"dataset {_esc(dataset)}")
    if example.provenance.generator:
        meta.append(f"generator {_esc(example.provenance.generator)}")
    body.append(f"<p class='meta'>{' · '.join(meta)}</p>")
    body.append("<h2>Example</h2>")
    if example.question:
        body.append(f"<p><b>Question:</b> {_esc(example.question)}</p>")
    for k, p in enumerate(example.passages, start=1):
        body.append(f"<div class='box'><b>Passage {k}</b>{marked_html(p, [])}</div>")
    accepted = [
        Mark(r.start, r.end, ACCEPTED_MARK, f"accepted by {r.reviewer}")
        for it in reviews
        for r in it.reviews
        if r.decision == "accept"
    ]
    gold_marks = [
        Mark(s.start, s.end, GOLD_MARK, f"gold span{': ' + s.type if s.type else ''}")
        for s in example.spans
    ]
    body.append(
        "<div class='box'><b>Answer</b> <span class='meta'>(red: gold spans; orange: spans "
        "reviewers accepted)</span>"
        + marked_html(example.response, gold_marks + accepted)
        + "</div>"
    )
    return body


def _verdict_table(verdicts: Mapping[str, Verdict], detectors: Mapping[str, Any]) -> str:
    """One row per detector: score, threshold, verdict, and what it was trained on."""
    rows = []
    for name, v in verdicts.items():
        det = detectors.get(name)
        trained = (getattr(det, "train_info_", None) or {}).get("n_train", "")
        rows.append(
            {
                "detector": name,
                "score": f"{v.score:.3f}",
                "threshold": _fmt(_threshold(det, v)),
                "verdict": v.call,
                "token scores": "yes" if v.token_scores is not None else "no",
                "trained on (answers)": trained,
            }
        )
    return _table(rows)


def _reviewer_decisions(example: RAGExample, reviews: Sequence[ReviewItem]) -> str:
    """The reviewers' decisions on the answer's flagged spans (or a line saying none)."""
    rrows = [
        {
            "flagged span": example.response[it.start : it.end],
            "detectors": ", ".join(it.detectors),
            "reviewer": r.reviewer,
            "decision": r.decision,
            "span": example.response[r.start : r.end],
            "type": r.type_text or "",
            "note": r.note or "",
            "when": r.updated_at,
        }
        for it in reviews
        for r in it.reviews
    ]
    if not rrows:
        return "<p class='meta'>No reviewer has decided on this answer's spans.</p>"
    return _table(rrows)


def answer_report_html(
    *,
    example: RAGExample,
    model_name: str,
    verdicts: Mapping[str, Verdict],
    detectors: Mapping[str, Any],
    features: Mapping[str, Features] | None = None,
    explanations: Mapping[str, str] | None = None,
    reviews: Sequence[ReviewItem] = (),
    dataset: str | None = None,
    answer: AnswerVerdict | None = None,
) -> str:
    """The audit report of one answer (see the module docstring).

    Args:
        example: The answer and its sources.
        model_name: The analysing model, as shown.
        verdicts: Detector name -> its verdict on the answer.
        detectors: Detector name -> the fitted detector (thresholds, SHAP, SAE).
        features: Detector name -> the features its verdict came from.
        explanations: RAGLens feature name (``F123``) -> its cached LLM explanation.
        reviews: Review items of this answer (their reviews are listed).
        dataset: The dataset it belongs to, as shown.
        answer: The set's verdict on the answer (:func:`core.pipeline.judge.answer_verdict`
            of these verdicts): its spans are drawn by score, with their evidence.
    """
    features = features or {}
    explanations = explanations or {}
    figures = _Figures()
    body = _example_parts(example, model_name=model_name, dataset=dataset, reviews=reviews)
    if answer is not None:
        body.append(_spans_section(answer, example.response))
    body.append("<h2>Verdicts</h2>")
    body.append(_verdict_table(verdicts, detectors))
    body.append("<h2>Explanations</h2>")
    for name, v in verdicts.items():
        body.append(
            _detector_section(
                name, v, detectors.get(name), features.get(name), example, figures, explanations
            )
        )
    body.append("<h2>Reviewer decisions</h2>")
    body.append(_reviewer_decisions(example, reviews))
    return _page(f"Audit report: {example.id}", "".join(body))


def dataset_report_html(
    *,
    name: str,
    model_name: str,
    table: VerdictTable,
    reviews: Sequence[ReviewItem] = (),
) -> str:
    """The summary report of a dataset (see the module docstring)."""
    from sklearn.metrics import roc_auc_score

    figures = _Figures()
    labelled = table.gold >= 0
    body = [
        f"<p class='meta'>dataset {_esc(name)} · model {_esc(model_name)} · "
        f"{len(table.example_ids)} answers ({int((table.gold == 1).sum())} hallucinated, "
        f"{int((table.gold == 0).sum())} faithful, {int((~labelled).sum())} unlabelled)</p>",
        "<h2>Detectors</h2>",
    ]
    rows = []
    y = table.gold[labelled]
    for k, d in enumerate(table.detectors):
        s = table.scores[labelled, k]
        auroc = roc_auc_score(y, s) if len(set(y.tolist())) == 2 else None
        rows.append(
            {
                "detector": d,
                "mean score": f"{table.scores[:, k].mean():.3f}",
                "flagged": f"{table.calls[:, k].mean():.0%}",
                "AUROC": _fmt(auroc),
                "accuracy": _fmt(
                    float((table.calls[labelled, k] == y).mean()) if y.size else None, ".0%"
                ),
            }
        )
    body.append(_table(rows))
    if len(table.detectors) > 1 and len(table.example_ids) > 1:
        body.append("<h2>Agreement</h2>")
        body.append(
            figures(
                correlation_figure(score_correlation(table), title="Score correlation (spearman)")
            )
        )
        if labelled.any():
            body.append(figures(gold_matrix_figure(table, title="Where each call matches gold")))
            pairs = pairwise_gold(table)
            body.append(
                _table(
                    [
                        {
                            "A": r["A"],
                            "B": r["B"],
                            **{
                                c: f"{r[c]:.0%}"
                                for c in ("both right", "only A", "only B", "neither")
                            },
                        }
                        for _, r in pairs.iterrows()
                    ]
                )
            )
    body.append("<h2>Review</h2>")
    if not reviews:
        body.append("<p class='meta'>No review queue for this dataset.</p>")
    else:
        counts: dict[str, int] = {}
        for it in reviews:
            counts[it.status] = counts.get(it.status, 0) + 1
        body.append(_table([{"status": k, "items": v} for k, v in sorted(counts.items())]))
        got = agreement(reviews)
        if got is not None:
            body.append(
                f"<p>Reviewers {_esc(got.reviewers[0])} and {_esc(got.reviewers[1])} on "
                f"{got.n_items} items: Cohen's kappa {_fmt(got.kappa, '.2f')}, span-overlap F1 "
                f"{_fmt(got.span_f1, '.2f')}.</p>"
            )
    return _page(f"Dataset report: {name}", "".join(body))
