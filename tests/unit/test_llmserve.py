"""The local OpenAI-compatible endpoint: the openai client (through core.explain) talks
to it, replies are the model's own greedy continuations, bad requests get HTTP 400."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from core.explain import LLMEndpoint, _chat, probe_context
from core.generate import AnswerStream, GenerationConfig
from core.llmserve import _prompt_ids, make_server

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def base_url(tiny_model):
    srv = make_server(tiny_model, "127.0.0.1", 0, name="tiny-served")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_the_openai_client_gets_the_models_own_answer(tiny_model, base_url) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    body = {"model": "tiny-served", "messages": messages, "max_tokens": 5, "temperature": 1.0}
    req = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req) as r:
        reply = json.loads(r.read())
    ids = _prompt_ids(tiny_model, messages)
    stream = AnswerStream.from_ids(
        tiny_model, ids, GenerationConfig(max_new_tokens=5, temperature=1.0, seed=0)
    )
    want = "".join(stream).strip()
    assert reply["choices"][0]["message"]["content"] == want
    assert reply["usage"]["prompt_tokens"] == len(ids) and reply["model"] == "tiny-served"
    # Through ragscope's own client (the openai SDK), as the explanations use it.
    endpoint = LLMEndpoint(model="tiny-served", base_url=base_url, temperature=1.0, max_retries=0)
    text = _chat(endpoint, "Be brief.", "Hi")
    assert isinstance(text, str) and text.strip()


def test_models_route_and_bad_requests(tiny_model, base_url) -> None:
    with urllib.request.urlopen(f"{base_url}/models") as r:
        entry = json.loads(r.read())["data"][0]
    assert entry["id"] == "tiny-served" and entry["max_model_len"] == tiny_model.info.n_ctx
    # the explainer reads the served model's context from the listing (to fit its prompts)
    assert probe_context(LLMEndpoint(model="tiny-served", base_url=base_url)) == (
        tiny_model.info.n_ctx
    )
    assert probe_context(LLMEndpoint(model="another", base_url=base_url)) is None
    for body in (
        {"messages": []},
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6},
    ):
        req = urllib.request.Request(
            f"{base_url}/chat/completions", data=json.dumps(body).encode(), method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        assert e.value.code == 400
        assert "message" in json.loads(e.value.read())["error"]
