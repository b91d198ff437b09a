"""The README's Python example runs as written on the embedded model with the shipped
default set (docs/judge.md's longer one has its own test)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

import core.engine.model
from core.engine.model import LoadedModel
from core.pipeline.judge import AnswerVerdict

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_python_example_judges_an_answer(
    embedded_model: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1, "the README should hold exactly one Python example"
    for var in ("RAGSCOPE_DETECTORS_DIR", "RAGSCOPE_DETECTOR_SET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(core.engine.model, "load_model", lambda *a, **k: embedded_model)
    scope: dict[str, object] = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[0], str(README), "exec"), scope)  # noqa: S102  # our own README
    verdict = scope["verdict"]
    assert isinstance(verdict, AnswerVerdict) and scope["dset"].name == "default"
    assert verdict.hallucinated == (verdict.probability >= verdict.threshold)
    assert printed.getvalue().startswith(verdict.summary)
