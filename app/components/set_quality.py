"""The loaded set's quality card, the Benchmark's first tab: the numbers that describe
the set this server judges answers with (:func:`core.evaluation.deferred.set_quality`:
its answer judge's cross-validation per dataset with CIs, its experts included), each
saying what it was measured on, and every member's recorded number beside where it
comes from. Older runs are the page's other tabs."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.components.exports import PROBABILITY_FORMAT, whole_table
from app.text import md
from core.base.errors import RagscopeError
from core.evaluation.deferred import SetQuality, set_quality
from core.pipeline.sets import DetectorSet

ALONE_COLUMNS = ("set alone AUROC", "set alone balanced accuracy")


@st.cache_resource(show_spinner="Putting the set's and its experts' runs together…", max_entries=4)
def _quality(cache_id: str, _dset: DetectorSet) -> SetQuality | str:
    """The set's quality, or why it cannot be read (kept per set state)."""
    try:
        return set_quality(_dset)
    except RagscopeError as e:
        return str(e)


def members_frame(dset: DetectorSet) -> pd.DataFrame:
    """One row per detector of the set: the AUROC its card records and what it was
    measured on (cross-validation or a test split), and what it was trained on."""
    return pd.DataFrame(
        [
            {
                "detector": c.name,
                "recorded AUROC": c.auroc,
                "measured on": c.auroc_from or "not recorded",
                "trained on": c.trained_on or "not recorded",
                "calibrated": "yes" if c.calibrated else "no (raw score)",
            }
            for c in dset.detectors
        ]
    )


def _with_ci(auroc: float | None, low: float | None, high: float | None) -> str:
    """``0.925 [0.914, 0.935]``; ``n/a`` without an AUROC, no interval without one."""
    if auroc is None or pd.isna(auroc):
        return "n/a"
    ci = (
        ""
        if low is None or high is None or pd.isna(low) or pd.isna(high)
        else f" [{float(low):.3f}, {float(high):.3f}]"
    )
    return f"{float(auroc):.3f}{ci}"


def quality_frame(got: SetQuality) -> pd.DataFrame:
    """:meth:`SetQuality.to_rows` as the card shows them: the AUROC with its 95% CI in
    one column, the answers with the hallucinated ones in another, the set-alone columns
    only when an expert judges some answers."""
    frame = pd.DataFrame(got.to_rows())
    shown = [
        _with_ci(a, lo, hi)
        for a, lo, hi in zip(frame["AUROC"], frame["AUROC low"], frame["AUROC high"], strict=True)
    ]
    frame.insert(int(frame.columns.get_loc("AUROC")), "AUROC [95% CI]", shown)
    counts = [
        f"{int(n):,} ({int(h):,})"
        for n, h in zip(frame["answers"], frame["hallucinated"], strict=True)
    ]
    frame.insert(int(frame.columns.get_loc("answers")), "answers (hallucinated)", counts)
    frame = frame.drop(columns=["AUROC", "AUROC low", "AUROC high", "answers", "hallucinated"])
    if not got.deferred:
        frame = frame.drop(columns=[c for c in ALONE_COLUMNS if c in frame.columns])
    return frame


def show_set_quality(dset: DetectorSet) -> None:
    """The card: the answer judge's quality per dataset and pooled (as the set judges,
    each dataset by its expert where it has one), then every member's recorded AUROC."""
    if not dset.detectors:
        st.info(
            "No detector set is loaded for this model: train one (Home's Train panel or "
            "`ragscope train`) and its quality appears here."
        )
        return
    st.subheader(f"The {dset.name} set, as it judges answers")
    got = _quality(dset.cache_id, dset)
    if isinstance(got, str):
        st.info(
            f"No cross-validation describes the {md(dset.name)} set's answer judge: "
            f"{md(got)}. Each detector's recorded number is below, with what it was "
            "measured on."
        )
    else:
        show_judge_quality(dset, got)
    st.markdown("**Each detector of the set**")
    members = members_frame(dset)
    whole_table(members, numbers=("recorded AUROC",))
    st.caption(
        "Each detector's own AUROC as its artifact records it: pooled out of fold for "
        "cross-validated training, else on the held-out test split. The answer judge's "
        "number above is the one that describes the set's verdicts."
    )


def show_judge_quality(dset: DetectorSet, got: SetQuality) -> None:
    """The judge's pooled AUROC with its CI and balanced accuracy, and the per-dataset
    table, with what they were measured on."""
    ci = got.pooled.get("auroc_ci")
    c1, c2, c3 = st.columns(3)
    auroc = got.pooled.get("auroc")
    c1.metric(
        f"{got.detector} AUROC, all answers",
        "n/a" if auroc is None else f"{auroc:.3f}",
        help=None if not ci else f"95% CI [{ci[0]:.3f}, {ci[1]:.3f}] (bootstrap over sources)",
    )
    bal = got.pooled.get("balanced_accuracy")
    c2.metric("Balanced accuracy", "n/a" if bal is None else f"{bal:.3f}")
    c3.metric("Answers", f"{got.pooled['n']:,}", help=f"{got.pooled['n_positive']:,} hallucinated")
    if ci:
        st.caption(f"AUROC 95% CI [{ci[0]:.3f}, {ci[1]:.3f}], from a bootstrap over sources.")
    short = {
        "balanced accuracy": "bal. accuracy",
        "set alone balanced accuracy": "alone: bal. acc.",
        "set alone AUROC": "alone: AUROC",
    }
    whole_table(
        quality_frame(got),
        column_config={
            c: st.column_config.NumberColumn(label, format=PROBABILITY_FORMAT, help=c)
            for c, label in short.items()
        },
    )
    st.caption(f"Measured on: {md(got.measured_on)}.")
    if got.deferred:
        deferred = ", ".join(
            f"{md(ds)} to the **{md(e.name)}** set" for ds, e in sorted(dset.experts.items())
        )
        st.caption(
            f"The **{md(dset.name)}** set defers the answers of {deferred} (trained on that "
            f"data alone, on the same features). Its **{md(got.detector)}**'s out-of-fold "
            "scores and flags, each answer from the run of the set that judges it, against "
            "the set's own alone."
        )
    for p in got.parts:
        if p.evidence:
            st.warning(f"**Too few answers** in {md(p.dataset)}: {md(p.evidence)}")


def benchmark_subtitle(dset: DetectorSet) -> str:
    """The Benchmark's subtitle: what its numbers come from. The loaded set's from what
    its answer judge's artifact records (a cross-validation for the shipped sets: every
    answer scored out of fold), the other tabs' from saved runs."""
    judge = dset.judge_name
    measured = dset.card(judge).auroc_from if judge is not None else None
    if measured is not None and measured.endswith("CV"):
        where = (
            f"The {md(dset.name)} set's numbers come from the {measured[:-2]}"
            "cross-validation its artifacts record (every answer scored out of fold, not "
            "a held-out test split). "
        )
    elif measured is not None:
        where = f"The {md(dset.name)} set's numbers come from its {md(measured)}. "
    else:
        where = ""
    return (
        "How well each detector separates hallucinated from faithful answers. "
        f"{where}The other tabs show saved runs (cross-validations, held-out test "
        "splits, cross-domain matrices), each opening on the loaded set's run or the "
        "newest; this page and `ragscope evaluate` save them."
    )
