"""Shared fixtures: the tiny random model, the embedded model, a toy example.

The session keeps one persistent cache dir (``RAGSCOPE_CACHE_DIR``, default
``~/.cache/ragscope``) so the embedded model is dequantized once per machine,
not once per run. Tests that write caches point ``RAGSCOPE_CACHE_DIR`` at a
``tmp_path`` with ``monkeypatch``. Nothing here downloads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

# Before anything imports core: keep the user's cache dir when set.
os.environ.setdefault("RAGSCOPE_CACHE_DIR", str(Path.home() / ".cache" / "ragscope"))

from core.base.examples import RAGExample  # noqa: E402
from core.cli import main  # noqa: E402
from core.data import load_builtin, resolve_dataset  # noqa: E402
from core.engine.model import (  # noqa: E402
    LoadedModel,
    embedded_cache_path,
    load_model,
    prepare_embedded,
)
from core.storage import Store  # noqa: E402

EMBEDDED_FIXTURES = frozenset({"embedded_model"})


SERIAL_GROUPS = {
    "browser": "browser",
    "test_ray_extract.py": "ray",
    "test_judge_cli.py": "ray",
    "test_adapt_refit.py": "browser",
}
"""Under pytest-xdist (``make test``: ``-n 2``), the modules that must not run beside their
own kind: every browser test (each drives a Streamlit server and a Chromium) in one
worker, one after another; likewise the two modules that start a local Ray cluster.
``test_adapt_refit.py`` runs after the browser tests, in their worker: it reads the
``calibrated_tiny_ensemble_set`` the review loop's browser test has trained there (a
3-fold CV training, about 40 s, otherwise trained again in the other worker)."""


def work_unit(nodeid: str) -> str:
    """The unit of work one xdist worker runs whole: the test's module (its module
    fixtures are built once), or its :data:`SERIAL_GROUPS` group."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return SERIAL_GROUPS.get(parts[-2] if len(parts) > 1 else "") or SERIAL_GROUPS.get(
        parts[-1], path
    )


class ModuleScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with :func:`work_unit` as the scope. (Not ``--dist
    loadgroup``: pytest-xdist 3.8 marks a group by rewriting ``item._nodeid``, which
    pytest 9 no longer reads, so its groups silently fall apart.)"""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> ModuleScheduling:
    return ModuleScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist: the controller dequantizes the embedded model before the
    workers start (two workers must not write its cache at once), and each worker runs
    torch on one thread (a worker per core; more threads only wait for each other)."""
    workers = config.getoption("numprocesses", default=None)
    if workers and not hasattr(config, "workerinput"):
        prepare_embedded()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test that uses the embedded model is marked ``embedded`` (so ``-m`` can skip
    it). The browser tests go first: under xdist they are the longest unit of work, and
    the other worker runs the rest beside them."""
    for item in items:
        if EMBEDDED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.embedded)
    items.sort(key=lambda item: work_unit(item.nodeid) != "browser")


@pytest.fixture(scope="session")
def tiny_model() -> LoadedModel:
    """The seeded random tiny model (2 layers, 4 heads, 2 kv heads) on the CPU."""
    return load_model("tiny", device="cpu")


@pytest.fixture(scope="session")
def tiny_reference(tiny_model: LoadedModel):
    """A plain, unwrapped HF copy of the tiny model (the bridge rewires ``hf_model`` in place).

    Same seed, so the same weights: an independent reference for numerics.
    """
    from core.engine.model import _tiny_hf_model

    return _tiny_hf_model(tiny_model.tokenizer, seed=0).eval()


@pytest.fixture(scope="session")
def embedded_was_cached() -> bool:
    """Whether the embedded model's float cache existed before this session loaded it."""
    return (embedded_cache_path() / "model.safetensors").is_file()


@pytest.fixture(scope="session")
def embedded_model(embedded_was_cached: bool) -> LoadedModel:
    """SmolLM2-135M-Instruct from the installed GGUF (dequantized once into the cache)."""
    return load_model("embedded", device="cpu")


@pytest.fixture(scope="session")
def toy_example() -> RAGExample:
    """A small qa example with two passages and one labelled span."""
    from core.base.examples import Span

    response = "The Old Bridge was built by Ada Lovell in 1820, from red granite."
    start = response.index("red granite")
    return RAGExample(
        id="toy-1",
        task="qa",
        question="Who built the Old Bridge, and when?",
        passages=(
            "The Old Bridge was built by Ada Lovell in 1820.",
            "The bridge spans the river Wend and is made of grey limestone.",
        ),
        response=response,
        spans=(Span(start=start, end=start + len("red granite"), type="Evident Conflict"),),
    )


def _train_tiny_set(
    tmp_path_factory: pytest.TempPathFactory, name: str, options: list[str]
) -> tuple[Path, Path]:
    """``(artifacts, cache dir)`` of ``ragscope train`` on 60 built-in answers with the
    tiny model and 3-fold CV (so every detector is calibrated), with ``options``; the
    cache dir shares the session's model cache."""
    root = tmp_path_factory.mktemp(name)
    out = root / "set"
    models = Path(os.environ["RAGSCOPE_CACHE_DIR"]).expanduser() / "models"
    models.mkdir(parents=True, exist_ok=True)
    (root / "cache").mkdir()
    (root / "cache" / "models").symlink_to(models, target_is_directory=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("RAGSCOPE_CACHE_DIR", str(root / "cache"))
    mp.setenv("RAGSCOPE_DB", str(root / "train.sqlite3"))
    try:
        argv = ["train", "--model", "tiny", "--dataset", "builtin", "--limit", "60", "--cv", "3"]
        assert main([*argv, *options, "--out", str(out)]) == 0
    finally:
        mp.undo()
    return out, root / "cache"


@pytest.fixture(scope="session")
def calibrated_tiny_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``nll`` and ``context_gain``, calibrated (a raw score and a pooled calibration
    each): a set the review loop can adapt (:func:`_train_tiny_set`)."""
    return _train_tiny_set(tmp_path_factory, "calibrated-set", ["--detectors", "nll,context_gain"])


@pytest.fixture(scope="session")
def calibrated_tiny_ensemble_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``nll``, ``context_gain`` and an ensemble of the two, all calibrated: a set whose
    adaptation can refit the ensemble's stacker (:func:`_train_tiny_set`)."""
    options = ["--detectors", "nll,context_gain,ensemble"]
    options += ["--set", 'ensemble.members=["nll","context_gain"]']
    return _train_tiny_set(tmp_path_factory, "calibrated-ensemble-set", options)


OWN_DATASET = "mine"
"""The dataset of a user's own answers in the adaptation tests (:func:`adapt_env`)."""


@pytest.fixture
def adapt_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[tuple[Path, Path], int], tuple[Store, list[RAGExample]]]]:
    """``make(set_paths, n)``: the trained set ``set_paths`` (``(artifacts, cache dir)``)
    as the app's detectors, a fresh database holding the dataset ``mine`` (``n`` QA
    answers of the built-in corpus, renamed), and that store (closed after the test)
    with the dataset's answers as ``stored:mine`` reads them."""
    with ExitStack() as stack:

        def make(set_paths: tuple[Path, Path], n: int) -> tuple[Store, list[RAGExample]]:
            out, cache = set_paths
            monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(cache))
            monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(out))
            monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "db.sqlite3"))
            monkeypatch.setenv("RAGSCOPE_TRAINED_DIR", str(tmp_path / "trained"))
            monkeypatch.setenv("OMP_NUM_THREADS", "1")
            qa = [e for e in load_builtin() if e.task == "qa"][200 : 200 + n]
            answers = [
                dataclasses.replace(
                    e, provenance=dataclasses.replace(e.provenance, dataset=OWN_DATASET)
                )
                for e in qa
            ]
            store = stack.enter_context(Store())
            store.import_dataset(OWN_DATASET, answers, source="test", fmt="ragscope")
            return store, resolve_dataset(f"stored:{OWN_DATASET}")[1]

        yield make


def _tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


@pytest.fixture
def tree_digest() -> Callable[[Path], str]:
    """SHA-256 over every file's relative path and bytes under a folder (a set that
    must stay untouched)."""
    return _tree_digest


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Run a test module's torch work on one thread, then restore the count.

    The tiny model's forwards are latency-bound: on a shared 2-core machine a
    second thread mostly waits for other jobs (about 30x slower here).
    """
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_sae(tiny_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory):
    """A small TopK SAE on the tiny model's layer-1 residual stream, saved and reloaded."""
    from core.signals.sae import (
        LoadedSAE,
        SaeSettings,
        collect_activations,
        load_sae,
        sae_corpus,
        save_sae,
        train_sae,
    )

    corpus = sae_corpus(("demo", "builtin"))
    acts = collect_activations(tiny_model, corpus.train[:60], 1)
    settings = SaeSettings(layer=1, expansion=4, k=8, training_tokens=40_000, batch_size=512)
    sae = train_sae(acts, settings)
    folder = tmp_path_factory.mktemp("sae") / "tiny-sae"
    save_sae(sae, folder, layer=1, model_key=tiny_model.info.key, meta={"note": "test"})
    loaded = load_sae(folder)
    assert isinstance(loaded, LoadedSAE)
    return loaded


# --------------------------------------------------------------------------- LLM endpoint

FAKE_LLM_URL = "http://llm.invalid/v1"


def _register_httpcore2_mocker() -> None:
    """Teach respx the transport the ``openai`` SDK uses (httpx2 over httpcore2).

    respx patches httpx/httpcore only; this registers the same request interception for
    httpcore2 under the name ``"httpcore2"`` (``respx.mock(using="httpcore2")``).
    """
    import httpcore2
    from respx.mocks import HTTPCoreMocker, Mocker

    if "httpcore2" in Mocker.registry:
        return

    class HTTPCore2Mocker(HTTPCoreMocker):
        name = "httpcore2"
        targets = [
            "httpcore2._sync.connection.HTTPConnection",
            "httpcore2._sync.connection_pool.ConnectionPool",
            "httpcore2._sync.http_proxy.HTTPProxy",
            "httpcore2._async.connection.AsyncHTTPConnection",
            "httpcore2._async.connection_pool.AsyncConnectionPool",
            "httpcore2._async.http_proxy.AsyncHTTPProxy",
        ]

        @classmethod
        def from_sync_httpx_response(cls, httpx_response, target, **kwargs):
            return httpcore2.Response(
                status=httpx_response.status_code,
                headers=httpx_response.headers.raw,
                content=httpx_response.stream,
                extensions=httpx_response.extensions,
            )


@pytest.fixture
def llm_base_url() -> str:
    """The base URL of the fake OpenAI-compatible server (``.invalid``: never resolves)."""
    return FAKE_LLM_URL


@pytest.fixture
def llm_server(llm_base_url: str) -> Iterator[object]:
    """A respx router standing in for an OpenAI-compatible server at :func:`llm_base_url`.

    Routes are relative to the base URL (``llm_server.post("/chat/completions")``). Any
    request no route matches raises instead of leaving the machine.
    """
    import respx

    _register_httpcore2_mocker()
    with respx.mock(base_url=llm_base_url, using="httpcore2", assert_all_called=False) as router:
        yield router


@pytest.fixture
def reseal():
    """Re-record an artifact folder's file hashes after a test edited its files on purpose.

    Tests of what a loader does with malformed content edit ``weights.json`` and the
    like; the hash check would refuse those first. Resealing makes the edit look like
    an attacker's (who can rewrite ``cfg.json`` too), so the checks behind it are hit.
    """
    import json

    from core.learning.artifact import artifact_hashes

    def _reseal(folder: Path) -> None:
        cfg_path = Path(folder) / "cfg.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["files"] = artifact_hashes(folder)
        cfg_path.write_text(json.dumps(cfg, indent=2))

    return _reseal


def _code_running_pipeline(marker: Path):
    """A scikit-learn pipeline that runs Python code at its first ``predict_proba``.

    Every callable in it comes from NumPy or scikit-learn, so a loader trusting those
    packages by prefix lets it through: ``numpy.full_like`` makes a 0-d array holding
    the code, ``str`` turns it into a string, and scikit-learn's test helper
    ``assert_run_python_script_without_output`` runs it in a subprocess. The code only
    creates ``marker`` (a harmless stand-in for any command).
    """
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer
    from sklearn.utils._testing import assert_run_python_script_without_output

    code = f"open({str(marker)!r}, 'w').write('pwned')"
    X = np.random.default_rng(0).normal(size=(8, 2))
    steps = [
        FunctionTransformer(
            func=np.full_like, kw_args={"fill_value": code, "shape": (), "dtype": "O"}
        ),
        FunctionTransformer(func=str),
        FunctionTransformer(func=assert_run_python_script_without_output),
    ]
    for s in steps:
        s.fit(X)  # fitting does not call func
    clf = LogisticRegression().fit(X, np.arange(8) % 2)
    return Pipeline([*((f"s{i}", s) for i, s in enumerate(steps)), ("clf", clf)])


@pytest.fixture
def hostile_artifact(tmp_path: Path):
    """``(root, detector, model_key) -> marker``: writes a detector artifact under
    ``root/<detector>`` whose skops file would run code when used, with every file hash
    recorded (an attacker rewrites ``cfg.json`` too), for ``interpdetect`` (its pipeline)
    or ``raglens`` (its EBM). The code would create ``marker``, which must never appear.
    """
    import skops.io as sio

    from core.detectors import make_detector
    from core.learning.artifact import write_artifact

    def make(root: Path, detector: str = "interpdetect", model_key: str = "any") -> Path:
        marker = tmp_path / f"PWNED-{detector}"
        payload = _code_running_pipeline(marker)
        det = make_detector(detector)
        if detector == "interpdetect":
            weights = {"names": ["ECS_L0H0"], "kept": ["ECS_L0H0"], "classifier": "lr"}
            fname = "pipeline.skops"
        else:
            weights = {"n_features": 4, "selected": [0], "mi": [0.1], "sae": None}
            fname = "ebm.skops"
        write_artifact(
            root / detector,
            name=detector,
            config=det.config,
            model_key=model_key,
            weights=weights,
            extra={"threshold": 0.5, "train": {}},
            files={fname: lambda p: sio.dump(payload, p)},
        )
        return marker

    return make
