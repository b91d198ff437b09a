"""The ``ragscope`` format: ragscope's own JSONL, one :meth:`RAGExample.to_dict` per line.

Written by :func:`core.data.loader.save_jsonl`.
"""

from __future__ import annotations

from typing import Any

from core.base.examples import RAGExample
from core.data.records import _obj


def _ragscope_record(obj: Any, src: str) -> RAGExample:
    return RAGExample.from_dict(_obj(obj, src), source=src)
