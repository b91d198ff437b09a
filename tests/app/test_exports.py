"""Figure and table exports (app/components/exports.py): every page's figures go through
``plot``, which adds SVG and PNG downloads rendered by Kaleido on the server."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from app.components import exports
from app.components.exports import NO_BROWSER, export_browser, figure_bytes, file_stem

APP = Path(__file__).resolve().parents[2] / "app"


def _need_browser() -> None:
    if export_browser() is not None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("Chromium missing: install the Debian package chromium")
    pytest.skip("no Chromium to render figures with")


def test_no_page_shows_a_figure_without_its_exports() -> None:
    direct = [
        f"{p.relative_to(APP)}:{i}"
        for p in sorted(APP.rglob("*.py"))
        if p.name != "exports.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "plotly_chart(" in line
    ]
    assert direct == [], "show figures with app.components.exports.plot"


def test_tables_offer_no_csv_export_that_skips_formula_neutralising() -> None:
    # Streamlit's own table download writes "=HYPERLINK(...)" as it is; the app's CSV
    # buttons go through core.review.export.safe_csv instead (tests/unit/test_review.py).
    config = tomllib.loads((APP.parent / ".streamlit" / "config.toml").read_text())
    assert config["client"]["disableDataExport"] is True


def test_figures_render_to_svg_and_png() -> None:
    _need_browser()
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 2]), layout={"title": "Exported title"})
    svg = figure_bytes(fig, "svg")
    assert svg.startswith(b"<svg") and b"Exported title" in svg
    png = figure_bytes(fig, "png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width = int.from_bytes(png[16:20], "big")
    assert width == 700 * exports.PNG_SCALE  # plotly's default width, at the export scale


def test_without_a_browser_the_buttons_say_what_to_install(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    assert export_browser() is None
    with pytest.raises(RuntimeError, match="apt-get install chromium"):
        figure_bytes(go.Figure(), "svg")

    def page() -> None:
        import plotly.graph_objects as go

        from app.components.exports import plot

        plot(go.Figure(go.Bar(x=[1], y=[1])), key="test.fig")

    at = AppTest.from_function(page).run()
    assert not at.exception
    buttons = at.get("download_button")
    assert [b.proto.label for b in buttons] == ["SVG", "PNG"]
    assert all(b.proto.disabled for b in buttons)
    assert all(NO_BROWSER.split(":")[0] in b.proto.help for b in buttons)


def test_a_page_offers_both_files_for_every_figure(monkeypatch) -> None:
    monkeypatch.setenv("BROWSER_PATH", "/bin/true")  # any executable: nothing renders here

    def page() -> None:
        import plotly.graph_objects as go
        import streamlit as st

        from app.components.exports import plot

        plot(go.Figure(), key="one")
        left, right = st.columns(2)
        plot(go.Figure(), key="two", where=left)
        plot(go.Figure(), key="three", where=right, exports=False)

    at = AppTest.from_function(page).run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 3
    buttons = at.get("download_button")
    assert [b.proto.label for b in buttons] == ["SVG", "PNG", "SVG", "PNG"]
    assert not any(b.proto.disabled for b in buttons)


def test_file_names_come_from_the_key() -> None:
    assert file_stem("benchmark.cv.roc") == "benchmark.cv.roc"
    assert file_stem("learn.pks.top.before the FFN") == "learn.pks.top.before_the_FFN"
    assert file_stem("../../etc/passwd") == "etc_passwd"
    assert file_stem("...") == "figure"
