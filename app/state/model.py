"""The model: which one (environment), loaded once per process and shared."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

import streamlit as st

from core.base.errors import ModelError
from core.base.examples import RAGExample
from core.engine.layout import render
from core.engine.model import load_model
from core.engine.trace import response_needs, trace

if TYPE_CHECKING:
    from core.base.examples import RAGExample
    from core.engine.model import LoadedModel


MODEL_ENV = "RAGSCOPE_MODEL"


DEVICE_ENV = "RAGSCOPE_DEVICE"


def model_spec() -> str:
    """The model to load: env ``RAGSCOPE_MODEL`` (default ``embedded``)."""
    return os.environ.get(MODEL_ENV, "").strip() or "embedded"


def model_device() -> str:
    """The device to load on: env ``RAGSCOPE_DEVICE`` (default ``auto``)."""
    return os.environ.get(DEVICE_ENV, "").strip() or "auto"


class ModelLoader:
    """Loads one model on a background thread and reports progress.

    The script thread polls it to draw a progress bar; every session asking for the
    same model while it loads watches the same load.
    """

    def __init__(self, spec: str, device: str) -> None:
        self.spec = spec
        self.device = device
        self.message = f"Loading {spec}"
        self.fraction = 0.0
        self.model: LoadedModel | None = None
        self.error: Exception | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ragscope-load-{spec}", daemon=True)
        self._thread.start()

    def _progress(self, message: str, fraction: float) -> None:
        self.message = message
        self.fraction = min(max(float(fraction), 0.0), 1.0)

    def _run(self) -> None:

        try:
            model = load_model(self.spec, device=self.device, progress=self._progress)
            self._progress("Warming up (first forward pass)", 0.97)
            _warm_up(model)
            self.model = model
        except Exception as e:  # handed to the script thread, which shows it
            self.error = e
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds; True once loading has finished (or failed)."""
        return self._done.wait(timeout)


def _warm_up(model: LoadedModel) -> None:
    """Trace a tiny example once, so the first user's first analysis is not the slow one.

    The first forward pass after loading pages the weights in and sets up kernels (about
    10 s for the embedded model on a small CPU machine); later passes take well under 1 s.
    """

    example = RAGExample(
        id="warm-up", question="Who?", passages=("Ada built it.",), response="Ada."
    )
    trace(model, render(example, model), response_needs())


@st.cache_resource(show_spinner=False, max_entries=2)
def _model_loader(spec: str, device: str) -> ModelLoader:
    return ModelLoader(spec, device)


def start_model() -> ModelLoader:
    """Start loading the shared model in the background (once per process) without
    waiting: the app's first page draws while it loads; :func:`get_model` waits."""
    return _model_loader(model_spec(), model_device())


def loaded_model() -> LoadedModel | None:
    """The shared model if it has finished loading, else ``None`` (never waits)."""
    loader = start_model()
    return loader.model if loader.done and loader.error is None else None


def get_model() -> LoadedModel:
    """The shared model for ``RAGSCOPE_MODEL`` / ``RAGSCOPE_DEVICE``.

    The first call in the process starts the load and shows its progress; later calls
    return at once. A :class:`~core.base.errors.ModelError` is shown with ``st.error`` (its
    message names the fix) and the script stops; the next rerun tries again.
    """
    spec, device = model_spec(), model_device()
    loader = _model_loader(spec, device)
    if not loader.done:
        slot = st.empty()
        with slot.status(f"Loading the model `{spec}`…", expanded=True) as status:
            bar = st.progress(loader.fraction, text=loader.message)
            while not loader.wait(0.25):
                bar.progress(loader.fraction, text=loader.message)
            if loader.error is not None:
                status.update(label="The model could not be loaded", state="error")
        if loader.error is None:
            slot.empty()
    if loader.error is not None or loader.model is None:
        err = loader.error
        _model_loader.clear(spec, device)  # a fixed install works on the next rerun
        if isinstance(err, ModelError):
            st.error(f"The model `{spec}` could not be loaded: {err}")
            st.stop()
        raise err if err is not None else ModelError(f"loading {spec!r} returned nothing")
    return loader.model
