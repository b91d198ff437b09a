"""Team mode in a real browser: Streamlit's OpenID Connect login against a local test
provider (``oidc-provider-mock`` on 127.0.0.1), the tiny model.

A visitor who has not signed in sees only the login, on every page (deep links too);
after signing in through the provider's form the Review page records a decision
under the signed-in identity, with no name to type. The same server shows a stored
dataset whose name and texts are Markdown attacks: nothing of them becomes an image,
a link or a heading.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from core.base.examples import RAGExample
from core.review import Flag, ReviewBook
from core.storage import Store

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
LOG = REPO / "test-artifacts" / "streamlit-login.log"
LOAD_MS = 120_000
USER = "alice@example.com"
EVIL = "http://127.0.0.1:9/evil"
ATTACK = f"![pixel]({EVIL}.png) [click]({EVIL}) <img src={EVIL}.gif> $x$ :red[red]"


@pytest.fixture(scope="module")
def oidc() -> str:
    """A local OpenID Connect provider; its issuer URL."""
    import oidc_provider_mock

    with oidc_provider_mock.run_server_in_thread() as srv:
        url = f"http://localhost:{srv.server_port}"
        r = httpx.put(
            f"{url}/users/{quote(USER)}",
            json={"email": USER, "email_verified": True, "name": "Alice"},
        )
        assert r.status_code == 204
        yield url


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database with a review queue on the built-in corpus and a hostile dataset."""
    from core.data import load_builtin

    path = tmp_path_factory.mktemp("login-db") / "ragscope.sqlite3"
    examples = load_builtin()[:2]
    hostile = RAGExample(
        id="evil-1",
        question=f"# Heading? {ATTACK}",
        passages=(f"> quote {ATTACK}",),
        response=f"- list {ATTACK}",
    )
    with Store(path) as s:
        flags = [
            Flag(example_id=e.id, start=0, end=3, sources={"cortex": (0.9, 0.5)}) for e in examples
        ]
        ReviewBook(s).add_flags("corpus", examples, flags)
        s.import_dataset(f"[x]({EVIL}) ![y]({EVIL}.png)", [hostile], source=ATTACK, fmt="ragscope")
    return path


@pytest.fixture(scope="module")
def app_url(oidc: str, db: Path, tmp_path_factory, launch_streamlit, free_port):
    port = free_port()
    secrets = tmp_path_factory.mktemp("secrets") / "secrets.toml"
    auth = {
        "redirect_uri": f"http://127.0.0.1:{port}/oauth2callback",
        "cookie_secret": "a-long-random-cookie-secret-for-the-test-only",
        "client_id": "ragscope",
        "client_secret": "test-secret",
        "server_metadata_url": f"{oidc}/.well-known/openid-configuration",
    }
    secrets.write_text("[auth]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in auth.items()))
    env = {
        "RAGSCOPE_MODEL": "tiny",
        "RAGSCOPE_DEVICE": "cpu",
        "RAGSCOPE_DB": str(db),
        "RAGSCOPE_DETECTORS_DIR": str(tmp_path_factory.mktemp("no-detectors")),
        "RAGSCOPE_SHARED_DATA": str(tmp_path_factory.mktemp("no-shared")),
    }
    with launch_streamlit(env, LOG, port=port, extra=["--secrets.files", str(secrets)]) as url:
        yield url


def _no_attack_rendered(page) -> None:
    """Nothing of :data:`ATTACK` became markup: no image, link or heading to it."""
    imgs = page.eval_on_selector_all("img", "els => els.map(e => e.getAttribute('src') || '')")
    links = page.eval_on_selector_all("a", "els => els.map(e => e.getAttribute('href') || '')")
    hits = [u for u in imgs + links if "evil" in u]
    if hits:  # keep where they sit, for the log
        where = page.eval_on_selector_all(
            "a[href*=evil], img[src*=evil]",
            "els => els.map(e => (e.closest('[data-testid]') || e.parentElement).outerHTML.slice(0, 2000))",
        )
        LOG.with_name("attack-rendered.html").write_text("\n\n".join(where))
    assert not hits, (imgs, links)
    heads = page.locator("h1, h2, h3, h4").all_inner_texts()
    assert not [h for h in heads if "Heading?" in h or "pixel" in h], heads


def test_login_gates_every_page_and_reviews_carry_the_identity(app_url, db, open_chromium):
    with open_chromium() as browser:
        stranger = browser.new_page()
        for path in ("", "review", "playground"):
            stranger.goto(f"{app_url}/{path}", wait_until="domcontentloaded")
            stranger.get_by_role("button", name="Log in").wait_for(timeout=LOAD_MS)
            body = stranger.locator("body").inner_text()
            assert "Reviewing as" not in body and "Model" not in body
            assert not stranger.get_by_role("heading", name="Review flagged spans").count()
        stranger.screenshot(path=str(LOG.with_name("login.png")))
        stranger.close()

        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(app_url, wait_until="domcontentloaded")
        page.get_by_role("button", name="Log in").click(timeout=LOAD_MS)
        page.get_by_placeholder("sub").wait_for(timeout=30_000)  # the provider's form
        page.get_by_placeholder("sub").fill(USER)
        page.get_by_role("button", name="Authorize").click()
        page.get_by_text("Signed in as").wait_for(timeout=LOAD_MS)
        page.get_by_role("heading", name="Model").wait_for(timeout=LOAD_MS)
        # Home lists the hostile dataset by name (its bare URLs must not become links)
        page.get_by_text(re.compile(r"^Imported\W+\[x\]")).first.wait_for(timeout=LOAD_MS)
        _no_attack_rendered(page)

        page.goto(
            f"{app_url}/review?dataset=builtin", wait_until="domcontentloaded"
        )  # the corpus's queue
        page.get_by_text(re.compile(r"Reviewing as Alice")).wait_for(timeout=LOAD_MS)
        assert not page.get_by_label("Your name").count()
        page.get_by_role("button", name="Accept").click()
        page.get_by_text(re.compile(r"Item \d+ accepted")).wait_for(timeout=30_000)
        page.screenshot(path=str(LOG.with_name("review-signed-in.png")))

        # the hostile dataset on the Review page: its texts stay text
        page.locator('[data-testid="stSelectbox"]').first.click()
        page.keyboard.type("Imported")
        page.screenshot(path=str(LOG.with_name("review-pick-dataset.png")))
        page.keyboard.press("Enter")
        page.get_by_text("The queue of flagged spans of this dataset is empty").wait_for(
            timeout=30_000
        )
        _no_attack_rendered(page)
        page.close()

    with Store(db) as s:
        reviews = [r for i in ReviewBook(s).items("corpus") for r in i.reviews]
    assert [r.reviewer for r in reviews] == [USER]
