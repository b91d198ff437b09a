"""The GAM shape functions page on the tiny model (AppTest).

Without an SAE or a raglens artifact it names the commands that make them; with a
raglens detector fitted here on the demo examples (tiny model + the small test SAE,
written to a temporary ``RAGSCOPE_DETECTORS_DIR``) its ranking, shape function and
answer view show exactly the detector's own numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from core.data import builtin_examples
from core.detectors import load_shipped, make_detector
from core.engine.model import LoadedModel
from core.pipeline.extract import extract_features

GAM = "views/gam.py"


@pytest.fixture(scope="module")
def raglens_artifact(tiny_model: LoadedModel, tiny_sae, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("raglens-detectors")
    examples = builtin_examples()
    det = make_detector("raglens", sae=str(tiny_sae.path), top_k=8, max_rounds=200)
    feats = extract_features(tiny_model, examples, [det]).features["raglens"]
    det.fit(list(feats), examples).save(
        out / "raglens", extra={"trained_on": {"dataset": "demo", "n": {"train": len(examples)}}}
    )
    return out


def test_gam_page_names_the_commands_without_artifacts(
    open_page: Callable[[str], AppTest], page_text: Callable[[AppTest], str]
) -> None:
    text = page_text(open_page(GAM))
    assert "No SAE for RAGLens yet" in text and "ragscope sae train" in text
    assert "ragscope train --model tiny --dataset builtin --seed 0 --detectors raglens" in text


def test_gam_page_shows_the_detectors_own_numbers(
    open_page: Callable[[str], AppTest],
    no_exception: Callable[[AppTest], None],
    chart: Callable[[AppTest, str], dict],
    page_text: Callable[[AppTest], str],
    plotly_array: Callable[[object], np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    raglens_artifact: Path,
    tiny_model: LoadedModel,
    tiny_sae,
    spy_heights: Callable[[], list[object]],
) -> None:
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(raglens_artifact))
    # The artifact names the tiny SAE's folder: one the operator trusts (an artifact may
    # name no other folder outside itself and the shipped assets).
    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(tiny_sae.path))
    heights = spy_heights()
    at = open_page(GAM)
    text = page_text(at)
    assert "Shipped **raglens** detector" in text and "SAE**: `tiny-sae`" in text
    det = load_shipped("raglens", tiny_model.info.key, raglens_artifact)
    imp = det.importances()
    # the features table: every feature shown is in view, no inner scrollbar
    (features,) = [d.value for d in at.dataframe if "importance" in d.value.columns]
    assert features["feature"].tolist() == [f"F{k}" for k, _ in imp][: len(features)]
    assert heights and set(heights) == {"content"}
    bars = chart(at, "EBM importance of the top")
    np.testing.assert_allclose(
        plotly_array(bars["data"][0]["x"]), [v for _, v in imp][: len(imp)][::-1], rtol=1e-6
    )
    # Close-up of the second-ranked feature: the EBM's own shape function.
    k = imp[1][0]
    at.selectbox(key="gam.feature").set_value(k).run()
    no_exception(at)
    shape = chart(at, f"Shape function of SAE feature F{k}")
    sf = det.shape_function(k)
    np.testing.assert_allclose(plotly_array(shape["data"][0]["y"])[::2], sf["scores"], rtol=1e-6)
    # The answer view: the detector's verdict on the picked example.
    ex_id = at.selectbox(key="gam.example").value
    ex = next(e for e in builtin_examples() if e.id == ex_id)
    ans = det.explain_answer(tiny_model, ex)
    assert f"RAGLens score **{ans.verdict.score:.3f}**" in page_text(at)
    contrib = chart(at, "Largest contributions to this answer")
    assert len(plotly_array(contrib["data"][0]["x"])) == min(12, len(det.selected_))
    # A heatmap per top feature that fires; one that does not is explained instead.
    top = ans.top_positive(3)
    silent = [k for k in top if not ans.activations_of(k).size or ans.activations_of(k).max() <= 0]
    n_maps = sum(1 for h in at.get("html") if "activation" in str(h.proto))
    assert n_maps == len(top) - len(silent)
    notes = [c.value for c in at.caption if "does not fire on any token" in c.value]
    assert len(notes) == len(silent)


def test_a_gam_link_opens_its_feature_and_example(
    make_app: Callable[[], AppTest],
    no_exception: Callable[[AppTest], None],
    chart: Callable[[AppTest, str], dict],
    monkeypatch: pytest.MonkeyPatch,
    raglens_artifact: Path,
    tiny_model: LoadedModel,
    tiny_sae,
) -> None:
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(raglens_artifact))
    # The artifact names the tiny SAE's folder: one the operator trusts (an artifact may
    # name no other folder outside itself and the shipped assets).
    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(tiny_sae.path))
    imp = load_shipped("raglens", tiny_model.info.key, raglens_artifact).importances()
    k = imp[2][0]  # not the feature the page starts from
    link = {"feature": f"F{k}", "top": "3", "dataset": "demo", "example": "demo-04-mount-kelsey"}

    def open_link(**params: str) -> AppTest:
        at = make_app().run()
        at.query_params.update(params)
        at.switch_page(GAM).run()
        no_exception(at)
        return at

    at = open_link(**link)
    assert not at.warning
    assert at.selectbox(key="gam.feature").value == k
    assert at.number_input(key="gam.top").value == 3
    assert at.selectbox(key="gam.example").value == "demo-04-mount-kelsey"
    chart(at, f"Shape function of SAE feature F{k}")
    assert dict(at.query_params) == link
    # A feature the detector did not select: named, and the top feature shown instead.
    at = open_link(feature="F99999")
    assert [w.value for w in at.warning] == [
        f"This link names the feature `F99999`, which is not among the {len(imp)} SAE "
        f"features the raglens detector selected; showing `F{imp[0][0]}` instead."
    ]
    assert at.query_params["feature"] == f"F{imp[0][0]}"


def test_gam_explains_the_playgrounds_answer_first(
    open_after_analysis: Callable[[str, str], AppTest],
    no_exception: Callable[[AppTest], None],
    page_text: Callable[[AppTest], str],
    monkeypatch: pytest.MonkeyPatch,
    raglens_artifact: Path,
    tiny_model: LoadedModel,
    tiny_sae,
) -> None:
    """As on the other one-answer pages, "One answer" offers the Playground's analysed
    answer first and opens on it; an example of a dataset is one click away."""
    from app.state.heads import HEADS_EXAMPLE_DATASET, HEADS_EXAMPLE_PLAYGROUND

    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(raglens_artifact))
    monkeypatch.setenv("RAGSCOPE_SAE_DIR", str(tiny_sae.path))
    played = "demo-02-waggle-dance"
    at = open_after_analysis(played, GAM)
    source = at.radio(key="gam.example.source")
    assert source.value == HEADS_EXAMPLE_PLAYGROUND
    assert "The Playground's analysed answer" in str(source.options)
    assert f"Example `{played}`" in page_text(at)
    det = load_shipped("raglens", tiny_model.info.key, raglens_artifact)
    ex = next(e for e in builtin_examples() if e.id == played)
    ans = det.explain_answer(tiny_model, ex)
    assert f"RAGLens score **{ans.verdict.score:.3f}**" in page_text(at)
    # an example of a dataset instead: the picker of examples appears
    source.set_value(HEADS_EXAMPLE_DATASET).run()
    no_exception(at)
    picked = at.selectbox(key="gam.example").value
    other = next(e for e in builtin_examples() if e.id == picked)
    score = det.explain_answer(tiny_model, other).verdict.score
    assert f"RAGLens score **{score:.3f}**" in page_text(at)
