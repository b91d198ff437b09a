"""The app private by default and team-ready (AppTest, tiny model): the login gate
when logins are configured, reviews recorded under the signed-in identity, the store
that never overwrites a dataset unasked, stale review items, uploads with hostile
names, and untrusted text that stays text."""

from __future__ import annotations

import re
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import app.state.heads as state_heads
from app.state.review import DETECTOR_SPANS
from core.review import Flag, ReviewBook
from core.storage import Store

REVIEW = "views/review.py"
KEY = "corpus"


def test_with_logins_configured_a_visitor_sees_only_the_login(
    make_app: Callable[[], AppTest], app_env: Path, with_login: Callable[..., AppTest]
) -> None:
    at = with_login(make_app(), {"is_logged_in": False}).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.button(key="auth.login").label == "Log in"
    assert [t.value for t in at.title] == ["ragscope"]
    assert not at.subheader and not at.metric  # no model, no dataset, no page
    for page in (REVIEW, "views/playground.py"):  # a deep link is gated too
        at.switch_page(page).run()
        assert at.button(key="auth.login") is not None and not at.text_input


def test_signed_in_reviews_are_recorded_under_the_identity(
    make_app: Callable[[], AppTest],
    app_env: Path,
    with_demo_detectors: Path,
    with_login: Callable[..., AppTest],
) -> None:
    user = {
        "is_logged_in": True,
        "email": "alice@example.com",
        "email_verified": True,
        "name": "Alice",
    }
    at = with_login(make_app(), user).run()
    assert not at.exception

    def identity_shown(at: AppTest) -> None:
        assert not [t for t in at.text_input if t.key == "review.name"]  # nobody types a name
        assert not [b for b in at.button if b.key == "review.change_name"]
        text = "\n".join(c.value for c in at.caption)
        assert "Reviewing as **Alice** (`alice@example.com`), signed in." in text

    assert _reviewer_after_one_decision(at, app_env, identity_shown) == {"alice@example.com"}


def _reviewer_after_one_decision(
    at: AppTest, app_env: Path, check_page: Callable[[AppTest], None] = lambda at: None
) -> set[str]:
    """Opens Review, accepts the first flag, and returns who the decision is recorded under."""
    at.switch_page(REVIEW).run()
    assert not at.exception, [e.value for e in at.exception]
    check_page(at)
    at.selectbox(key="review.dataset").set_value(KEY).run()  # Review opens on Home's
    at.radio(key="review.span_source").set_value(DETECTOR_SPANS).run()
    at.number_input(key="review.limit").set_value(4)
    for t in at.number_input:
        if t.key and t.key.startswith("review.threshold."):
            t.set_value(0.05)
    at.button(key="review.build").click().run()
    at.button(key="review.accept").click().run()
    assert not at.exception, [e.value for e in at.exception]
    with Store(app_env) as s:
        return {r.reviewer for i in ReviewBook(s).items(KEY) for r in i.reviews}


@pytest.mark.parametrize(
    ("claims", "recorded"),
    [
        # An e-mail address the provider did not verify is not the user's identity.
        (
            {"email": "alice@example.com", "sub": "m-1", "iss": "https://idp.example"},
            "sub:m-1@idp.example",
        ),
        (
            {"email": "alice@example.com", "email_verified": False, "sub": "m-1"},
            "sub:m-1",
        ),
        # A subject that looks like an address is a subject.
        (
            {"sub": "alice@example.com", "iss": "https://idp.example"},
            "sub:alice@example.com@idp.example",
        ),
    ],
)
def test_only_a_verified_email_is_taken_as_the_identity(
    make_app: Callable[[], AppTest],
    app_env: Path,
    with_demo_detectors: Path,
    claims: dict,
    recorded: str,
    with_login: Callable[..., AppTest],
) -> None:
    user = {"is_logged_in": True, "name": "Mallory", **claims}
    at = with_login(make_app(), user).run()
    assert not at.exception, [e.value for e in at.exception]
    assert f"(`{recorded}`)" in "\n".join(c.value for c in at.sidebar.caption)
    assert _reviewer_after_one_decision(at, app_env) == {recorded}


def _signed_in(at: AppTest) -> bool:
    return bool([b for b in at.sidebar.button if b.key == "auth.logout"])


def test_logging_out_revokes_the_session_server_side(
    make_app: Callable[[], AppTest], app_env: Path, with_login: Callable[..., AppTest]
) -> None:
    issued = int(time.time()) - 60
    user = {
        "is_logged_in": True,
        "email": "alice@example.com",
        "email_verified": True,
        "iat": issued,
    }
    at = with_login(make_app(), user).run()
    assert _signed_in(at)
    at.sidebar.button(key="auth.logout").click().run()
    assert not at.exception, [e.value for e in at.exception]
    with Store(app_env) as s:
        assert s.logins_revoked_at("alice@example.com") >= issued
    # A copy of the old cookie, in a new browser session: refused, asked to log in again.
    again = with_login(make_app(), dict(user)).run()
    assert not again.exception, [e.value for e in again.exception]
    assert not _signed_in(again) and again.button(key="auth.login").label == "Log in"
    assert any("you logged out of this session" in e.value for e in again.error)
    assert not again.subheader and not again.metric  # nothing of the app
    # Logging in again issues a new token: signed in.
    fresh = with_login(make_app(), {**user, "iat": int(time.time()) + 1}).run()
    assert _signed_in(fresh) and not fresh.error


def test_an_old_or_plain_http_login_is_refused(
    make_app: Callable[[], AppTest],
    app_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    with_login: Callable[..., AppTest],
) -> None:
    user = {"is_logged_in": True, "email": "a@example.com", "email_verified": True}
    old = with_login(make_app(), {**user, "iat": time.time() - 25 * 3600}).run()
    assert not _signed_in(old) and any("expired" in e.value for e in old.error)
    monkeypatch.setenv("RAGSCOPE_SESSION_HOURS", "48")
    assert _signed_in(with_login(make_app(), {**user, "iat": time.time() - 25 * 3600}).run())
    at = with_login(
        make_app(),
        {**user, "iat": time.time()},
        redirect_uri="http://team.example:8501/oauth2callback",
    ).run()
    assert not at.exception and not _signed_in(at)
    assert any("not https" in e.value and "docs/deployment.md" in e.value for e in at.error)
    assert not [b for b in at.button if b.key == "auth.login"]  # logging in would not help


def _queued(app_env: Path) -> list:
    from core.data import load_builtin

    examples = load_builtin()[:3]
    with Store(app_env) as s:
        ReviewBook(s).add_flags(
            KEY,
            examples,
            [
                Flag(example_id=e.id, start=0, end=3, sources={"cortex": (0.9, 0.5)})
                for e in examples
            ],
        )
    return examples


def test_store_as_dataset_never_overwrites_unasked(
    make_app: Callable[[], AppTest], app_env: Path
) -> None:
    examples = _queued(app_env)
    with Store(app_env) as s:
        ReviewBook(s).save_review(ReviewBook(s).items(KEY)[0].id, "ann", "accept")
        s.import_dataset("precious", examples[:1], source="mine", fmt="ragscope")
    at = make_app().run()
    at.switch_page(REVIEW).run()
    at.text_input(key="review.name").input("ann")
    at.button(key="review.start").click().run()
    at.selectbox(key="review.dataset").set_value(KEY).run()  # Review opens on Home's
    at.text_input(key="review.export.name").input("precious").run()
    assert at.button(key="review.export.save").disabled
    at.checkbox(key="review.export.replace").check().run()
    assert not at.button(key="review.export.save").disabled
    at.button(key="review.export.save").click().run()
    assert not at.error, [e.value for e in at.error]
    with Store(app_env) as s:
        assert s.list_datasets()[0].source == "review of Built-in labelled corpus"


def test_a_stale_item_is_marked_and_cannot_be_decided(
    make_app: Callable[[], AppTest], app_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    examples = _queued(app_env)
    changed = {examples[0].id: examples[0].with_response(examples[0].response.upper())}
    # the page reads the corpus through app.state.heads each run
    real = state_heads.heads_examples

    def corpus_now(*a, **kw):
        got = real(*a, **kw)
        return (*got[:2], [changed.get(e.id, e) for e in got[2]], *got[3:])

    monkeypatch.setattr(state_heads, "heads_examples", corpus_now)
    at = make_app().run()
    at.switch_page(REVIEW).run()
    at.text_input(key="review.name").input("ann")
    at.button(key="review.start").click().run()
    at.selectbox(key="review.dataset").set_value(KEY).run()  # Review opens on Home's
    assert not at.exception, [e.value for e in at.exception]
    table = next(d.value for d in at.dataframe if "status" in d.value.columns)
    assert list(table["status"]).count("stale") == 1
    assert any("Stale:" in w.value for w in at.warning)
    assert not [b for b in at.button if b.key == "review.accept"]


@pytest.mark.parametrize(
    "name", ["../../etc/passwd.jsonl", "..", "x" * 500 + ".csv.jsonl", "C:\\evil\\d.jsonl"]
)
def test_a_hostile_upload_lists_its_bad_records_and_nothing_escapes(
    make_app: Callable[[], AppTest], app_env: Path, tmp_path: Path, name: str
) -> None:
    import json

    lines = [
        json.dumps({"id": "u1", "question": "Q?", "passages": ["P."], "response": "A."}),
        '{"id": "deep", "passages": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"id": ' + "9" * 5000 + "}",
        json.dumps({"id": "sur", "question": "Q?", "passages": ["P."], "response": "\ud800"}),
        '{"id": "cut", "passages": ["P',
    ]
    data = "\n".join(lines).encode() + b"\n\xff\xfe not utf-8\n"
    at = make_app().run()
    at.file_uploader(key="home.upload").set_value((name, data, "application/jsonl")).run()
    assert not at.exception, [e.value for e in at.exception]
    if name == "..":  # no .jsonl / .csv: said, not raised
        assert "ragscope reads .jsonl and .csv files" in at.error[0].value
        return
    assert not at.error, [e.value for e in at.error]
    errors = at.dataframe[0].value
    assert len(errors) == 5, errors
    assert all(":" in r for r in errors["record"])  # each located (name:line[:column])
    assert not any("/" in r.split(":")[0] or "\\" in r.split(":")[0] for r in errors["record"])
    assert at.button(key="home.import").label == "Import 1 example"  # not "1 examples"
    assert not (tmp_path.parent / "passwd.jsonl").exists()


EVIL = "http://evil.example/x"
ATTACK = f"![pixel]({EVIL}.png) [click]({EVIL}) :red[red] $x$ <b>bold</b>"
PAGES = [
    "views/playground.py",
    "views/token_heatmaps.py",
    "views/counterfactual.py",
    "views/mitigation.py",
    "views/heads.py",
    "views/shap_summary.py",
    "views/token_sources.py",
    "views/gam.py",
    "views/feature_explanations.py",
    "views/benchmark.py",
    "views/agreement.py",
    "views/review.py",
    "views/learn.py",
]
UNESCAPED = re.compile(
    r"(?<!\\)!\[|(?<!\\)\[click|(?<!\\):red\[|(?<!\\)\$x|(?<!\\)<b>"
    # a bare URL Streamlit would link even when escaped (app.text breaks it with U+2060)
    r"|https?\\?:(?!\u2060)//"
)


def _rendered_markdown(at: AppTest) -> list[str]:
    """Every string the page hands Streamlit to render as Markdown."""
    out = [
        el.value
        for kind in (
            "markdown",
            "caption",
            "info",
            "warning",
            "error",
            "success",
            "title",
            "subheader",
            "header",
        )
        for el in getattr(at, kind)
    ]
    out += [e.label for e in at.expander] + [b.label for b in at.button]
    out += [str(o) for r in at.radio for o in r.options] + [m.label for m in at.metric]
    return [str(x) for x in out]


def test_untrusted_text_is_never_markup_on_any_page(
    make_app: Callable[[], AppTest], app_env: Path
) -> None:
    from app.state.datasets import KEY_DATASET
    from app.state.playground import ANSWER_PASTE, KEY_ANALYSE, KEY_ANSWER_SOURCE
    from core.base.examples import RAGExample, Span

    answer = f"It is tall. {ATTACK}"
    hostile = RAGExample(
        id=f"id {ATTACK}",
        question=f"# Heading {ATTACK}",
        passages=(f"> quote {ATTACK}", "- list item"),
        response=answer,
        spans=(Span(start=12, end=len(answer), type=ATTACK, note=ATTACK),),
    )
    with Store(app_env) as s:
        s.import_dataset(f"set {ATTACK}", [hostile], source=ATTACK, fmt="ragscope")
    at = make_app().run()
    picker = at.radio(key=KEY_DATASET)
    picker.set_value(next(o for o in picker.options if "set" in o)).run()
    seen: dict[str, list[str]] = {"home": _rendered_markdown(at)}
    at.switch_page("views/playground.py").run()
    at.radio(key=KEY_ANSWER_SOURCE).set_value(ANSWER_PASTE).run()
    at.button(key=KEY_ANALYSE).click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Heading" in m for m in _rendered_markdown(at)), "the hostile example is not shown"
    for page in PAGES:
        at.switch_page(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])
        seen[page] = _rendered_markdown(at)
    code_spans = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)")  # inline code shows text as is
    bad = {
        p: [t for t in texts if UNESCAPED.search(code_spans.sub("", t))]
        for p, texts in seen.items()
    }
    assert len(seen) == len(PAGES) + 1
    assert not any(bad.values()), {p: b for p, b in bad.items() if b}


def test_the_benchmark_reads_a_stored_dataset_by_name_never_the_file_it_names(
    make_app: Callable[[], AppTest], app_env: Path, tmp_path: Path
) -> None:
    from app.state.runs import KEY_BENCH_TRAIN
    from core.data import builtin_examples

    marker = "TOP-SECRET-FIRST-LINE"
    secret = tmp_path / "srv" / "x.csv"
    secret.parent.mkdir()
    secret.write_text(f"{marker},passages,response\n" + "q,p,r\n" * 30)
    with Store(app_env) as s:
        s.import_dataset(str(secret), builtin_examples()[:5], source="up", fmt="ragscope")
    at = make_app().run()
    at.switch_page("views/benchmark.py").run()
    picker = at.selectbox(key=KEY_BENCH_TRAIN)
    assert str(secret) not in picker.options  # a name is offered as stored:NAME only
    picker.set_value(f"stored:{secret}").run()
    assert not at.exception, [e.value for e in at.exception]
    shown = "\n".join(c.value for c in at.caption) + "\n".join(e.value for e in at.error)
    assert "5 examples:" in shown and marker not in shown


def test_visitors_see_no_traceback_or_server_path() -> None:
    """An uncaught exception shows its type only: a traceback names server paths."""
    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / ".streamlit" / "config.toml").read_text())
    assert config["client"]["showErrorDetails"] == "type"
    assert config["server"]["address"] == "localhost"
    assert config["server"]["enableStaticServing"] is False
