"""The README reads as a newcomer's page and the docs hold together (issue 39, point 9):
the two set-up commands first, a short page whose links and pictures exist, and
``assets/runs/`` holding only the runs that back a shipped artifact or a number the docs
quote (and every run the docs quote is there)."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
RUNS = ROOT / "assets" / "runs"
MAX_README_LINES = 300

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CITED_RUN = re.compile(r"assets/runs/([A-Za-z0-9_.*+/-]+?)(?:\.\.\.|…|\.md|\.json)?(?=[`)\s,;]|$)")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_anchor(m) for m in re.findall(r"^#+ (.+)$", _text(path), flags=re.M)}


def test_the_readme_opens_with_the_two_set_up_commands_and_stays_short() -> None:
    text = _text(README)
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md is {len(lines)} lines; long material belongs in docs/ (at most "
        f"{MAX_README_LINES})"
    )
    before_sections = text.split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", before_sections, flags=re.S)
    assert len(blocks) == 1, "one set-up block before the first section"
    commands = [ln.split("#", 1)[0].strip() for ln in blocks[0].splitlines()]
    assert [c for c in commands if c] == ["make app", "make test"]
    assert "## Your first ten minutes" in text
    assert "## Tour" in text


def test_the_tour_shows_screenshots_that_exist() -> None:
    tour = _text(README).split("## Tour", 1)[1].split("\n## ", 1)[0]
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", tour)
    assert len(pictures) >= 3
    for picture in pictures:
        assert (ROOT / picture).is_file(), picture


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(_text(page)):
        if re.match(r"[a-z]+:", target):
            continue  # an outside address: not followed here
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no such heading in {dest.name})")
    assert not broken, f"{page.name}: {broken}"


def _runs_recorded(node: object) -> Iterator[str]:
    """Every ``"run": NAME`` in a parsed ``cfg.json``, however deep."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "run" and isinstance(value, str):
                yield value
            yield from _runs_recorded(value)
    elif isinstance(node, list):
        for value in node:
            yield from _runs_recorded(value)


def _citations() -> set[str]:
    """Every run named by the docs (a name, a name cut short with an ellipsis, or a
    glob) or recorded by a shipped artifact's ``cfg.json``."""
    cited: set[str] = set()
    for page in [README, *DOCS]:
        cited.update(CITED_RUN.findall(_text(page)))
    for cfg in (ROOT / "assets").rglob("cfg.json"):
        cited.update(_runs_recorded(json.loads(_text(cfg))))
    return {c.rstrip("-.") for c in cited}


def _matches(citation: str, stem: str) -> bool:
    if any(ch in citation for ch in "*?["):
        return fnmatch.fnmatch(stem, citation)
    return stem == citation or stem.startswith(citation)


def _run_stems() -> set[str]:
    return {
        str(p.relative_to(RUNS).with_suffix(""))
        for p in RUNS.rglob("*")
        if p.is_file() and p.suffix in {".md", ".json"}
    }


def test_every_shipped_run_backs_an_artifact_or_a_quoted_number() -> None:
    cited = _citations()
    uncited = sorted(s for s in _run_stems() if not any(_matches(c, s) for c in cited))
    assert not uncited, (
        f"runs nobody quotes: {uncited}; cite them in docs/ or remove them from assets/runs"
    )


def test_every_run_the_docs_quote_is_shipped() -> None:
    stems = _run_stems()
    missing = sorted(c for c in _citations() if not any(_matches(c, s) for s in stems))
    assert not missing, f"quoted but not in assets/runs: {missing}"


def test_an_uncited_run_and_a_missing_one_would_be_found() -> None:
    """The matching the two tests above rely on tells a cited run from another."""
    assert _matches("20261128-1247*-review-curve-*", "20261128-124714-review-curve-dolly")
    assert not _matches("20261128-1247*-review-curve-*", "20261128-124714-cv5-dolly")
    assert _matches("20261126-081005-cv5-", "20261126-081005-cv5-builtin+ragtruth_qa_dev")
    assert not _matches("20261126-081005-cv5-", "20261126-081006-cv5-builtin")
    found = CITED_RUN.findall("see `assets/runs/20261126-054158-cv5-…` and (assets/runs/x.md)")
    assert found == ["20261126-054158-cv5-", "x"]
