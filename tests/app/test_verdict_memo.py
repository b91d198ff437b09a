"""The verdict memo's failures: a failed input is not run again by the next page that
asks, but a new Analyse click (``retry``) runs it again, since the cause may be gone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import app.state.verdicts as verdicts
from core.base.errors import DataError
from core.base.examples import RAGExample
from core.pipeline.sets import DetectorSet


def test_a_failure_is_kept_until_a_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def judge_answer(model: Any, example: RAGExample, dset: Any, **kw: Any):
        calls.append(example.id)
        if len(calls) == 1:
            raise DataError("the answer is too long for the model")
        by = kw["by"]  # the page worked out the judging set once, for the cache key too
        return SimpleNamespace(
            judged_by=by, verdicts={}, seconds=0.0, features={}, answer=None,
            example=example, asked=dset,
        )  # fmt: skip

    monkeypatch.setattr(verdicts, "judge_answer", judge_answer)
    shipped = DetectorSet(
        name="set", folder=Path("set"), model_key="m", detectors=(), broken=(),
        other_models=(), stamp="s",
    )  # fmt: skip
    verdicts._failures().pop(("m", "sig", shipped.cache_id))
    verdicts._verdicts().pop(("m", "sig", shipped.cache_id))
    model = SimpleNamespace(instance_key="m")
    ex = RAGExample(id="x", question="q?", passages=("p.",), response="a.")
    with pytest.raises(DataError, match="too long"):
        verdicts.stream_verdicts(model, ex, "sig", shipped)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="too long"):  # kept: not run again
        verdicts.stream_verdicts(model, ex, "sig", shipped)  # type: ignore[arg-type]
    assert calls == ["x"]
    out = verdicts.stream_verdicts(model, ex, "sig", shipped, retry=True)  # type: ignore[arg-type]
    assert calls == ["x", "x"] and out.verdicts == ()
    # Now known: a repeat (retry or not) computes nothing.
    assert verdicts.stream_verdicts(model, ex, "sig", shipped, retry=True) is out  # type: ignore[arg-type]
    assert calls == ["x", "x"]
