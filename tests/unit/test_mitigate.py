"""Feedback regeneration and the mitigation batch on the tiny model."""

from __future__ import annotations

import pytest

from core.base.errors import DataError
from core.data import builtin_examples
from core.detectors import make_detector
from core.interventions.mitigate import (
    INSTANCE_FEEDBACK,
    answer_change,
    conversation_ids,
    feedback_message,
    feedback_regenerate,
    feedback_turn,
    mitigate_batch,
)
from core.pipeline.extract import extract_features

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def demo():
    return builtin_examples()


def test_feedback_messages(demo) -> None:
    ex = next(e for e in demo if e.spans)
    s = ex.spans[0]
    token = feedback_message(ex, [(s.start, s.end)], "token")
    assert f"\u201c{ex.response[s.start : s.end].strip()}\u201d" in token
    assert feedback_message(ex, [(s.start, s.end)], "instance") == INSTANCE_FEEDBACK
    assert feedback_message(ex, [], "token") == INSTANCE_FEEDBACK
    with pytest.raises(DataError, match="outside the answer"):
        feedback_message(ex, [(0, 10**6)])
    with pytest.raises(DataError, match="level"):
        feedback_message(ex, [], "sentence")  # type: ignore[arg-type]


def test_the_turn_says_what_was_sent_and_when_it_fell_back(demo) -> None:
    ex = next(e for e in demo if e.spans)
    s = ex.spans[0]
    turn = feedback_turn(ex, [(s.start, s.end)], "token")
    assert (turn.asked, turn.sent, turn.fell_back) == ("token", "token", False)
    assert turn.quotes == (ex.response[s.start : s.end].strip(),)
    # Nothing flagged (or only whitespace) to quote: the instance message, said so.
    blank = ex.response.index(" ")
    for spans in ([], [(blank, blank + 1)]):
        turn = feedback_turn(ex, spans, "token")
        assert (turn.sent, turn.fell_back, turn.message) == ("instance", True, INSTANCE_FEEDBACK)
    assert not feedback_turn(ex, [], "instance").fell_back


def test_answer_change_counts_words_left_out_and_new() -> None:
    same = answer_change("Ada built it in 1820.", "  Ada built it\nin 1820. ")
    assert same.identical and same.describe() == "identical to the first, word for word"
    change = answer_change("Ada built it in 1820.", "Ada Lovell built it in 1821.")
    assert (change.removed, change.added, change.identical) == (1, 2, False)
    assert change.describe() == "1 word(s) left out, 2 new"


def test_the_conversation_holds_prompt_answer_and_feedback(tiny_model, demo) -> None:
    ex = demo[1]
    text = tiny_model.tokenizer.decode(conversation_ids(tiny_model, ex, "Please revise."))
    assert ex.passages[0] in text and ex.response in text
    assert text.index(ex.response) < text.index("Please revise.")
    gen = feedback_regenerate(tiny_model, ex, max_new_tokens=4, temperature=1.0, seed=0)
    assert len(gen.token_ids) <= 4 and gen.prompt_tokens > len(ex.response) // 8


def test_batch_rescores_before_and_after(tiny_model, demo) -> None:
    dets = [make_detector("nll"), make_detector("context_gain")]
    feats = extract_features(tiny_model, demo, dets).features
    for d in dets:
        d.fit(list(feats[d.name]), demo)
    report = mitigate_batch(
        tiny_model, demo[:3], dets, method="feedback-token", max_new_tokens=6, temperature=1.0
    )
    assert len(report.example_ids) + len(report.errors) == 3
    assert report.example_ids, report.errors
    rates = report.rates()
    assert set(rates) == {"nll", "context_gain"}
    for name, (b, a) in rates.items():
        assert 0.0 <= b <= 1.0 and 0.0 <= a <= 1.0
        assert len(report.before[name]) == len(report.after[name]) == len(report.example_ids)
    assert "| nll |" in report.to_markdown()
    # Greedy answers of the random tiny model are blank: recorded as errors, not crashes.
    greedy = mitigate_batch(
        tiny_model, demo[:2], dets, method="feedback-instance", max_new_tokens=4
    )
    assert len(greedy.errors) + len(greedy.example_ids) == 2
    with pytest.raises(DataError, match="method"):
        mitigate_batch(tiny_model, demo[:1], dets, method="pray")
    with pytest.raises(DataError, match="redeep_token"):
        mitigate_batch(tiny_model, demo[:1], dets, method="aarf")


def _reply(content: str):
    import httpx

    return httpx.Response(
        200,
        json={
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "judge",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
        },
    )


def test_llm_judge_verdicts(tiny_model, demo, llm_server, llm_base_url) -> None:
    import json

    from core.base.llm import LLMEndpoint
    from core.interventions.mitigate import judge_answer

    endpoint = LLMEndpoint(model="judge", base_url=llm_base_url, max_retries=0)
    route = llm_server.post("/chat/completions")
    ex = demo[0]
    for content, want in (("No, the year is invented.", True), ("Yes.", False), ("Maybe", None)):
        route.mock(return_value=_reply(content))
        assert judge_answer(endpoint, ex, ex.response) is want
    body = json.loads(route.calls.last.request.content)
    assert ex.passages[0] in body["messages"][1]["content"]
    dets = [make_detector("nll")]
    feats = extract_features(tiny_model, demo, dets).features
    dets[0].fit(list(feats["nll"]), demo)
    route.mock(side_effect=[_reply("No."), _reply("Yes."), _reply("No."), _reply("No.")])
    report = mitigate_batch(
        tiny_model,
        demo[:2],
        dets,
        method="feedback-instance",
        max_new_tokens=4,
        temperature=1.0,
        judge=endpoint,
    )
    assert report.judge == ((True, False), (True, True))
    assert "| LLM judge | 1.000 | 0.500 | -0.500 |" in report.to_markdown()
