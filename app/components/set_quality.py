"""The loaded set's cross-validated quality as it judges answers, its experts included
(:func:`core.evaluation.deferred.set_quality`), for the Benchmark page."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.text import code, md
from core.base.errors import RagscopeError
from core.evaluation.deferred import SetQuality, set_quality
from core.pipeline.sets import DetectorSet


@st.cache_resource(show_spinner="Putting the set's and its experts' runs together…", max_entries=4)
def _quality(cache_id: str, _dset: DetectorSet) -> SetQuality | str | None:
    """The set's quality, or why it cannot be read (kept per set state)."""
    try:
        return set_quality(_dset)
    except RagscopeError as e:
        return str(e)


def show_set_quality(dset: DetectorSet) -> None:
    """Per dataset and pooled: the answer judge's out-of-fold AUROC and balanced accuracy
    as the set judges (each dataset by its expert, where it has one), beside the set's
    own. Nothing for a set without experts."""
    if not dset.experts:
        return
    got = _quality(dset.cache_id, dset)
    if got is None:
        return
    st.subheader("The loaded set as it judges answers, experts included")
    if isinstance(got, str):
        st.warning(f"The {md(dset.name)} set's quality with its experts cannot be read: {md(got)}")
        return
    deferred = ", ".join(
        f"{md(ds)} to the **{md(e.name)}** set" for ds, e in sorted(dset.experts.items())
    )
    st.caption(
        f"The **{md(dset.name)}** set defers the answers of {deferred} (trained on that data "
        f"alone, on the same features). Its **{md(got.detector)}**'s out-of-fold scores and "
        "flags, each answer from the run of the set that judges it, against the set's own "
        "alone; 95% CIs from a bootstrap over sources. Runs: "
        + ", ".join(f"{md(s)} {code(r)}" for s, r in got.runs.items())
        + "."
    )
    frame = pd.DataFrame(got.to_rows())
    numbers = [c for c in frame.columns if frame[c].dtype.kind == "f"]
    st.dataframe(
        frame,
        hide_index=True,
        width="stretch",
        column_config={c: st.column_config.NumberColumn(format="%.3f") for c in numbers},
    )
    for p in got.parts:
        if p.evidence:
            st.warning(f"**Too few answers** in {md(p.dataset)}: {md(p.evidence)}")
