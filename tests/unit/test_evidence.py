"""Evidence and a type for every flagged span (core.pipeline.evidence), on hand-written
passages and answers: values, names, negations, citations and claims of absence that
contradict; claims with no passage behind them or with words no passage has; hostile
input bounded; attention re-ranking; and the quality measure on a synthetic set with a
known hit rate and balanced accuracy (core.evaluation.evidence_quality), through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.base.examples import RAGExample, Span
from core.cli import main
from core.data.loader import save_jsonl
from core.evaluation import evidence_quality as eq
from core.learning.metrics import group_resamples
from core.pipeline import evidence as ev
from core.pipeline.evidence import (
    MAX_REASON,
    MAX_SENTENCES,
    MAX_UNIT_CHARS,
    NO_SUPPORT,
    candidate_sentences,
    find_all,
    find_evidence,
)
from core.pipeline.word_spans import passage_sentences
from core.signals.embed import default_embedder

TOWER = (
    "The Harbour Tower was built in 1887 by the Lindqvist company. "
    "It stands on the north pier and is 84 metres tall. "
    "The museum on its top floor is open every day."
)
GARDEN = (
    "The botanic garden was founded by Margaret Ellery in the town of Fenwick. "
    "Tickets cost $12 for adults. Entry is free for children."
)
PASSAGES = (TOWER, GARDEN)


def _find(answer: str, span: str | None = None, passages=PASSAGES, **kw):
    start = answer.index(span) if span else 0
    end = start + len(span) if span else len(answer)
    return find_evidence(passages, answer, start, end, **kw)


def test_a_different_year_contradicts_and_the_reason_names_both() -> None:
    f = _find("The Harbour Tower was built in 1912 by the Lindqvist company.")
    assert f.type == "contradicted"
    assert f.reason == "the passage says 1887; the answer says 1912"
    assert f.evidence is not None and f.evidence.passage == 0 and f.evidence.how == "text"
    assert TOWER[f.evidence.start : f.evidence.end] == f.evidence.text
    assert f.evidence.text.startswith("The Harbour Tower was built in 1887")
    # a fragment borrows its sentence to be aligned; its own value decides
    frag = _find("The Harbour Tower was built in 1912 by the Lindqvist company.", "1912")
    assert frag.type == "contradicted" and "1887" in frag.reason and "1912" in frag.reason
    assert (
        _find("Tickets cost $20 for adults.").reason == "the passage says $12; the answer says $20"
    )


def test_a_different_name_in_the_same_slot_contradicts() -> None:
    f = _find("The botanic garden was founded by Thomas Whitcombe in the town of Fenwick.")
    assert f.type == "contradicted"
    assert f.reason == "the passage says Margaret Ellery; the answer says Thomas Whitcombe"
    assert f.evidence is not None and f.evidence.passage == 1


def test_a_span_the_passage_says_of_something_else_contradicts() -> None:
    bees = (
        "Foragers dance to share where food is. The angle of the waggle run shows the "
        "direction of the food. The duration of the waggle run shows the distance to it.",
    )
    answer = "The duration of the waggle run tells the direction of the food."
    f = _find(answer, "the direction of the food", passages=bees)
    assert f.type == "contradicted"
    assert f.reason.startswith('the passage says this of "angle", not of "duration"')
    assert f.evidence is not None and f.evidence.text.startswith("The angle of")
    # a word the passages never use in that slot is a paraphrase, not another subject
    cubes = ("Cut the potatoes into cubes, about 2 inches on each side. Boil the chunks.",)
    g = _find(
        "Cut the potatoes into chunks, about 2 inches on each side.",
        "about 2 inches on each side",
        passages=cubes,
    )
    assert g.type == "unsupported"


def test_a_negation_on_one_side_only_contradicts() -> None:
    f = _find("The museum on the top floor of the Harbour Tower is not open every day.")
    assert f.type == "contradicted" and "negates" in f.reason
    assert f.evidence is not None and "open every day" in f.evidence.text
    agrees = _find("The museum on the top floor of the Harbour Tower is open every day.")
    assert agrees.type == "unsupported" and "negat" not in agrees.reason


WORKS = (
    "The Dunwick tannery was founded in 1822 beside the river. "
    "The works closed in 1911 after a fire destroyed the drying sheds. "
    "The site later became a public garden."
)


def test_another_word_in_the_very_slot_contradicts_a_fragment() -> None:
    """Issue 67: "a flood" where the aligned passage sentence says "a fire" was typed
    unsupported ("no passage supports this"): no sentence reached the floor for the
    fragment alone. Its answer sentence restates one passage sentence, which has another
    word between the same neighbours: contradicted, that sentence the evidence."""
    answer = "The Dunwick tannery closed in 1911 after a flood destroyed the drying sheds."
    f = _find(answer, "a flood", passages=(WORKS,))
    assert f.type == "contradicted"
    assert f.reason == 'the passage says "fire"; the answer says "flood"'
    assert f.evidence is not None and f.evidence.text.startswith("The works closed in 1911")
    # one word of a longer claim is not a slot's value: a paraphrase stays unsupported
    long = "The tannery closed in 1911 when flames ruined every drying shed it owned."
    whole = _find(long, passages=(WORKS,))
    assert whole.type == "unsupported", whole.reason
    # the same word where the passage has it too is no clash
    same = "The Dunwick tannery closed in 1911 after a fire destroyed the drying sheds."
    assert _find(same, "a fire", passages=(WORKS,)).type == "unsupported"


def test_a_day_month_or_season_is_a_value_and_the_neighbours_pick_which() -> None:
    line = (
        "Line 7 runs 9.4 kilometres from the harbour to the university and has 21 stops. "
        "The café is closed on Monday."
    )
    answer = "Line 7 runs 9.4 kilometres from the harbour to the university and has 16 stops."
    f = _find(answer, "16 stops", passages=(line,))
    # of the sentence's two numbers, the one beside "stops", not the first
    assert f.type == "contradicted" and f.reason == "the passage says 21; the answer says 16"
    day = _find("The café is closed on Tuesdays.", "on Tuesdays", passages=(line,))
    assert day.type == "contradicted" and "Monday" in day.reason and "Tuesdays" in day.reason
    # "may" and "march" are verbs unless capitalised: no value
    assert ev._class_of("may") is None and ev._class_of("March") == "month:march"
    assert ev._class_of("Winters") == "season:winter" and ev._class_of("spring") == "season:spring"


RECORD = (
    '{"name": "Hollin Bike Works", "city": "Ashby", "accepts_cards": false, '
    '"warranty_years": 2, "closed_on": "Sunday", "parking": true, "hours": "09:00-17:00"}'
)


@pytest.mark.parametrize(
    ("answer", "span", "reason"),
    [
        (
            "Hollin Bike Works in Ashby accepts card payments.",
            "accepts card payments",
            'the record says "accepts_cards": false; the answer says it is',
        ),
        (
            "Repairs come with a three-year warranty.",
            "a three-year warranty",
            'the record says "warranty_years": 2; the answer says three',
        ),
        (
            "The shop is closed on Saturdays.",
            "closed on Saturdays",
            'the record says "closed_on": "Sunday"; the answer says Saturdays',
        ),
        (
            "There is no parking at the shop.",
            "There is no parking",
            'the record says "parking": true; the answer says it is not',
        ),
    ],
)
def test_a_field_of_a_json_record_contradicts_what_the_answer_says_of_it(
    answer: str, span: str, reason: str
) -> None:
    f = _find(answer, span, passages=(RECORD,))
    assert (f.type, f.reason) == ("contradicted", reason)
    assert f.evidence is not None and f.evidence.passage == 0
    assert f.evidence.text in RECORD and f.evidence.text.split(":")[0].strip('" ') in reason


def test_a_record_field_the_answer_states_rightly_is_no_clash() -> None:
    for answer, span in (
        ("Hollin Bike Works does not accept cards.", "does not accept cards"),
        ("It has parking and a two-year warranty.", "a two-year warranty"),
        ("It is closed on Sundays.", "closed on Sundays"),
    ):
        f = _find(answer, span, passages=(RECORD,))
        assert f.type == "unsupported", (answer, f.reason)
    said = _find(
        "Hollin Bike Works does not accept cards.", "does not accept cards", passages=(RECORD,)
    )
    assert said.reason.startswith('the record says "accepts_cards": false, as the answer does')
    # a hostile record: nested past the JSON reader's depth, or not an object
    deep = "{" + '"a": {' * 5000 + "}" * 5001
    assert _find("It accepts cards.", "accepts cards", passages=(deep,)).type == "unsupported"
    assert ev._record_fields("[1, 2, 3]") == [] and ev._record_fields("{not json}") == []


def test_citing_the_wrong_passage_and_denying_what_a_passage_says_contradict() -> None:
    cited = _find("Tickets cost $12 for adults (passage 1).")
    assert cited.type == "contradicted"
    assert cited.reason.startswith("the answer cites passage 1; passage 2 says")
    right = _find("Tickets cost $12 for adults (passage 2).")
    assert right.type == "unsupported", "the number of a passage cited is no value"
    denied = _find("The passages do not mention who founded the botanic garden in Fenwick.")
    assert denied.type == "contradicted"
    assert denied.reason.startswith("the answer says the passages lack this; passage 2 says")


def test_a_claim_no_passage_supports_has_no_evidence_and_names_its_new_words() -> None:
    f = _find("Preheat the grill to high heat and season the steak with coarse salt.")
    assert f.evidence is None and f.type == "unsupported"
    assert f.reason.startswith(NO_SUPPORT)
    assert '"high heat"' in f.reason and '"coarse salt"' in f.reason


def test_a_supported_claim_with_extra_words_is_unsupported_naming_them() -> None:
    f = _find("The Harbour Tower stands on the north pier and glows with golden lights at night.")
    assert f.evidence is not None and "north pier" in f.evidence.text
    assert f.type == "unsupported"
    assert f.reason == 'the passages do not mention "golden lights", "glows", "night"'
    assert (
        '"high heat"'
        in _find("Preheat the oven to high heat.", passages=["Preheat the oven."]).reason
    )


def test_a_line_without_a_full_stop_is_a_candidate() -> None:
    passage = "Opening hours\nThe shop opens at nine."
    assert passage_sentences([passage]) == [(0, 0, 13), (0, 14, 37)]
    assert (0, 0, 13) in candidate_sentences([passage])


@pytest.mark.parametrize(
    ("passage", "sentences"),
    [
        ("It costs $4.5 million. Then it rose.", ["It costs $4.5 million.", "Then it rose."]),
        ("Founded in 1887. It grew.", ["Founded in 1887.", "It grew."]),
        ("1. Open the lid.\n2. Pour it.", ["1. Open the lid.", "2. Pour it."]),
        ('He said "no." Then he left', ['He said "no."', "Then he left"]),
        ("See example.com at 3.30 pm. Or not!", ["See example.com at 3.30 pm.", "Or not!"]),
    ],
)
def test_a_stop_inside_a_number_or_after_a_list_mark_ends_no_sentence(
    passage: str, sentences: list[str]
) -> None:
    # Review once highlighted "4." apart from "5 million" as the evidence.
    assert [passage[a:b] for _, a, b in passage_sentences([passage])] == sentences


def test_attention_reranks_but_cannot_make_unrelated_text_evidence() -> None:
    passages = ["The library opens at nine on weekdays.", "The library opens at nine on weekdays!"]
    answer = "The library opens at nine on weekdays."
    n = len(passage_sentences(passages))
    text_only = find_evidence(passages, answer, 0, len(answer))
    assert text_only.evidence is not None and text_only.evidence.passage == 0
    second = find_evidence(passages, answer, 0, len(answer), attention=[0.1, 0.9])
    assert second.evidence is not None and second.evidence.passage == 1
    assert second.evidence.how == "attention+text"
    unrelated = ["Penguins cannot fly.", "The library opens at nine on weekdays."]
    still = find_evidence(unrelated, answer, 0, len(answer), attention=[1.0, 0.0])
    assert still.evidence is not None and still.evidence.passage == 1
    with pytest.raises(ValueError, match=f"passages have {n} sentences"):
        find_evidence(passages, answer, 0, len(answer), attention=[1.0])
    with pytest.raises(ValueError, match="for 1 spans"):
        find_all(passages, answer, [(0, 5)], attention=[])


def test_find_all_embeds_the_passages_once_per_answer() -> None:
    passages = ["Otters hold hands while they sleep. They float on their backs."]
    answer = "Otters hold hands while sleeping. They float on their bellies. Otters eat clams."
    spans = [(0, 33), (34, 62), (63, 80)]
    find_all(passages, answer, spans)  # warm the cache with these texts
    emb = default_embedder()
    calls = emb.n_forward_calls
    again = find_all(passages, answer, spans)
    assert emb.n_forward_calls == calls, "every text was cached"
    passages2 = ["Otters live in rivers. Otters sleep in groups."]
    emb_calls = emb.n_forward_calls
    out = find_all(passages2, answer, spans)
    assert emb.n_forward_calls - emb_calls == 1, "one batch: the new passage sentences"
    assert len(again) == len(out) == 3 and find_all(passages, answer, []) == []


def test_hostile_input_is_bounded_and_never_crashes() -> None:
    answer = "The museum is open every day."
    for passages in ([], [""], ["   \n\n "], ["..."]):
        f = find_evidence(passages, answer, 0, len(answer))
        assert f.evidence is None and f.type == "unsupported" and f.reason.startswith(NO_SUPPORT)
    lone = find_evidence(PASSAGES, "It is open. ", 10, 11)
    assert lone.evidence is None and lone.reason == f"{NO_SUPPORT}: the span has no words to check"
    assert find_evidence(PASSAGES, answer, 50, 10).evidence is None  # reversed, out of range
    assert find_evidence(PASSAGES, answer, -5, 4).type == "unsupported"

    filler = " ".join(f"Filler line {k % 7}." for k in range(10_000))
    many = [filler, "The ferry to Kestrel Island leaves at noon."]
    assert len(passage_sentences(many)) == 10_001
    assert len(candidate_sentences(many)) == MAX_SENTENCES, "capped"
    f = find_evidence(many, "The ferry to Kestrel Island leaves at noon.", 0, 43)
    assert f.evidence is not None and f.evidence.passage == 1, "each passage gets its share"

    huge = "word " * 200_000 + "The lighthouse keeper retired in 1950."  # 1 MB, one sentence
    f = find_evidence([huge], "The lighthouse keeper retired in 1962.", 0, 37)
    assert f.evidence is None or len(f.evidence.text) <= MAX_UNIT_CHARS
    units = candidate_sentences([huge])
    assert len(units) <= MAX_SENTENCES and all(b - a <= MAX_UNIT_CHARS for _, a, b in units)

    odd = [
        "\u202eevil\u202c \u0000 caf\u00e9 \U0001f600 \u05e9\u05dc\u05d5\u05dd. Z\u0351\u0351algo."
    ]
    claim = "caf\u00e9 \U0001f600 \ufdfd \u200b 1\u202f000 \u0130stanbul " * 200
    f = find_all(odd, claim, [(0, len(claim)), (3, 4)])
    assert all(len(x.reason) <= MAX_REASON for x in f)
    lone = "The Harbour Tower \ud800 was built in 1912 by the \udfff company."
    f = find_all([TOWER + " \udc00"], lone, [(0, len(lone))])
    assert f[0].type == "contradicted" and f[0].reason.encode("utf-8")  # no lone surrogate


def test_every_reason_is_bounded() -> None:
    words = " ".join(f"zorblax{k}" for k in range(500))
    f = _find(f"The Harbour Tower hosts {words}.")
    assert len(f.reason) <= MAX_REASON and "…" in f.reason
    long_word = "q" * 5_000
    assert len(_find(f"The Harbour Tower hosts {long_word}.").reason) <= MAX_REASON


def test_the_caps_are_module_constants_the_code_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ev, "MAX_SENTENCES", 3)
    assert len(candidate_sentences([TOWER, GARDEN])) == 3


# ----------------------------------------------------------------------------- quality


def _example(
    i: int, passages: tuple[str, ...], response: str, spans: list[tuple[str, str, str]]
) -> RAGExample:
    out = []
    for text, kind, note in spans:
        start = response.index(text)
        out.append(Span(start=start, end=start + len(text), type=kind, note=note))
    return RAGExample(
        id=f"e{i}", passages=passages, response=response, question="q?", spans=tuple(out)
    )


def _synthetic() -> list[RAGExample]:
    conflict = "The Harbour Tower was built in 1912 by the Lindqvist company."
    baseless = "The gift shop sells painted seashells and postcards."
    subtle = "The museum on its top floor is open every day to members."
    moved = "Entry is free for children and students."
    return [
        # a hit: the quote is the sentence the span relies on
        _example(
            0,
            PASSAGES,
            conflict,
            [(conflict, "Evident Conflict", "Original: built in 1887 by the Lindqvist company")],
        ),
        # no quote: "No mention" is a remark, not a quote
        _example(
            1,
            PASSAGES,
            baseless,
            [(baseless, "Evident Baseless Info", "Original: No mention of a gift shop")],
        ),
        # a miss: the annotator quotes another sentence (fuzzily: 'metres high')
        _example(
            2,
            PASSAGES,
            subtle,
            [
                (
                    subtle,
                    "Subtle Conflict",
                    'Original: "it stands on the north pier and is 84 metres high"',
                )
            ],
        ),
        # neither Baseless nor Conflict: no type; a hit on the quoted sentence
        _example(3, PASSAGES, moved, [(moved, "Other", "Original: Entry is free for children.")]),
    ]


def test_quotes_are_read_from_original_lines_and_located() -> None:
    assert eq.quote_of("HIGH INTRO\nOriginal: No mention of preheating\nGenerative: x") is None
    assert eq.quote_of("Original: *not mentioned*") is None
    assert eq.quote_of('Original: "Dizziness (mentioned in Passage 1)"') == "Dizziness"
    assert eq.quote_of('Original: "...women experience nausea..." (Passage 3)') == (
        "women experience nausea"
    )
    assert eq.quote_of(None) is None and eq.quote_of("no original line") is None
    where = eq.locate_quote(PASSAGES, "tickets  COST $12")
    assert where == [(1, GARDEN.index("Tickets"), GARDEN.index(" for adults"))]
    fuzzy = eq.locate_quote(PASSAGES, "it stands on the north pier and is 84 metres high")
    assert len(fuzzy) == 1 and fuzzy[0][0] == 0 and "north pier" in TOWER[fuzzy[0][1] : fuzzy[0][2]]
    assert eq.locate_quote(PASSAGES, "penguins migrate across frozen deserts at dawn") == []
    assert eq.locate_quote(PASSAGES, "museum shop") == [], "two words must occur exactly"


def test_quality_on_a_synthetic_set_with_known_numbers() -> None:
    report = eq.evidence_quality(_synthetic(), n_boot=200)
    hits = report["evidence"]
    assert hits["n"] == 3 and hits["hit_rate"] == pytest.approx(2 / 3)
    assert hits["baseline_hit_rate"] == pytest.approx(2 / 3)
    lo, hi = hits["hit_rate_ci"]
    assert 0.0 <= lo <= 2 / 3 <= hi <= 1.0
    types = report["type"]
    # gold: contradicted, unsupported, contradicted; ours: contradicted, unsupported, unsupported
    assert types["n"] == 3 and types["n_contradicted"] == 2
    assert types["confusion"] == {
        "unsupported": {"unsupported": 1, "contradicted": 0},
        "contradicted": {"unsupported": 1, "contradicted": 1},
    }
    assert types["balanced_accuracy"] == pytest.approx(0.75)
    assert types["accuracy"] == pytest.approx(2 / 3)
    assert types["majority"] == {
        "type": "contradicted",
        "balanced_accuracy": 0.5,
        "accuracy": pytest.approx(2 / 3),
    }
    only = eq.evidence_quality(_synthetic(), only=lambda e, s: e.id != "e2", n_boot=0)
    assert only["evidence"]["n"] == 2 and only["evidence"]["hit_rate"] == 1.0
    assert only["type"]["n"] == 2 and only["type"]["balanced_accuracy"] == 1.0
    assert only["evidence"]["hit_rate_ci"] is None
    md = eq.evidence_markdown(eq.evidence_run(report, "synthetic"))
    assert "| evidence hit rate | 66.7% [" in md and "| type balanced accuracy | 0.750" in md
    # three spans are an anecdote, and the report says so with what would fix it
    assert "**Too few spans.** The hit rate rests on 3 quoted spans" in md and "27 more" in md
    assert "1 unsupported span and 2 contradicted spans" in md
    enough = {
        "evidence": {"n": 40},
        "type": {"confusion": {"unsupported": {"unsupported": 20}, "contradicted": {"x": 12}}},
    }
    assert eq.too_few(enough) == []


def test_a_share_bootstrap_keeps_resamples_of_one_class() -> None:
    y, groups = np.ones(6), np.arange(6) // 2
    assert list(group_resamples(y, groups, 50, 0)) == []
    kept = list(group_resamples(y, groups, 50, 0, both_classes=False))
    assert len(kept) == 50 and all(len(idx) == 6 for idx in kept)


def test_evaluate_evidence_prints_and_saves_without_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import core.cli.common as common
    import core.cli.training as training

    def no_model(*a: object, **k: object) -> None:
        raise AssertionError("evaluate --evidence loaded a model")

    monkeypatch.setattr(training, "load", no_model)
    monkeypatch.setattr(common, "load_model", no_model)
    data = save_jsonl(_synthetic(), tmp_path / "synthetic.jsonl")
    out = tmp_path / "runs"
    assert main(["evaluate", "--evidence", str(data), "--bootstrap", "50", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| type balanced accuracy | 0.750" in printed
    (saved,) = out.glob("*-evidence-*.json")
    run = json.loads(saved.read_text())
    assert run["kind"] == "evidence" and run["type"]["balanced_accuracy"] == pytest.approx(0.75)
    assert saved.with_suffix(".md").is_file()
