"""Home: what ragscope is, the loaded model and its detectors (with training them when it
has none), and which dataset the Playground uses."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app.components.train_job import train_detectors_panel
from app.state.datasets import (
    KEY_DATASET,
    KEY_IMPORT,
    KEY_UPLOAD,
    KEY_UPLOAD_NAME,
    UPLOAD_SUFFIXES,
    DatasetRef,
    UploadReport,
    dataset_choices,
    get_store,
    home_default,
    load_examples,
    read_upload,
)
from app.state.detectors import detector_set
from app.state.links import (
    HOME_DATASETS_HERE,
    P_DATASET,
    dataset_spec,
    follow_home_dataset,
    publish,
)
from app.state.model import get_model
from app.state.session import AppState, app_state, seed_widget
from app.text import code, md
from core.base.errors import RagscopeError
from core.base.paths import detector_set_names
from core.base.words import plural
from core.engine.model import LoadedModel

INTRO = (
    "**ragscope** shows *why* a language model's retrieval-augmented answer is or is not "
    "faithful to its sources, by reading the model's internals while it reads the answer. "
    "Pick a dataset here, then open the **Playground** to analyse an answer token by token: "
    "how surprised the model is by each token, and which parts of the prompt it was reading."
)


def _format_params(n: int) -> str:
    # Short enough for a metric tile in a half-width column.
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K"


def model_status(model: LoadedModel) -> None:
    """The loaded model's facts."""
    i = model.info
    st.subheader("Model")
    st.markdown(f"**{md(i.display_name)}** · {code(i.architecture)}")
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Layers × heads", f"{i.n_layers} × {i.n_heads}")
    c2.metric("KV heads", i.n_kv_heads, help="Fewer than heads: grouped-query attention")
    c3.metric("d_model", i.d_model, help=f"d_head {i.d_head}, vocabulary {i.d_vocab:,}")
    c4.metric("Parameters", _format_params(i.n_params), help=f"{i.n_params:,} parameters")
    st.markdown(
        f"Device **{i.device}** · dtype **{i.dtype}** · loaded in **{model.load_seconds:.1f} s**"
        f" · context {i.n_ctx:,} tokens · chat template "
        f"{'yes' if i.has_chat_template else 'no'}"
    )
    st.caption(
        f"Weights read from {code(model.source)}. Set `RAGSCOPE_MODEL` to analyse another model."
    )


def detector_set_status(model: LoadedModel) -> None:
    """Which detector set is loaded, what it was trained on, and the other shipped sets."""
    st.subheader("Detectors")
    shipped = detector_set(model)
    if shipped.error:
        st.error(md(shipped.error) + " The default set is loaded instead.")
    n = len(shipped.detectors)
    data = ", ".join(code(t) for t in shipped.trained_on) or "unrecorded data"
    if n:
        st.markdown(
            f"Detector set **{md(shipped.name)}**: {n} detector{'s' if n != 1 else ''} "
            f"trained for this model on {data}, from {code(shipped.folder.name)}. Their "
            "thresholds and calibrated scores hold for answers like those they were trained "
            "on; on other kinds of answers their ranking carries over better than their "
            "verdicts (the Benchmark page's cross-domain matrix shows how far)."
        )
    else:
        st.markdown(f"Detector set **{md(shipped.name)}** has no detectors trained for this model.")
    for ds, expert in sorted(shipped.experts.items()):
        st.markdown(
            f"Answers of {code(ds)} (or another split of it) are judged by its expert, the "
            f"**{md(expert.name)}** set, trained on that data alone and reading the same "
            "features; every page says so. The Benchmark's cross-validation tab shows the "
            "set's quality with its experts."
        )
    for problem in shipped.expert_problems:
        st.warning(f"An expert of the {md(shipped.name)} set is not used: {md(problem)}")
    others = [s for s in detector_set_names() if s != shipped.name]
    if others:
        st.caption(
            "Other shipped sets: "
            + ", ".join(code(s) for s in others)
            + ". Start the app with `RAGSCOPE_DETECTOR_SET=NAME` to load one."
        )


def dataset_picker(state: AppState) -> None:
    """Choose the Playground's dataset: built-in, shared dev sets, or imported."""
    st.subheader("Dataset")
    try:
        choices = dataset_choices()
    except RagscopeError as e:
        st.error(md(e))
        choices = [home_default()]
    link = follow_home_dataset()
    by_key: dict[str, DatasetRef] = {c.key: c for c in choices}
    if state.dataset.key not in by_key:
        state.dataset = home_default()
    if st.session_state.get(KEY_DATASET) not in by_key:
        st.session_state.pop(KEY_DATASET, None)
    seed_widget(KEY_DATASET, state.dataset.key)
    picked = st.radio(
        "Examples for the Playground",
        list(by_key),
        key=KEY_DATASET,
        format_func=lambda k: by_key[k].markdown_label,  # radio options render Markdown
    )
    state.dataset = by_key[picked]
    publish(
        P_DATASET,
        dataset_spec(state.dataset),
        default=dataset_spec(home_default()),
        missing=link.missing,
        what="dataset",
        where=HOME_DATASETS_HERE,
        instead=state.dataset.markdown_label,
    )
    try:
        examples = load_examples(state.dataset)
    except RagscopeError as e:
        st.error(md(e))
        return
    n_hall = sum(1 for e in examples if e.label is True)
    n_faith = sum(1 for e in examples if e.label is False)
    n_spans = sum(1 for e in examples if e.spans)
    tasks = sorted({e.task for e in examples})
    st.markdown(
        f"**{len(examples)}** examples ({md(', '.join(tasks))}): {n_hall} hallucinated, "
        f"{n_faith} faithful, {len(examples) - n_hall - n_faith} unlabelled; "
        f"{n_spans} with gold spans."
    )
    st.page_link("views/playground.py", label="Open the Playground", icon=":material/science:")


def _do_import(report: UploadReport) -> None:
    """Import callback: store the good records and select them (runs before the rerun)."""
    state = app_state()
    name = str(st.session_state.get(KEY_UPLOAD_NAME, "")).strip()
    try:
        store = get_store()
        n = store.import_dataset(name, report.examples, source=report.file_name, fmt=report.fmt)
    except RagscopeError as e:
        state.imported_message = None
        state.import_error = md(e)
        return
    state.import_error = None
    state.dataset = DatasetRef(kind="store", name=name, path=store.path, n_examples=n)
    st.session_state[KEY_DATASET] = state.dataset.key
    state.imported_message = (
        f"Imported {n} {plural(n, 'example')} as **{md(name)}**; the Playground now uses "
        f"{plural(n, 'it', 'them')}."
    )


def upload_section(state: AppState) -> None:
    """Upload a .jsonl/.csv file, show what failed, import the rest into the library."""
    st.subheader("Import a dataset")
    st.caption(
        "JSONL (ragscope, RAGTruth or InterpDetect layout, or any records with "
        "`question`, `passages`, `response`) or CSV with those columns. Bad records "
        "are skipped and listed."
    )
    if state.imported_message:
        st.success(state.imported_message)
        state.imported_message = None
    if state.import_error:
        st.error(state.import_error)
    # No type= filter: Streamlit would raise on a name without the extension (a crafted
    # request) before this script runs; the name is checked here instead, as an error.
    upload = st.file_uploader(
        "Dataset file (.jsonl or .csv)",
        key=KEY_UPLOAD,
        help="JSONL or CSV, up to the server's upload limit",
    )
    if upload is not None and Path(upload.name).suffix.lower() not in UPLOAD_SUFFIXES:
        st.error(
            f"ragscope reads .jsonl and .csv files; {code(upload.name, max_len=80)} is neither. "
            "Rename it if it holds one of those formats."
        )
        state.upload = None
        return
    if upload is None:
        state.upload = None
        return
    if state.upload is None or state.upload[0] != upload.file_id:
        # Read once per upload and kept in this session only (no cross-session cache).
        try:
            with st.spinner("Reading the uploaded file…"):
                state.upload = (upload.file_id, read_upload(upload.name, upload.getvalue()))
        except RagscopeError as e:
            state.upload = None
            st.error(md(e))
            return
    report = state.upload[1]
    n_bad = len(report.errors)
    st.markdown(
        f"**{len(report.examples)}** of {report.n_read} records read as {code(report.fmt)}"
        + (f"; **{n_bad}** skipped:" if n_bad else ".")
    )
    if n_bad:
        st.dataframe(report.error_frame(), hide_index=True, width="stretch")
    if report.warnings:
        with st.expander(f"{len(report.warnings)} warnings"):
            st.text("\n".join(report.warnings))
    if not report.examples:  # an empty dataset is never stored: no button to press
        st.warning(
            f"No record of {code(report.file_name, max_len=80)} was good "
            f"({report.n_read} read{', all listed above' if n_bad else ''}); there is nothing "
            "to import. Fix the records and upload the file again."
        )
        return
    seed_widget(KEY_UPLOAD_NAME, report.default_name)
    st.text_input("Name in the library", key=KEY_UPLOAD_NAME)
    st.button(
        f"Import {len(report.examples)} {plural(len(report.examples), 'example')}",
        key=KEY_IMPORT,
        type="primary",
        on_click=_do_import,
        args=(report,),
    )


def main() -> None:
    state = app_state()
    st.title("ragscope")
    st.markdown(INTRO)
    left, right = st.columns([1, 1], gap="large")
    with right:  # usable while the model loads on the left
        dataset_picker(state)
    with left:
        model = get_model()
        model_status(model)
        detector_set_status(model)
        train_detectors_panel(model, home=True)
    st.divider()
    upload_section(state)


main()
