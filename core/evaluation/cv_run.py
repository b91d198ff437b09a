"""A cross-validation run as saved: each detector's pooled, per-fold and per-group
results (:class:`CVResult`), the run (:class:`CVRun`) with its JSON and markdown, and
the run files' reading and writing that the cross-domain matrix shares.

:func:`core.evaluation.crossval.cross_validate` makes these; the Benchmark, the CLI and
:mod:`core.evaluation.deferred` read them back (as untrusted files: bounded, checked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from core.base.errors import DataError
from core.base.safeio import read_json_file
from core.evaluation.comparison import checked_comparisons, comparison_lines
from core.evaluation.evaluate import (
    RUN_JSON_LIMIT,
    save_run,
)
from core.learning.calibration import Reliability
from core.learning.metrics import (
    SPAN_F1_NOTE,
    ci_columns,
    evidence_warning,
)

CV_FORMAT = 1
Criterion = Literal["f1", "balanced_accuracy"]
Calibration = Literal["crossfit", "split"]
CALIBRATIONS: tuple[Calibration, ...] = ("crossfit", "split")
LENGTH_BINS = 5
"""Answer-length quantile bins of the length-matched AUROC."""


@dataclass(frozen=True, kw_only=True)
class CVResult:
    """One detector's out-of-fold results.

    Attributes:
        detector: Detector name.
        config_hash: Its config hash.
        pooled: Metrics over all answers scored out of fold (AUROC/AP with grouped
            bootstrap CIs, balanced accuracy, F1, precision, recall at each fold's own
            threshold, ECE of the calibrated scores).
        folds: Per fold: n, positives, AUROC, AP, balanced accuracy, threshold, ECE.
        token: Token AP / AUROC pooled over the out-of-fold token scores, or ``None``.
        spans: Span precision / recall / F1 by character overlap
            (:func:`core.learning.metrics.span_overlap_metrics`) of the detector's whole-word
            spans (:func:`core.pipeline.word_spans.detector_spans`) at the token threshold of the
            fold that judged each answer, over the answers with gold spans and the
            faithful ones; ``None`` without token scores or span labels (and in runs
            saved before it existed).
        reliability: Reliability diagram of the calibrated out-of-fold scores.
        by_generator: Generator -> n, positives, AUROC (pooled out-of-fold).
        by_dataset: Dataset -> n, positives, AUROC, balanced accuracy, ECE, and with
            ``own_``: balanced accuracy and ECE under the dataset's own calibration and
            threshold (:func:`core.learning.contract.for_dataset`; the pooled ones where the
            training part gave it none); ``token_ap`` / ``token_auroc`` over the
            dataset's labelled tokens (``None`` without token labels or scores);
            ``spans``: span precision / recall / F1 over the dataset's answers, as
            :attr:`spans` pools them (``None`` without them; absent in older runs).
        scores: Calibrated out-of-fold score per answer (aligned with :attr:`CVRun.ids`).
        raw_scores: The detector's own scores before calibration.
        flagged: Whether each answer reached its fold's threshold.
        span_rule: The span rule chosen for span F1 on the out-of-fold token scores,
            with its nested measurement and the flag-everything baseline
            (:func:`core.evaluation.span_choice.choose_span_rule`); ``None`` without token
            scores or span labels (and in runs saved before it existed).
    """

    detector: str
    config_hash: str
    pooled: Mapping[str, Any]
    folds: tuple[Mapping[str, Any], ...]
    token: Mapping[str, Any] | None
    reliability: Reliability
    by_generator: Mapping[str, Mapping[str, Any]]
    by_dataset: Mapping[str, Mapping[str, Any]]
    scores: tuple[float, ...]
    raw_scores: tuple[float, ...]
    flagged: tuple[bool, ...]
    spans: Mapping[str, Any] | None = None
    span_rule: Mapping[str, Any] | None = None

    def spread(self, key: str = "auroc") -> tuple[float | None, float | None]:
        """Mean and standard deviation of ``key`` over the folds."""
        v = [f[key] for f in self.folds if f.get(key) is not None]
        return (float(np.mean(v)), float(np.std(v))) if v else (None, None)

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["reliability"] = self.reliability.to_json()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CVResult:
        kw = dict(d)
        kw["reliability"] = Reliability.from_json(d["reliability"])
        kw["folds"] = tuple(d["folds"])
        for k in ("scores", "raw_scores", "flagged"):
            kw[k] = tuple(d[k])
        return cls(**kw)


@dataclass(frozen=True, kw_only=True)
class CVRun:
    """A saved cross-validation: what was run, on what, and every detector's results."""

    name: str
    created_at: str
    model: str
    datasets: tuple[str, ...]
    k: int
    seed: int
    criterion: str
    calibrate_on: tuple[str, ...] | None
    ids: tuple[str, ...]
    labels: tuple[int, ...]
    fold: tuple[int, ...]
    generators: tuple[str, ...]
    example_datasets: tuple[str, ...]
    data_hash: str
    results: tuple[CVResult, ...]
    extraction: Mapping[str, Any] = field(default_factory=dict)
    calibration: str = "split"
    baseline: Mapping[str, Any] = field(default_factory=dict)
    groups: tuple[str, ...] = ()
    comparisons: Mapping[str, Any] = field(default_factory=dict)
    kind: str = "cv"
    format: int = CV_FORMAT

    def result(self, detector: str) -> CVResult:
        for r in self.results:
            if r.detector == detector:
                return r
        raise KeyError(detector)

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["results"] = [r.to_dict() for r in self.results]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CVRun:
        if d.get("kind") != "cv" or d.get("format") != CV_FORMAT:
            raise DataError(f"not a cross-validation run of format {CV_FORMAT}; re-run it")
        kw = dict(d)
        kw["results"] = tuple(CVResult.from_dict(r) for r in d["results"])
        for k in ("datasets", "ids", "labels", "fold", "generators", "example_datasets"):
            kw[k] = tuple(d[k])
        kw["groups"] = tuple(str(g) for g in d.get("groups") or ())
        kw["comparisons"] = checked_comparisons(d.get("comparisons"), kw.get("name"))
        if d.get("calibrate_on") is not None:
            kw["calibrate_on"] = tuple(d["calibrate_on"])
        if kw.get("calibration", "split") not in CALIBRATIONS:
            raise DataError(
                f"cross-validation run {kw.get('name')!r}: unknown calibration "
                f"{kw.get('calibration')!r} (expected one of {list(CALIBRATIONS)})"
            )
        n = len(kw["ids"])
        lengths = {k: len(kw[k]) for k in ("labels", "fold", "generators", "example_datasets")}
        if kw["groups"]:
            lengths["groups"] = len(kw["groups"])
        for r in kw["results"]:
            lengths |= {f"{r.detector} {k}": len(getattr(r, k)) for k in ("scores", "raw_scores")}
        wrong = {k: v for k, v in lengths.items() if v != n}
        if wrong:
            raise DataError(
                f"cross-validation run {kw.get('name')!r} is inconsistent: {n} answers but "
                + ", ".join(f"{v} {k}" for k, v in wrong.items())
                + "; re-run it"
            )
        return cls(**kw)

    def save(self, folder: str | Path) -> tuple[Path, Path]:
        """Write ``<name>.json`` and ``<name>.md`` into ``folder``."""
        return save_run(self.name, self.to_dict(), self.to_markdown(), folder)

    @classmethod
    def load(cls, path: str | Path) -> CVRun:
        return cls.from_dict(read_run(path, "cross-validation run"))

    def to_frame(self) -> Any:
        """One row per detector: pooled metrics, their CIs and the fold spread."""
        import pandas as pd

        rows = []
        for r in self.results:
            p = r.pooled
            ci = p.get("auroc_ci") or [None, None]
            mean, sd = r.spread()
            rows.append(
                {
                    "detector": r.detector,
                    "AUROC": p.get("auroc"),
                    **dict(zip(ci_columns("AUROC"), ci, strict=True)),
                    "AUROC length-matched": p.get("auroc_length_matched"),
                    "fold AUROC mean": mean,
                    "fold AUROC sd": sd,
                    "AP": p.get("ap"),
                    **dict(zip(ci_columns("AP"), p.get("ap_ci") or [None, None], strict=True)),
                    "n": p.get("n"),
                    "hallucinated": p.get("n_positive"),
                    "balanced acc": p.get("balanced_accuracy"),
                    "F1": p.get("f1"),
                    "ECE": p.get("ece"),
                    "token AP": (r.token or {}).get("ap"),
                    "token AUROC": (r.token or {}).get("auroc"),
                    "span P (char)": (r.spans or {}).get("precision"),
                    "span R (char)": (r.spans or {}).get("recall"),
                    "span F1 (char)": (r.spans or {}).get("f1"),
                }
            )
        return pd.DataFrame(rows)

    @property
    def evidence(self) -> str | None:
        """Why this run's pooled metrics are not to be read as facts, with what would fix
        it (:func:`core.learning.metrics.evidence_warning` of its labels); ``None`` when there are
        enough answers of both classes."""
        return evidence_warning(np.asarray(self.labels), "The answers")

    @property
    def dataset_evidence(self) -> dict[str, str]:
        """The same for each dataset part of a run over several (only the parts short of
        answers); empty for a run over one dataset."""
        sets_of = np.asarray(self.example_datasets)
        labels = np.asarray(self.labels)
        sets = sorted({d for r in self.results for d in r.by_dataset})
        if len(sets) < 2 or sets_of.size != labels.size:
            return {}
        found = {s: evidence_warning(labels[sets_of == s], f"{s}'s answers") for s in sets}
        return {s: w for s, w in found.items() if w}

    def to_markdown(self) -> str:
        lines = [
            f"# {self.name}",
            "",
            f"model `{self.model}`; {self.k}-fold source-grouped cross-validation (stratified by "
            f"label x generator x dataset, seed {self.seed}) on {', '.join(self.datasets)}: "
            f"{len(self.ids)} answers, {sum(self.labels)} hallucinated; data hash "
            f"{self.data_hash}; thresholds by {self.criterion} and calibration on each fold's "
            + (
                "training answers, cross-fitted"
                if self.calibration == "crossfit"
                else "validation part"
            )
            + (f" ({', '.join(self.calibrate_on)})" if self.calibrate_on else ""),
            "",
            "| detector | AUROC [95% CI] | length-matched | folds mean ± sd | AP [95% CI] "
            "| bal. acc | F1 | ECE | token AP | span P/R/F1 (char) | token AUROC |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.results:
            p, t = r.pooled, r.token or {}
            mean, sd = r.spread()
            spread = "-" if mean is None else f"{mean:.3f} ± {sd:.3f}"
            lines.append(
                f"| {r.detector} | {format_ci(p, 'auroc')} | {format_metric(p.get('auroc_length_matched'))} | "
                f"{spread} | {format_ci(p, 'ap')} | "
                f"{format_metric(p.get('balanced_accuracy'))} | {format_metric(p.get('f1'))} | {format_metric(p.get('ece'))} | "
                f"{format_metric(t.get('ap'))} | {format_span_prf(r.spans)} | "
                f"{format_metric(t.get('auroc'))} |"
            )
        if any(r.spans for r in self.results):
            lines += ["", SPAN_F1_NOTE]
        lines += span_rule_lines(self.results)
        if self.evidence:
            lines += ["", f"**Too few answers.** {self.evidence}"]
        length = dict(self.baseline.get("answer_length") or {})
        if length.get("auroc") is not None:
            lines += [
                "",
                f"Answer length alone (words) reaches AUROC {format_ci(length, 'auroc')}. "
                "*Length-matched* is the AUROC over hallucinated/faithful pairs in the same "
                f"answer-length quantile ({length.get('length_bins', LENGTH_BINS)} bins): what a "
                "detector sees beyond length.",
            ]
        lines += comparison_lines(self.comparisons)
        gens = sorted({g for r in self.results for g in r.by_generator})
        if len(gens) > 1:
            lines += ["", "AUROC by generator (pooled out of fold):", ""]
            lines.append("| detector | " + " | ".join(gens) + " |")
            lines.append("|---|" + "---|" * len(gens))
            for r in self.results:
                cells = [format_metric((r.by_generator.get(g) or {}).get("auroc")) for g in gens]
                lines.append(f"| {r.detector} | " + " | ".join(cells) + " |")
        sets = sorted({d for r in self.results for d in r.by_dataset})
        if len(sets) > 1:
            lines += [
                "",
                "By dataset (pooled out of fold): AUROC [source-grouped 95% CI over the "
                "dataset's answers] / balanced accuracy / ECE with the "
                "pooled calibration → AUROC / balanced accuracy / ECE with each dataset's "
                "own calibration and threshold (and the ensemble's stacker of that dataset's "
                "own, where it has one); token AP over the dataset's labelled tokens; "
                "span precision / recall / F1 by character overlap over its answers",
                "",
            ]
            lines.append("| detector | " + " | ".join(sets) + " |")
            lines.append("|---|" + "---|" * len(sets))
            for r in self.results:
                cells = []
                for s in sets:
                    m = r.by_dataset.get(s) or {}
                    cell = f"{format_ci(m, 'auroc')} / "
                    cell += f"{format_metric(m.get('balanced_accuracy'))} / "
                    cell += format_metric(m.get("ece"))
                    if "own_ece" in m:
                        own = f"{format_ci(m, 'own_auroc')} / " if "own_auroc" in m else ""
                        cell += f" → {own}{format_metric(m.get('own_balanced_accuracy'))} / {format_metric(m['own_ece'])}"
                    if m.get("token_ap") is not None:
                        cell += f"; token AP {format_metric(m['token_ap'])}"
                    if m.get("spans"):
                        cell += f"; span P/R/F1 {format_span_prf(m['spans'])}"
                    cells.append(cell)
                lines.append(f"| {r.detector} | " + " | ".join(cells) + " |")
            for warn in self.dataset_evidence.values():
                lines += ["", f"**Too few answers.** {warn}"]
        ex = self.extraction
        if ex:
            lines += [
                "",
                f"feature extraction: {ex.get('computed')} computed, {ex.get('cache_hits')} from "
                f"cache, {ex.get('n_errors', 0)} failed, {ex.get('seconds', 0):.1f} s",
            ]
        return "\n".join(lines)


def span_rule_lines(results: Sequence[CVResult]) -> list[str]:
    """The span rules chosen on the run's out-of-fold token scores, with their nested
    span P/R/F1, faithful share and the flag-everything baseline (nothing when no
    detector has one)."""
    rows = [r for r in results if r.span_rule]
    if not rows:
        return []
    out = [
        "",
        "Span rules chosen for span F1 on these out-of-fold token scores (nested: each "
        "fold's spans come from the rule chosen on the other folds; 95% CI by resampling "
        "sources), beside flagging every character of every answer:",
        "",
        "| detector | rule | span P / R / F1 (char) [F1 95% CI] | faithful chars flagged "
        "| flag everything P / R / F1 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        sr = r.span_rule or {}
        rule, nested, every = (
            sr.get("rule") or {},
            sr.get("nested") or {},
            sr.get("flag_everything") or {},
        )
        ci = nested.get("f1_ci") or [None, None]
        ci_txt = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci[0] is not None else ""
        share = nested.get("faithful_share")
        out.append(
            f"| {r.detector} | ≥ {rule.get('threshold', 0):.3f}, answer weight "
            f"{rule.get('answer_weight', 0):g}, {'gated' if rule.get('gate') else 'ungated'}, "
            f"gap {rule.get('gap_tokens')}, {rule.get('extend', 'words')} | "
            f"{format_span_prf(nested)}{ci_txt} | "
            f"{'-' if share is None else f'{share:.1%}'} | {format_span_prf(every)} |"
        )
    per = [
        (r.detector, n, m)
        for r in rows
        for n, m in ((r.span_rule or {}).get("by_dataset") or {}).items()
    ]
    if len({n for _, n, _ in per}) > 1:
        out += [
            "",
            "The same per dataset (the rules chosen over all of them):",
            "",
            "| detector | dataset | span P / R / F1 (char) | faithful chars flagged "
            "| flag everything F1 |",
            "|---|---|---|---|---|",
        ]
        for det, name, m in per:
            share = m.get("faithful_share")
            out.append(
                f"| {det} | {name} | {format_span_prf(m)} | "
                f"{'-' if share is None else f'{share:.1%}'} | "
                f"{format_metric(m.get('flag_everything_f1'))} |"
            )
    return out


def format_metric(v: Any) -> str:
    return "-" if v is None else f"{v:.3f}"


def format_span_prf(m: Mapping[str, Any] | None) -> str:
    """Span precision / recall / F1 (char), or ``-`` (none measured, or an older run)."""
    if not m or m.get("f1") is None:
        return "-"
    return " / ".join(format_metric(m.get(k)) for k in ("precision", "recall", "f1"))


def format_ci(m: Mapping[str, Any], key: str) -> str:
    ci = m.get(f"{key}_ci")
    return format_metric(m.get(key)) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def stamped_run(kind: str, dataset: str, report: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """``report`` as a run to save: its kind, a dated name, its dataset, the time, ``extra``."""
    now = datetime.now(UTC)
    return {
        "kind": kind,
        "name": f"{now:%Y%m%d-%H%M%S}-{kind}-{dataset}",
        "created_at": now.isoformat(timespec="seconds"),
        "dataset": dataset,
        **extra,
        **report,
    }


def read_run(path: str | Path, what: str) -> dict[str, Any]:
    d = read_json_file(path, RUN_JSON_LIMIT, what=what)
    if not isinstance(d, dict):
        raise DataError(f"not a readable {what} (not a JSON object)", source=str(path))
    return d
