"""RAGExample validation, label rules and the dict round trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.base.errors import DataError
from core.base.examples import Provenance, RAGExample, Span, dedupe_ids, parse_label

RESPONSE = "The mill was built in 1790 and burned down in 1851."


def make(**kw) -> RAGExample:
    args = dict(
        id="ex-1",
        question="When was the mill built?",
        passages=("The mill was built in 1790.", "It burned down in 1861."),
        response=RESPONSE,
        provenance=Provenance(dataset="t", source="file.jsonl:7"),
    )
    args.update(kw)
    return RAGExample(**args)


def test_valid_example_keeps_fields() -> None:
    ex = make()
    assert ex.passages == ("The mill was built in 1790.", "It burned down in 1861.")
    assert ex.label is None and ex.spans == ()


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"id": "  "}, "id"),
        ({"task": "chat"}, "task"),
        ({"passages": ()}, "passages"),
        ({"passages": "one string"}, "passages"),
        ({"passages": ("ok", "  ")}, "passages"),
        ({"response": " "}, "response"),
        ({"question": None}, "question"),
        ({"spans": (Span(start=0, end=len(RESPONSE) + 1),)}, "spans"),
        ({"spans": ((0, 3),)}, "spans"),
        ({"label": False, "spans": (Span(start=0, end=3),)}, "label"),
        ({"prompt": "When was the mill built? no passages here"}, "passages"),
        ({"prompt": "The mill was built in 1790. It burned down in 1861."}, "question"),
    ],
)
def test_errors_name_record_and_field(kw: dict, field: str) -> None:
    with pytest.raises(DataError) as info:
        make(**kw)
    assert info.value.field == field
    assert str(info.value).startswith(f"file.jsonl:7: field '{field}': ")


def test_error_names_id_without_source() -> None:
    with pytest.raises(DataError, match=r"record 'ex-9': field 'response'"):
        RAGExample(id="ex-9", question="q", passages=("p",), response="")


def test_span_validation() -> None:
    with pytest.raises(DataError, match="empty or negative"):
        Span(start=4, end=4)
    with pytest.raises(DataError, match="integers"):
        Span(start=0.0, end=3)  # type: ignore[arg-type]
    assert Span(start=2, end=5).overlaps(4, 9) and not Span(start=2, end=5).overlaps(5, 9)


def test_spans_sorted_and_imply_label() -> None:
    late, early = Span(start=30, end=34), Span(start=4, end=8)
    ex = make(spans=(late, early))
    assert ex.spans == (early, late)
    assert ex.label is True


def test_label_rules() -> None:
    assert make(label=False).label is False
    assert make(label=True).label is True
    assert make(label=True, spans=(Span(start=0, end=3),)).label is True


def test_summary_needs_no_question() -> None:
    ex = make(task="summary", question=None)
    assert ex.question is None
    assert make(question="   ", task="summary").question is None


def test_hallucinated_chars_merge() -> None:
    ex = make(spans=(Span(start=0, end=5), Span(start=3, end=9), Span(start=20, end=25)))
    assert ex.hallucinated_chars == [(0, 9), (20, 25)]


def test_with_response_drops_labels() -> None:
    ex = make(spans=(Span(start=0, end=3),))
    assert ex.with_response("Another answer.").label is None
    assert ex.with_response(RESPONSE, keep_labels=True).spans == ex.spans


def test_round_trip_with_prompt_and_provenance() -> None:
    passages = ("The mill was built in 1790.", "It burned down in 1861.")
    prompt = "Q: When was the mill built?\n" + "\n".join(passages) + "\nA:"
    ex = make(
        prompt=prompt,
        spans=(Span(start=38, end=51, type="Evident Conflict", note="1861, not 1851"),),
        provenance=Provenance(dataset="d", generator="g", source="x.jsonl:2"),
    )
    back = RAGExample.from_dict(ex.to_dict())
    assert back == ex
    assert RAGExample.from_dict(json.loads(ex.to_json())) == ex


def test_from_dict_errors() -> None:
    with pytest.raises(DataError, match="expected a JSON object"):
        RAGExample.from_dict(["not", "a", "dict"], source="f.jsonl:3")  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"f.jsonl:3: field 'response': missing"):
        RAGExample.from_dict({"id": "a", "passages": ["p"]}, source="f.jsonl:3")
    with pytest.raises(DataError, match=r"field 'spans': span 0 needs integer"):
        RAGExample.from_dict(
            {
                "id": "a",
                "question": "q",
                "passages": ["p"],
                "response": "r",
                "spans": [{"start": 0}],
            },
            source="f.jsonl:3",
        )
    with pytest.raises(DataError, match=r"field 'passages'"):
        RAGExample.from_dict(
            {"id": "a", "question": "q", "passages": 5, "response": "r"}, source="f.jsonl:3"
        )
    with pytest.raises(DataError, match=r"field 'label'"):
        RAGExample.from_dict(
            {"id": "a", "question": "q", "passages": ["p"], "response": "r", "label": "maybe"},
            source="f.jsonl:3",
        )


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (None, None),
        (True, True),
        (0, False),
        (1.0, True),
        ("yes", True),
        (" No ", False),
        ("0", False),
    ],
)
def test_parse_label(raw, want) -> None:
    assert parse_label(raw, "src") is want


def test_parse_label_rejects() -> None:
    with pytest.raises(DataError, match="label must be"):
        parse_label(2, "src")


def test_dedupe_ids_names_both_places() -> None:
    a = make(provenance=Provenance(source="f:1"))
    b = make(provenance=Provenance(source="f:5"))
    with pytest.raises(DataError, match=r"f:5: field 'id': duplicate id 'ex-1' \(first at f:1\)"):
        dedupe_ids([a, b])


@given(
    response=st.text(min_size=1, max_size=40).filter(str.strip),
    cuts=st.lists(st.tuples(st.integers(0, 39), st.integers(1, 40)), max_size=4),
)
def test_round_trip_property(response: str, cuts: list[tuple[int, int]]) -> None:
    n = len(response)
    spans = tuple(
        Span(start=min(a, n - 1), end=min(max(a + 1, b), n), type="t")
        for a, b in cuts
        if min(a, n - 1) < min(max(a + 1, b), n)
    )
    ex = RAGExample(id="p", question="q", passages=("p",), response=response, spans=spans)
    back = RAGExample.from_dict(ex.to_dict())
    assert back == ex
    assert list(back.spans) == sorted(back.spans, key=lambda s: (s.start, s.end))
