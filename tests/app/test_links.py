"""Deep links on the tiny model (AppTest): a view's choices in the URL.

A link (query parameters set before the page runs) opens the page on the linked
dataset, example, head and controls, over the session's remembered choices; the page
writes its choices back as stable ids (the dataset spec, the example id, ``L1H2``); a
changed control changes the URL; a link naming something that is not here gets a
warning that names it and what is shown instead, and the URL is corrected. The GAM
page's feature links are tested in ``test_gam_page.py`` (its raglens artifact).
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Callable

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.components.heatmap_rows import row_id
from app.state.datasets import BUILTIN_ANSWERS, KEY_DATASET
from app.state.heads import (
    HEADS_FROM_CORPUS,
    HEADS_FROM_HOME,
    KEY_HEADS_EXAMPLE,
    KEY_HEADS_HEAD,
    KEY_HEADS_LAYER,
    KEY_HEADS_LIMIT,
    KEY_HEADS_SOURCE,
    KEY_HEADS_SPLIT,
    KEY_HEADS_TOP,
    KEY_HEADS_UNIT,
)
from app.state.heatmaps import KEY_HEATMAP_DATASET as KEY_HM_DATASET
from app.state.heatmaps import KEY_HEATMAP_EXAMPLE as KEY_HM_EXAMPLE
from app.state.heatmaps import KEY_P_STAY, KEY_ROWS, KEY_SMOOTH_ALL, KEY_THRESHOLD
from app.state.links import OwnInput, input_id, input_problem, pack_input, parse_input
from app.state.playground import (
    INPUT_OWN,
    KEY_ANALYSE,
    KEY_EXAMPLE,
    KEY_INPUT_MODE,
    KEY_OWN_QUESTION,
    KEY_PASTED,
)
from app.state.session import STATE_KEY
from core.data import load_builtin
from core.signals.smoothing import P_STAY_TOKEN

HEADS = "views/heads.py"
HEATMAPS = "views/token_heatmaps.py"
PLAYGROUND = "views/playground.py"
EXAMPLE = "demo-04-mount-kelsey"  # not the example the pages start from


@pytest.fixture
def open_link(
    make_app: Callable[[], AppTest], no_exception: Callable[[AppTest], None]
) -> Callable[..., AppTest]:
    """``open_link(page, **params)``: a fresh session opens ``page`` through a link."""

    def open_(page: str, **params: str) -> AppTest:
        at = make_app().run()  # Home first: the session starts where a visitor lands
        at.query_params.clear()
        at.query_params.update(params)
        at.switch_page(page).run()
        no_exception(at)
        return at

    return open_


def _warnings(at: AppTest) -> list[str]:
    return [w.value for w in at.warning]


def test_a_heads_link_opens_its_dataset_split_example_and_head(
    open_link: Callable[..., AppTest],
) -> None:
    ex = next(e for e in load_builtin() if e.provenance.split == "test" and e.spans)
    link = {
        "dataset": "builtin",
        "split": "test",
        "n": "6",
        "example": ex.id,
        "head": "L1H2",
        "top": "3",
        "unit": "chunk",
        "span": "1-3",
        "group": "late",
    }
    at = open_link(HEADS, **link)
    assert not _warnings(at)
    assert at.selectbox(key=KEY_HEADS_SOURCE).value == HEADS_FROM_CORPUS
    assert at.selectbox(key=KEY_HEADS_SPLIT).value == "test"
    assert at.number_input(key=KEY_HEADS_LIMIT).value == 6
    assert at.selectbox(key=KEY_HEADS_EXAMPLE).value == ex.id
    assert (at.selectbox(key=KEY_HEADS_LAYER).value, at.selectbox(key=KEY_HEADS_HEAD).value) == (
        1,
        2,
    )
    assert at.number_input(key=KEY_HEADS_TOP).value == 3
    assert at.radio(key=KEY_HEADS_UNIT).value == "chunk"
    assert dict(at.query_params) == link  # the view's URL is the link itself
    # A changed control changes the URL; the rest of the link stays.
    at.selectbox(key=KEY_HEADS_LAYER).set_value(0).run()
    assert at.query_params["head"] == "L0H2"
    assert at.query_params["example"] == ex.id


def test_a_link_to_missing_data_says_what_is_missing_and_what_is_shown(
    open_link: Callable[..., AppTest],
) -> None:
    at = open_link(HEADS, dataset="stored-set-nobody-has", example="no-such-example", head="L7H0")
    warnings = _warnings(at)
    assert len(warnings) == 3, warnings
    dataset, example, head = warnings
    assert "dataset `stored-set-nobody-has`" in dataset and "Built-in demo examples" in dataset
    shown = at.selectbox(key=KEY_HEADS_EXAMPLE).value
    assert "example `no-such-example`" in example and f"`{shown}`" in example
    layer, h = at.selectbox(key=KEY_HEADS_LAYER).value, at.selectbox(key=KEY_HEADS_HEAD).value
    assert "head `L7H0`" in head and "2 x 4 heads" in head and f"`L{layer}H{h}`" in head
    assert at.selectbox(key=KEY_HEADS_SOURCE).value == HEADS_FROM_HOME
    # The URL now describes what is shown.
    assert at.query_params["dataset"] == "demo"
    assert at.query_params["example"] == shown
    assert at.query_params["head"] == f"L{layer}H{h}"
    # The warnings stay while the fallback is shown, and go with the choice they are about.
    at.selectbox(key=KEY_HEADS_LAYER).set_value(1 - layer).run()
    assert len(_warnings(at)) == 2


def test_a_token_heatmaps_link_sets_the_example_and_sliders(
    open_link: Callable[..., AppTest],
) -> None:
    at = open_link(HEATMAPS, dataset="demo", example=EXAMPLE, p_stay="0.8", smooth_all="1")
    assert not _warnings(at)
    assert at.selectbox(key=KEY_HM_DATASET).value == HEADS_FROM_HOME
    assert at.selectbox(key=KEY_HM_EXAMPLE).value == EXAMPLE
    assert at.slider(key=KEY_P_STAY).value == pytest.approx(0.8)
    assert at.toggle(key=KEY_SMOOTH_ALL).value is True
    at.selectbox(key=KEY_HM_EXAMPLE).select("demo-01-lighthouse").run()
    assert at.query_params["example"] == "demo-01-lighthouse"
    # Back at the default, a control leaves the URL.
    at.slider(key=KEY_P_STAY).set_value(P_STAY_TOKEN).run()
    assert "p_stay" not in at.query_params
    # A value out of range is named; the default is shown.
    at = open_link(HEATMAPS, threshold="2")
    assert _warnings(at) == [
        "This link names the threshold `2`, which is not a number from 0 to 1; showing "
        "`0.5` instead."
    ]
    assert at.slider(key=KEY_THRESHOLD).value == pytest.approx(0.5)
    assert "threshold" not in at.query_params


def test_another_pages_parameters_are_not_taken_for_a_link(
    open_link: Callable[..., AppTest],
) -> None:
    at = open_link(HEADS, dataset="builtin", head="L1H3")
    heads_example = at.selectbox(key=KEY_HEADS_EXAMPLE).value
    # Token heatmaps (the URL still holds Heads' choices in AppTest) keeps its own.
    at.switch_page(HEATMAPS).run()
    assert not _warnings(at)
    assert at.selectbox(key=KEY_HM_DATASET).value == HEADS_FROM_HOME
    assert at.query_params["example"] == at.selectbox(key=KEY_HM_EXAMPLE).value
    assert at.query_params["example"] != heads_example


def test_a_playground_link_switches_homes_dataset_and_example(
    open_link: Callable[..., AppTest],
) -> None:
    example = "builtin-qa-landmark-000-faithful-answer"  # in the embedded model's answers
    at = open_link(PLAYGROUND, dataset="builtin-answers", example=example)
    assert not _warnings(at)
    assert at.selectbox(key=KEY_EXAMPLE).value == example
    assert at.session_state[STATE_KEY].dataset == BUILTIN_ANSWERS  # Home's choice follows
    assert dict(at.query_params) == {"dataset": "builtin-answers", "example": example}
    # Home shows the linked dataset and keeps it in the URL.
    at.switch_page("views/home.py").run()
    assert at.radio(key=KEY_DATASET).value == BUILTIN_ANSWERS.key
    assert at.query_params["dataset"] == "builtin-answers"


def test_a_link_to_the_playgrounds_answer_says_there_is_none(
    open_link: Callable[..., AppTest],
) -> None:
    at = open_link(HEATMAPS, answer="playground", dataset="demo", example=EXAMPLE)
    assert len(_warnings(at)) == 1
    assert "answer `playground`" in _warnings(at)[0]
    assert "this session has analysed no answer" in _warnings(at)[0]
    assert at.selectbox(key=KEY_HM_EXAMPLE).value == EXAMPLE  # the link's fallback
    assert "answer" not in at.query_params


def test_a_link_to_an_own_input_reopens_its_analysis(
    open_link: Callable[..., AppTest], make_app: Callable[[], AppTest]
) -> None:
    x = OwnInput(
        task="qa",
        question="When did the ferry start?",
        passages=("The ferry began service in 1911.", "It crosses the bay twice a day."),
        answer="The ferry started in 1912.",
    )
    link = input_id(x)
    assert link is not None and parse_input(link) == x
    at = open_link(PLAYGROUND, input=link)
    assert not _warnings(at)
    assert at.radio(key=KEY_INPUT_MODE).value == INPUT_OWN
    assert at.text_input(key=KEY_OWN_QUESTION).value == x.question
    assert at.text_area(key=KEY_PASTED).value == x.answer
    assert [a.value for a in at.text_area if a.key != KEY_PASTED] == list(x.passages)
    a = at.session_state[STATE_KEY].analysis
    assert a is not None and a.example.response == x.answer  # analysed on opening
    assert a.example.passages == x.passages
    assert at.query_params["input"] == link  # the link stays the view's
    # Editing the answer makes the analysis stale: the URL no longer claims it.
    at.text_area(key=KEY_PASTED).input("The ferry started in 1911.").run()
    assert "input" not in at.query_params
    at.button(key=KEY_ANALYSE).click().run()
    again = parse_input(at.query_params["input"])
    assert again is not None and again.answer == "The ferry started in 1911."


@pytest.mark.parametrize(
    "raw",
    [
        "2.abc",
        "1.%%%",
        "1." + base64.urlsafe_b64encode(b"not deflate").decode(),
        "1." + base64.urlsafe_b64encode(zlib.compress(b"[1, 2]")).decode(),
        # Inflates to 10 MB of spaces: stopped at the bound, not read.
        "1." + base64.urlsafe_b64encode(zlib.compress(b" " * 10_000_000, 9)).decode(),
        "1."
        + base64.urlsafe_b64encode(
            zlib.compress(json.dumps({"t": "qa", "q": "", "p": ["x"], "a": "y", "z": 1}).encode())
        ).decode(),
        "1."
        + base64.urlsafe_b64encode(
            zlib.compress(json.dumps({"t": "poem", "q": "", "p": ["x"], "a": "y"}).encode())
        ).decode(),
        "1."
        + base64.urlsafe_b64encode(
            zlib.compress(json.dumps({"t": "qa", "q": "", "p": [], "a": "y"}).encode())
        ).decode(),
        "1."
        + base64.urlsafe_b64encode(
            zlib.compress(json.dumps({"t": "qa", "q": "", "p": ["x"], "a": " "}).encode())
        ).decode(),
        "1." + "A" * 30_000,
        # A lone surrogate (JSON's escape): no widget, URL or tokenizer can carry it.
        pack_input(json.dumps({"t": "qa", "q": "\udfff", "p": ["x"], "a": "y"}).encode()),
        pack_input(json.dumps({"t": "qa", "q": "", "p": ["x"], "a": "y\ud800"}).encode()),
    ],
)
def test_hostile_input_links_are_refused(raw: str) -> None:
    assert parse_input(raw) is None
    assert input_problem(raw)


def test_an_unreadable_input_link_says_so(open_link: Callable[..., AppTest]) -> None:
    at = open_link(PLAYGROUND, input="1.garbage")
    assert len(_warnings(at)) == 1 and "Playground input `1.garbage`" in _warnings(at)[0]
    assert at.session_state[STATE_KEY].analysis is None
    assert "input" not in at.query_params


def test_an_input_too_long_for_a_link_gets_none() -> None:
    rng = np.random.default_rng(0)
    text = "".join(chr(c) for c in rng.integers(0x4E00, 0x9FFF, 20_000))  # incompressible
    assert input_id(OwnInput(task="qa", question="", passages=(text,), answer="a")) is None


def test_a_token_heatmaps_link_hides_its_rows(open_link: Callable[..., AppTest]) -> None:
    at = open_link(HEATMAPS, dataset="demo", example=EXAMPLE, hide="surprisal,nothing")
    rows = at.multiselect(key=KEY_ROWS)
    assert "surprisal (bits)" in rows.options and "surprisal (bits)" not in rows.value
    assert rows.value  # every other row is shown
    assert len(_warnings(at)) == 1 and "hidden rows `nothing`" in _warnings(at)[0]
    assert at.query_params["hide"] == "surprisal"
    # Showing it again takes it out of the URL; hiding a row puts it in.
    at.multiselect(key=KEY_ROWS).select("surprisal (bits)").run()
    assert "hide" not in at.query_params
    first = at.multiselect(key=KEY_ROWS).value[0]
    at.multiselect(key=KEY_ROWS).unselect(first).run()
    assert at.query_params["hide"] == row_id(first)


def test_an_input_link_with_a_lone_surrogate_says_so(open_link: Callable[..., AppTest]) -> None:
    # JSON's \ud800 escape inflates to a lone surrogate, which no UTF-8 text holds: the
    # model's tokenizer, the page and the URL cannot carry it.
    doc = {"t": "qa", "q": "", "p": ["The ferry began in 1911.", "x\ud800"], "a": "In 1912."}
    link = pack_input(json.dumps(doc).encode())
    assert "\\ud800" in json.dumps(doc)  # the escape, as a hostile link carries it
    at = open_link(PLAYGROUND, input=link)
    assert len(_warnings(at)) == 1
    assert "lone surrogate" in _warnings(at)[0] and "passage 2" in _warnings(at)[0]
    assert at.session_state[STATE_KEY].analysis is None
    assert "input" not in at.query_params


@pytest.mark.parametrize("page", [HEADS, HEATMAPS, "views/token_sources.py"])
def test_a_link_copied_after_a_playground_analysis_reopens_that_answer(
    page: str, open_link: Callable[..., AppTest], no_exception: Callable[[AppTest], None]
) -> None:
    x = OwnInput(
        task="qa",
        question="When did the ferry start?",
        passages=("The ferry began service in 1911.",),
        answer="The ferry started in 1912.",
    )
    # A session analyses its own input in the Playground, then opens the page on it.
    at = open_link(PLAYGROUND, input=input_id(x))
    assert at.session_state[STATE_KEY].analysis.example.response == x.answer
    at.switch_page(page).run()
    no_exception(at)
    copied = dict(at.query_params)
    assert copied.get("answer") == "playground" and parse_input(copied["input"]) == x
    # A fresh browser opens the copied link: the same answer, no warning.
    fresh = open_link(page, **copied)
    assert not _warnings(fresh)
    assert fresh.session_state[STATE_KEY].analysis is None
    assert fresh.session_state[STATE_KEY].linked_answer.response == x.answer
    assert any("The answer the link carries" in c.value for c in fresh.caption)
    assert dict(fresh.query_params) == copied  # the view's URL is the link itself
    # Once the Playground analyses another answer, pages show that one.
    fresh.switch_page(PLAYGROUND).run()
    fresh.button(key=KEY_ANALYSE).click().run()
    assert fresh.session_state[STATE_KEY].linked_answer is None


@pytest.mark.parametrize("page", [HEADS, HEATMAPS])  # Heads: its dataset is its statistics'
def test_a_datasets_answer_analysed_in_the_playground_is_linked_as_that_example(
    page: str, open_link: Callable[..., AppTest], no_exception: Callable[[AppTest], None]
) -> None:
    # A session analyses a dataset's own answer in the Playground, then opens the page.
    at = open_link(PLAYGROUND, dataset="demo", example=EXAMPLE)
    at.button(key=KEY_ANALYSE).click().run()
    no_exception(at)
    assert at.session_state[STATE_KEY].analysis.dataset == "demo"
    at.switch_page(page).run()
    no_exception(at)
    copied = dict(at.query_params)
    # Its id travels, not a copy of its text (which would lose the id and gold labels).
    assert "input" not in copied and "answer" not in copied, copied
    assert copied["example"] == EXAMPLE and copied["dataset"] == "demo"
    fresh = open_link(page, **copied)
    assert not _warnings(fresh)
    assert fresh.session_state[STATE_KEY].linked_answer is None
    assert all("The answer the link carries" not in c.value for c in fresh.caption)
    assert EXAMPLE in [s.value for s in fresh.selectbox]  # picked from the dataset
    assert dict(fresh.query_params) == copied


def test_a_changed_dataset_answer_is_linked_as_an_own_input(
    open_link: Callable[..., AppTest], no_exception: Callable[[AppTest], None]
) -> None:
    at = open_link(PLAYGROUND, dataset="demo", example=EXAMPLE)
    at.text_area(key=KEY_PASTED).input("A different answer entirely.").run()
    at.button(key=KEY_ANALYSE).click().run()
    no_exception(at)
    assert at.session_state[STATE_KEY].analysis.dataset is None
    at.switch_page(HEATMAPS).run()
    copied = dict(at.query_params)
    assert copied.get("answer") == "playground" and "input" in copied and "example" not in copied


AGREEMENT = "views/agreement.py"
LEARN = "views/learn.py"


def test_an_agreement_link_reopens_its_dataset_answers_detectors_and_correlation(
    with_demo_detectors, open_link: Callable[..., AppTest]
) -> None:
    at = open_link(AGREEMENT)
    assert dict(at.query_params) == {"dataset": "demo"}  # the other defaults go unsaid
    at.selectbox(key="agreement.dataset").select_index(1).run()  # the built-in corpus
    at.number_input(key="agreement.limit").set_value(5).run()
    at.multiselect(key="agreement.detectors").set_value(["nll", "cortex"]).run()
    at.button(key="agreement.run").click().run()
    at.radio(key="agreement.method").set_value("kendall").run()
    copied = dict(at.query_params)
    assert copied == {
        "dataset": "builtin",  # the built-in corpus
        "n": "5",
        "detectors": "nll,cortex",
        "method": "kendall",
    }
    fresh = open_link(AGREEMENT, **copied)
    assert not _warnings(fresh)
    assert fresh.selectbox(key="agreement.dataset").value == HEADS_FROM_CORPUS
    assert fresh.number_input(key="agreement.limit").value == 5
    assert fresh.multiselect(key="agreement.detectors").value == ["nll", "cortex"]
    fresh.button(key="agreement.run").click().run()
    assert fresh.radio(key="agreement.method").value == "kendall"
    assert dict(fresh.query_params) == copied  # the view's URL is the link itself
    # A detector this model has not trained is named, and the others kept.
    odd = open_link(AGREEMENT, detectors="nll,ghost,cortex", n="999")
    said = " ".join(_warnings(odd))
    assert "`ghost`" in said and "`999`" in said
    assert odd.multiselect(key="agreement.detectors").value == ["nll", "cortex"]
    assert odd.query_params["detectors"] == "nll,cortex"
    assert "n" not in odd.query_params


def test_a_learn_link_reopens_its_walkthrough_step_and_answer(
    open_link: Callable[..., AppTest], no_exception: Callable[[AppTest], None]
) -> None:
    at = open_link(LEARN)
    at.radio(key="learn.walk").set_value("SPAD").run()
    at.button(key="learn.next").click().run()
    no_exception(at)
    copied = dict(at.query_params)
    assert copied == {"walk": "spad", "step": "2"}
    fresh = open_link(LEARN, **copied)
    assert not _warnings(fresh)
    assert fresh.radio(key="learn.walk").value == "SPAD"
    assert fresh.get("progress")[0].proto.text == at.get("progress")[0].proto.text
    assert dict(fresh.query_params) == copied
    # A step the walkthrough does not have is said, and the first one shown.
    odd = open_link(LEARN, walk="spad", step="99")
    assert any("`99`" in w for w in _warnings(odd))
    assert odd.get("progress")[0].proto.text.startswith("Step 1 of")
    # The Playground's answer travels as input=, and a fresh browser walks the same one.
    x = OwnInput(
        task="qa",
        question="When did the ferry start?",
        passages=("The ferry began service in 1911.",),
        answer="The ferry started in 1912.",
    )
    own = open_link(PLAYGROUND, input=input_id(x))
    own.switch_page(LEARN).run()
    own.radio(key="learn.source").set_value("The Playground's analysed answer").run()
    no_exception(own)
    copied = dict(own.query_params)
    assert parse_input(copied["input"]) == x
    fresh = open_link(LEARN, **copied)
    assert not _warnings(fresh)
    assert fresh.radio(key="learn.source").value == "The Playground's analysed answer"
    assert "The answer the link carries" in str(fresh.radio(key="learn.source").proto)
    assert fresh.session_state[STATE_KEY].linked_answer.response == x.answer
    assert dict(fresh.query_params) == copied
