"""Reading a saved run of any kind by the ``kind`` it records: held-out evaluation,
cross-validation, cross-domain matrix or review learning curve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.base.errors import DataError
from core.evaluation.cv_run import CVRun, read_run
from core.evaluation.evaluate import EvalRun
from core.evaluation.matrix import MatrixRun
from core.evaluation.review_curve import KIND as CURVE_KIND
from core.evaluation.review_curve import CurveRun


def load_run(path: str | Path) -> Any:
    """A saved run of any kind: :class:`CVRun`, :class:`MatrixRun`, :class:`CurveRun` or
    :class:`~core.evaluation.evaluate.EvalRun` (by its ``kind``).

    Raises:
        DataError: Not a readable run (the message names the file).
    """
    d = read_run(path, "evaluation run")
    kinds: dict[str, Any] = {"cv": CVRun, "matrix": MatrixRun, CURVE_KIND: CurveRun}
    cls = kinds.get(str(d.get("kind")), EvalRun)
    try:
        return cls.from_dict(d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DataError(f"not a readable evaluation run ({e})", source=str(path)) from e
