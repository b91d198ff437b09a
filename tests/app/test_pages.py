"""Every page renders on the tiny model (AppTest), and the Playground analyses answers."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import streamlit
from streamlit.testing.v1 import AppTest

from app.state.datasets import (
    DEMO_FULL_REF,
    KEY_DATASET,
    KEY_IMPORT,
    KEY_UPLOAD,
    KEY_UPLOAD_NAME,
)
from app.state.playground import (
    ANSWER_GENERATE,
    ANSWER_PASTE,
    INPUT_OWN,
    KEY_ADD_PASSAGE,
    KEY_ANALYSE,
    KEY_ANSWER_SOURCE,
    KEY_EXAMPLE,
    KEY_GENERATE,
    KEY_INPUT_MODE,
    KEY_MAX_TOKENS,
    KEY_OWN_QUESTION,
    KEY_PASTED,
    KEY_TEMPERATURE,
    passage_key,
    remove_passage_key,
)
from app.state.session import STATE_KEY
from core.storage import Store

PLAYGROUND = "views/playground.py"
HALLUCINATED_DEMO = "demo-02-waggle-dance"  # a built-in example with one gold span


def _markdown(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown) + "\n".join(c.value for c in at.caption)


def _heatmaps(at: AppTest) -> list[str]:
    return [h.value for h in at.html if 'class="rs-heatmap"' in h.value]


def _no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def test_home_shows_model_status_and_datasets(make_app: Callable[[], AppTest]) -> None:
    at = make_app().run()
    _no_exception(at)
    assert "tiny-random-llama (seed 0)" in _markdown(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Layers × heads"] == "2 × 4"
    assert metrics["KV heads"] == "2"
    assert metrics["d_model"] == "64"
    assert "random (seed 0)" in _markdown(at)  # where the weights came from
    picker = at.radio(key=KEY_DATASET)
    # no shared data, empty database: the demo set and the model's own built-in answers
    assert picker.options == [
        "Built-in demo examples",
        "Built-in demo, full: 72 hand-checked answers",
        "Built-in: the embedded model's own answers (unlabelled)",
    ]
    assert "**12** examples" in _markdown(at)
    picker.set_value(picker.options[1]).run()
    _no_exception(at)
    assert "**72** examples" in _markdown(at)
    picker.set_value(picker.options[2]).run()
    _no_exception(at)
    assert "**135** examples" in _markdown(at)


def test_a_fresh_session_opens_on_the_full_demo(
    make_app: Callable[[], AppTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``RAGSCOPE_HOME_DATASET`` (the tests pin the quick demo), Home opens on the
    72-answer demo, sized for every page and loop; the URL leaves that default out."""
    monkeypatch.delenv("RAGSCOPE_HOME_DATASET")
    at = make_app().run()
    _no_exception(at)
    assert at.radio(key=KEY_DATASET).value == DEMO_FULL_REF.key
    assert "**72** examples" in _markdown(at)
    assert "dataset" not in at.query_params
    at.switch_page("views/playground.py").run()
    _no_exception(at)
    assert len(at.selectbox(key=KEY_EXAMPLE).options) == 72


def test_home_says_which_detector_set_is_loaded(
    make_app: Callable[[], AppTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    at = make_app().run()  # RAGSCOPE_DETECTORS_DIR points at an empty folder
    _no_exception(at)
    assert "Detector set **custom** has no detectors trained for this model" in _markdown(at)
    sidebar = " ".join(c.value for c in at.sidebar.caption)
    assert "**Detectors:** custom set · 0 for this model" in sidebar
    monkeypatch.delenv("RAGSCOPE_DETECTORS_DIR")
    monkeypatch.setenv("RAGSCOPE_DETECTOR_SET", "no-such-set")
    at = make_app().run()
    _no_exception(at)
    errors = " ".join(e.value for e in at.error)
    assert "no detector set 'no-such-set'" in errors and "default" in errors
    assert "The default set is loaded instead" in errors
    # The shipped sets are for the embedded model, not the tiny one.
    assert "Detector set **default** has no detectors trained for this model" in _markdown(at)
    assert "`builtin`" in " ".join(c.value for c in at.caption)
    assert "judged by its expert" not in _markdown(at) and not at.warning  # none for tiny


def test_home_upload_lists_bad_records_and_imports_the_rest(
    make_app: Callable[[], AppTest], app_env: Path
) -> None:
    good = {"id": "u1", "question": "Who?", "passages": ["Ada built it."], "response": "Ada."}
    good2 = {"id": "u2", "question": "When?", "passages": ["In 1820."], "response": "1820."}
    bad = {"id": "u3", "question": "What?", "passages": ["Text."]}  # no response
    data = "\n".join(json.dumps(r) for r in (good, bad, good2)).encode()
    at = make_app().run()
    at.file_uploader(key=KEY_UPLOAD).set_value(("mini.jsonl", data, "application/jsonl")).run()
    _no_exception(at)
    errors = at.dataframe[0].value
    assert list(errors.columns) == ["record", "field", "reason"]
    assert len(errors) == 1
    assert errors.iloc[0]["record"] == "mini.jsonl:2"
    assert errors.iloc[0]["field"] == "response"
    assert at.text_input(key=KEY_UPLOAD_NAME).value == "mini"

    at.text_input(key=KEY_UPLOAD_NAME).set_value("my-set")
    at.button(key=KEY_IMPORT).click().run()
    _no_exception(at)
    assert any("Imported 2 examples" in s.value for s in at.success)
    assert at.session_state[STATE_KEY].dataset.name == "my-set"
    assert at.radio(key=KEY_DATASET).value.startswith("store:my-set")
    with Store(app_env) as store:
        assert [d.name for d in store.list_datasets()] == ["my-set"]
        assert [e.id for e in store.load_examples("my-set")] == ["u1", "u2"]

    # The Playground now draws from the imported set.
    at.switch_page(PLAYGROUND).run()
    _no_exception(at)
    assert at.selectbox(key=KEY_EXAMPLE).options[0].startswith("u1")


def test_home_upload_with_no_good_record_imports_nothing(
    make_app: Callable[[], AppTest], app_env: Path
) -> None:
    data = b'{"id": "u3", "passages": ["Text."]}\n{broken\n'  # no response; not JSON
    at = make_app().run()
    at.file_uploader(key=KEY_UPLOAD).set_value(("allbad.jsonl", data, "application/jsonl")).run()
    _no_exception(at)
    assert len(at.dataframe[0].value) == 2  # both bad records listed
    assert [w.value for w in at.warning] == [
        "No record of `allbad.jsonl` was good (2 read, all listed above); there is nothing to "
        "import. Fix the records and upload the file again."
    ]
    assert not [b for b in at.button if b.key == KEY_IMPORT]  # no import to press (or forge)
    with Store(app_env) as store:
        assert store.list_datasets() == []


def _analysed_playground(make_app: Callable[[], AppTest]) -> AppTest:
    at = make_app().run()
    at.switch_page(PLAYGROUND).run()
    _no_exception(at)
    at.selectbox(key=KEY_EXAMPLE).select(HALLUCINATED_DEMO).run()
    at.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_PASTE).run()
    assert at.text_area(key=KEY_PASTED).value.startswith("The duration of the waggle run")
    at.button(key=KEY_ANALYSE).click().run()
    _no_exception(at)
    return at


def test_playground_paste_and_analyse_shows_heatmap_and_segments(
    make_app: Callable[[], AppTest],
) -> None:
    at = _analysed_playground(make_app)
    assert not at.error
    maps = _heatmaps(at)
    assert len(maps) == 1
    heat = maps[0]
    assert heat.count('<span class="rs-tok') > 10
    assert 'class="rs-tok rs-gold"' in heat  # the gold span is marked
    assert "surprisal (bits)" in heat  # legend
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Mean surprisal"].endswith("bits")
    assert int(metrics["Answer tokens"]) > 10
    assert at.get("plotly_chart"), "the segment strip is missing"
    strip = " ".join(c.value for c in at.caption)
    for part in ("template", "instruction", "passage 1", "passage 2", "question", "answer"):
        assert f"{part}:" in strip
    table = at.dataframe[0].value
    assert {"position", "token", "segment", "surprisal_bits", "gold"} <= set(table.columns)
    assert (table["gold"] == "hallucinated").any()


def test_analysis_is_kept_across_reruns(make_app: Callable[[], AppTest]) -> None:
    at = _analysed_playground(make_app)
    first = at.session_state[STATE_KEY].analysis
    assert first is not None
    at.run()
    _no_exception(at)
    assert at.session_state[STATE_KEY].analysis is first
    assert len(_heatmaps(at)) == 1
    # Editing the answer marks the shown analysis as stale rather than dropping it.
    at.text_area(key=KEY_PASTED).set_value("The bees dance.").run()
    assert any("input changed" in i.value for i in at.info)
    assert len(_heatmaps(at)) == 1


def test_empty_answer_shows_an_error_not_an_exception(make_app: Callable[[], AppTest]) -> None:
    at = make_app().run()
    at.switch_page(PLAYGROUND).run()
    at.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_PASTE).run()
    at.text_area(key=KEY_PASTED).set_value("   ").run()
    at.button(key=KEY_ANALYSE).click().run()
    _no_exception(at)
    assert len(at.error) == 1
    assert "response is empty" in at.error[0].value
    assert not _heatmaps(at)


def test_own_example_generated_answer_is_analysed(make_app: Callable[[], AppTest]) -> None:
    at = make_app().run()
    at.switch_page(PLAYGROUND).run()
    at.radio(key=KEY_INPUT_MODE).set_value(INPUT_OWN).run()
    _no_exception(at)
    at.text_input(key=KEY_OWN_QUESTION).set_value("Who built the bridge?")
    at.text_area(key=passage_key(0)).set_value("Ada Lovell built the bridge in 1820.")
    at.button(key=KEY_ADD_PASSAGE).click().run()
    at.text_area(key=passage_key(1)).set_value("The bridge is made of grey limestone.")
    at.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_GENERATE).run()
    at.number_input(key=KEY_MAX_TOKENS).set_value(6)
    # The random tiny model writes only newlines when greedy; sampling (seed 0) gives words.
    at.slider(key=KEY_TEMPERATURE).set_value(1.0)
    at.button(key=KEY_GENERATE).click().run()
    _no_exception(at)
    assert not at.error, [e.value for e in at.error]
    generated = at.session_state[STATE_KEY].generation
    assert generated is not None and len(generated.token_ids) <= 6
    at.button(key=KEY_ANALYSE).click().run()
    _no_exception(at)
    assert not at.error, [e.value for e in at.error]
    heat = _heatmaps(at)[0]
    assert heat.count('<span class="rs-tok') == len(generated.token_ids)
    assert "rs-gold" not in heat.split("</style>", 1)[1]  # no gold labels for own answers
    strip = " ".join(c.value for c in at.caption)
    assert "passage 2:" in strip


def _long_own_input(at: AppTest, words: int) -> AppTest:
    """The visitor's own question, one long pasted passage and a pasted answer."""
    at.switch_page(PLAYGROUND).run()
    at.radio(key=KEY_INPUT_MODE).set_value(INPUT_OWN).run()
    at.text_input(key=KEY_OWN_QUESTION).set_value("Who built the bridge?")
    passage = " ".join(["Ada Lovell built the stone bridge over the river in 1820."] * words)
    at.text_area(key=passage_key(0)).set_value(passage)
    at.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_PASTE).run()
    at.text_area(key=KEY_PASTED).input("Ada Lovell built it in 1820.").run()
    return at


def _memory_captions(at: AppTest) -> list[str]:
    return [c.value for c in at.caption if c.value.startswith("Memory:")]


def test_a_long_pasted_prompt_is_estimated_then_refused_over_the_budget(
    with_demo_detectors: Path, make_app: Callable[[], AppTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 68: a visitor's long prompt (about 1,500 tokens, traced in chunks) is
    estimated before the click; over the memory budget it is refused with the reason and
    the fix, and the page (the server) goes on; within it, it is analysed."""
    at = _long_own_input(make_app().run(), 90)
    _no_exception(at)
    (said,) = _memory_captions(at)  # a long input: its memory before the click
    assert "of the" in said and "budget" in said and "-token input" in said
    monkeypatch.setenv("RAGSCOPE_MEMORY_BUDGET", "10M")  # less than the process holds
    at.run()
    (said,) = _memory_captions(at)
    assert "it will be refused" in said and "RAGSCOPE_MEMORY_BUDGET" in said
    at.button(key=KEY_ANALYSE).click().run()
    _no_exception(at)
    assert len(at.error) == 1 and "over the memory budget" in at.error[0].value
    assert "tokens" in at.error[0].value and "--set fast" in at.error[0].value
    monkeypatch.delenv("RAGSCOPE_MEMORY_BUDGET")
    at.button(key=KEY_ANALYSE).click().run()  # the same page, the default budget: judged
    _no_exception(at)
    assert not at.error, [e.value for e in at.error]
    assert at.session_state[STATE_KEY].analysis is not None


def test_unloadable_model_shows_the_fix_not_an_exception(
    make_app: Callable[[], AppTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGSCOPE_MODEL", "no-such-org/no-such-model")
    at = make_app().run()
    _no_exception(at)
    assert len(at.error) == 1
    message = at.error[0].value
    assert "could not be loaded" in message
    assert "RAGSCOPE_ALLOW_DOWNLOAD" in message  # core's message names the fix
    # Home drew what needs no model (its title, the dataset choice), then stopped.
    assert [t.value for t in at.title] == ["ragscope"]
    assert "Model" not in [h.value for h in at.subheader]
    # A failed load is not cached: the next rerun tries again (and fails the same way).
    at.run()
    _no_exception(at)
    assert len(at.error) == 1


def test_own_passages_can_be_added_and_removed(make_app: Callable[[], AppTest]) -> None:
    at = make_app().run()
    at.switch_page(PLAYGROUND).run()
    at.radio(key=KEY_INPUT_MODE).set_value(INPUT_OWN).run()
    assert at.button(key=remove_passage_key(0)).disabled  # the last passage stays
    at.text_area(key=passage_key(0)).set_value("First passage.")
    at.button(key=KEY_ADD_PASSAGE).click().run()
    at.text_area(key=passage_key(1)).set_value("Second passage.")
    at.button(key=remove_passage_key(0)).click().run()
    _no_exception(at)
    areas = {a.key: a.value for a in at.text_area if a.key.startswith("playground.own.passage.")}
    assert areas == {passage_key(1): "Second passage."}
    assert at.text_area(key=passage_key(1)).label == "Passage 1"


def _registered_pages() -> list[str]:
    main = (Path(__file__).resolve().parents[2] / "app" / "main.py").read_text()
    pages = sorted(set(re.findall(r'_page\("(\w+\.py)"', main)))
    assert len(pages) >= 14, "app/main.py registers its pages as _page(FILE, TITLE, ICON)"
    return pages


@pytest.mark.parametrize("page", _registered_pages())
def test_every_page_opens_without_artifacts(page: str, open_page: Callable[[str], AppTest]) -> None:
    # open_page fails on any exception or st.error; the views folder holds no stray page.
    open_page(f"views/{page}")
    views = Path(__file__).resolve().parents[2] / "app" / "views"
    assert {p.name for p in views.glob("*.py")} - {"__init__.py"} == set(_registered_pages())


@pytest.mark.parametrize("page", ["views/token_heatmaps.py", "views/counterfactual.py"])
def test_answer_pages_read_the_playgrounds_answer(
    page: str, open_after_analysis: Callable[[str, str], AppTest]
) -> None:
    at = open_after_analysis("demo-02-waggle-dance", page)
    assert any("The Playground's analysed answer" in str(r.options) for r in at.radio)


def test_no_page_asks_google_for_its_icon(
    make_app: Callable[[], AppTest], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Streamlit's browser code fetches a `:material/NAME:` tab icon from fonts.gstatic.com,
    # and takes the page's own icon (Material here) when the page config names none:
    # every run must name a local image, so no request leaves the machine.
    icons: list[object] = []
    real = streamlit.set_page_config

    def record(*args: Any, **kwargs: Any) -> None:
        icons.append(kwargs.get("page_icon", args[1] if len(args) > 1 else None))
        real(*args, **kwargs)

    monkeypatch.setattr(streamlit, "set_page_config", record)
    at = make_app().run()
    at.switch_page(PLAYGROUND).run()
    _no_exception(at)
    assert len(icons) == 2, icons  # one per run
    assets = Path(__file__).resolve().parents[2] / "assets"
    for icon in icons:
        assert isinstance(icon, Path) and icon.parent == assets and icon.suffix == ".png", icon
        assert icon.read_bytes().startswith(b"\x89PNG")
    # Nothing in the app names a remote icon or font either.
    app = Path(__file__).resolve().parents[2] / "app"
    for script in app.rglob("*.py"):
        text = script.read_text()
        assert 'page_icon=":material' not in text, script
        assert not re.search(r"//[\w.]*(googleapis|gstatic)\.com", text), script


def test_no_page_script_holds_a_stray_string_that_streamlit_magic_would_print() -> None:
    # Streamlit "magic" writes every bare module-level expression of a page script to
    # the page: a string meant as a comment (say, a docstring after a constant) shows
    # up as text. Only the module docstring (the first statement) is allowed.
    app = Path(__file__).resolve().parents[2] / "app"
    for script in [app / "main.py", *sorted((app / "views").glob("*.py"))]:
        body = ast.parse(script.read_text()).body
        for node in body[1:]:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                raise AssertionError(
                    f"{script.name}:{node.lineno}: a bare string, shown on the page"
                )
