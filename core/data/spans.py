"""Spans and passages: spans checked against the response, passages placed in the prompt.

:func:`_spans` reads a list of ``{start, end, ...}`` or ``[start, end]`` items into
:class:`~core.base.examples.Span` objects, each checked against the response text;
:func:`split_passages` splits RAGTruth's ``passage N:`` text, and :func:`_place_passages`
keeps each passage as the prompt holds it (cut short where the prompt was).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeGuard

from core.base.errors import DataError
from core.base.examples import Span
from core.data.records import _short

_PASSAGE_MARKER = re.compile(r"^passage (\d+):", re.MULTILINE)


def _whole(x: object) -> TypeGuard[int]:
    """Whether ``x`` is an integer (``bool`` is not)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_span(
    item: Any, k: int, response: str, src: str, fld: str, *, allow_inclusive: bool = False
) -> Span:
    """One span from ``{start, end, text?, ...}`` or ``[start, end]``, checked against the text.

    ``type`` is read from ``label_type``, ``type`` or ``meta.label_type``; ``note`` from
    ``note``, ``meta.exp`` or a string ``meta``. When ``text`` is given it must equal
    ``response[start:end]``; with ``allow_inclusive`` an inclusive ``end`` that matches
    ``text`` is accepted and converted.
    """
    text = typ = note = None
    if isinstance(item, Mapping):
        start, end, text = item.get("start"), item.get("end"), item.get("text")
        meta = item.get("meta")
        meta_d = meta if isinstance(meta, Mapping) else {}
        typ = item.get("label_type") or item.get("type") or meta_d.get("label_type")
        note = item.get("note") or meta_d.get("exp") or (meta if isinstance(meta, str) else None)
    elif isinstance(item, list | tuple) and len(item) in (2, 3):
        start, end = item[0], item[1]
        typ = item[2] if len(item) == 3 else None
    else:
        raise DataError(
            f"span {k} must be {{start, end}} or [start, end], got {_short(item)}",
            source=src,
            field=fld,
        )
    if not (_whole(start) and _whole(end)):
        raise DataError(
            f"span {k} needs integer start and end, got {_short(start)}, {_short(end)}",
            source=src,
            field=fld,
        )
    n = len(response)
    if text is not None and response[start:end] != text:
        if allow_inclusive and response[start : end + 1] == text:
            end += 1
        else:
            raise DataError(
                f"span {k} [{start}, {end}) text {_short(text)} does not match the "
                f"response there {_short(response[start:end])}; offsets must be "
                "[start, end) characters of the response",
                source=src,
                field=fld,
            )
    if end > n:
        raise DataError(
            f"span {k} [{start}, {end}) runs past the response ({n} characters)",
            source=src,
            field=fld,
        )
    try:
        return Span(
            start=start,
            end=end,
            type=str(typ) if typ is not None else None,
            note=str(note) if note else None,
        )
    except DataError as e:
        raise DataError(f"span {k}: {e.reason}", source=src, field=fld) from e


def _spans(
    raw: Any, response: str, src: str, fld: str, *, allow_inclusive: bool = False
) -> tuple[Span, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise DataError(
            f"expected a list of spans, got {type(raw).__name__}", source=src, field=fld
        )
    return tuple(
        _parse_span(it, k, response, src, fld, allow_inclusive=allow_inclusive)
        for k, it in enumerate(raw)
    )


def split_passages(text: str) -> list[str]:
    """Split RAGTruth's ``"passage 1:...\\n\\npassage 2:..."`` into passages.

    Markers count only at a line start and in sequence (1, 2, 3, ...); each passage
    loses its ``passage N:`` label and surrounding whitespace, so it is still a
    verbatim substring of the text. Without markers the stripped text is one passage.
    Empty passages are dropped.
    """
    marks: list[re.Match[str]] = []
    for m in _PASSAGE_MARKER.finditer(text):
        if int(m.group(1)) == len(marks) + 1:
            marks.append(m)
    if not marks or text[: marks[0].start()].strip():
        return [text.strip()] if text.strip() else []
    bounds = [m.start() for m in marks[1:]] + [len(text)]
    parts = [text[m.end() : b].strip() for m, b in zip(marks, bounds, strict=True)]
    return [p for p in parts if p]


def _cut_prefix(passage: str, prompt: str) -> str | None:
    """The start of ``passage`` that ends ``prompt``, when the prompt was cut inside it."""
    anchor = passage[:64]
    i = prompt.find(anchor)
    while i >= 0:
        tail = prompt[i:].rstrip()
        if tail and passage.startswith(tail):
            return tail
        i = prompt.find(anchor, i + 1)
    return None


def _place_passages(
    passages: list[str], prompt: str, src: str, fld: str, warnings: list[str]
) -> list[str]:
    """Passages as the prompt holds them (see :func:`_RagtruthJsonl` for the rule)."""
    if not passages:
        raise DataError("no passage text", source=src, field=fld)
    out: list[str] = []
    for k, p in enumerate(passages):
        if p in prompt:
            out.append(p)
            continue
        cut = _cut_prefix(p, prompt)
        if cut is None:
            raise DataError(
                f"passage {k + 1} ({_short(p, 50)}) does not occur in the prompt; "
                "passages must be verbatim parts of the prompt",
                source=src,
                field=fld,
            )
        out.append(cut)
        dropped = len(passages) - k - 1
        warnings.append(
            f"{src}: the prompt is cut short inside passage {k + 1}; kept the "
            f"{len(cut)} of {len(p)} characters the model saw"
            + (f" and dropped {dropped} later passage(s)" if dropped else "")
        )
        break
    return out
