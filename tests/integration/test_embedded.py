"""The real embedded model (SmolLM2-135M-Instruct from the installed GGUF) on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.base.examples import RAGExample
from core.detectors import load_shipped
from core.engine.generate import AnswerStream, GenerationConfig, generate
from core.engine.layout import render
from core.engine.model import embedded_cache_path, load_model
from core.engine.trace import Needs, trace
from core.interventions.aarf import AARFOptions, aarf_generate

pytestmark = pytest.mark.embedded

BRIDGE = RAGExample(
    id="bridge",
    question="Who built the Old Bridge?",
    passages=("The Old Bridge was built by Ada Lovell in 1820.",),
    response="The Old Bridge was built by Ada Lovell.",
)


@pytest.fixture(scope="module")
def reference(embedded_model):
    """A plain HF model read from the same cache, never wrapped by the bridge."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(embedded_cache_path()), dtype=torch.float32, attn_implementation="eager"
    ).eval()


def _long_example() -> RAGExample:
    passages = (
        "The Old Bridge crosses the river Wend at the centre of Marlow Green. It was designed "
        "and built by the engineer Ada Lovell between 1817 and 1820, using grey limestone "
        "quarried two miles upstream. The bridge has five arches, the widest spanning "
        "nineteen metres, and was widened in 1911 to carry trams.",
        "In 1953 a flood damaged the two eastern arches, which were rebuilt with concrete "
        "cores faced in the original stone. The bridge was listed as a protected monument in "
        "1972 and closed to motor traffic in 1998. Today it carries pedestrians and cyclists, "
        "and a small museum in the toll house tells the story of its construction.",
        "Ada Lovell (1779-1851) also built the harbour wall at Fenby and two mills on the "
        "Wend. Her notebooks, kept in the county archive, record the cost of the Old Bridge "
        "as 14,200 pounds, of which almost half went on stone and carriage.",
    )
    return RAGExample(
        id="long",
        question="Who built the Old Bridge, when, and what was it made of?",
        passages=passages,
        response=(
            "The Old Bridge was built by Ada Lovell between 1817 and 1820 from grey limestone. "
            "It has five arches and was widened in 1911 to carry trams; after a flood in 1953 "
            "the eastern arches were rebuilt."
        ),
    )


def test_info_is_smollm2(embedded_model):
    info = embedded_model.info
    assert info.display_name == "SmolLM2-135M-Instruct"
    assert info.architecture == "LlamaForCausalLM"
    assert (info.n_layers, info.n_heads, info.n_kv_heads) == (30, 9, 3)
    assert (info.d_model, info.d_head, info.d_mlp) == (576, 64, 1536)
    assert info.d_vocab == 49152 == len(embedded_model.tokenizer)
    assert info.norm == "rms"
    assert info.has_chat_template is True
    assert info.dtype == "float32" and info.device == "cpu"
    assert 130e6 < info.n_params < 140e6


def test_second_load_reads_the_cache(embedded_model, embedded_was_cached):
    cache = embedded_cache_path()
    assert embedded_model.source == str(cache)
    again = load_model("embedded", device="cpu")
    assert again.source == str(cache)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (cache / name).is_file()
    if not embedded_was_cached:  # this session dequantized: the cached load is faster
        assert again.load_seconds < embedded_model.load_seconds
    a = embedded_model.hf_model.get_input_embeddings().weight
    b = again.hf_model.get_input_embeddings().weight
    assert torch.equal(a, b)


def test_greedy_answer_uses_the_passage(embedded_model):
    res = generate(embedded_model, BRIDGE, GenerationConfig(max_new_tokens=24))
    assert "Ada" in res.text, res.text
    assert res.token_ids and res.prompt_tokens > 0


def test_greedy_equals_argmax_by_hand(embedded_model, reference):
    stream = AnswerStream(
        embedded_model,
        question=BRIDGE.question,
        passages=BRIDGE.passages,
        config=GenerationConfig(max_new_tokens=6),
    )
    list(stream)
    ids = list(stream.prompt_ids)
    with torch.inference_mode():
        for _ in range(len(stream.token_ids)):
            ids.append(int(reference(input_ids=torch.as_tensor([ids])).logits[0, -1].argmax()))
    assert stream.token_ids == ids[len(stream.prompt_ids) :]
    assert len(set(stream.token_ids)) > 1


def test_trace_logits_equal_hf_forward(embedded_model, reference):
    ex = _long_example()
    layout = render(ex, embedded_model)
    assert 250 <= len(layout) <= 400
    n_layers = embedded_model.info.n_layers
    needs = Needs.of(["logits", "resid_post"], n_layers=n_layers, positions="all")
    tr = trace(embedded_model, layout, needs)
    with torch.inference_mode():
        out = reference(
            input_ids=torch.as_tensor(layout.token_ids).unsqueeze(0), output_hidden_states=True
        )
    want = out.logits[0].float()
    diff = (tr.get("logits") - want).abs().max().item()
    assert diff < 1e-4, diff
    # Every layer's hook fired; the residual before the final norm is HF's last hidden
    # state before norm (hidden_states[-1] is after it, so compare layer n-2 instead).
    assert all(("resid_post", layer) in tr.acts for layer in range(n_layers))
    hs = out.hidden_states[n_layers - 1][0].float()
    assert (tr.get("resid_post", n_layers - 2) - hs).abs().max().item() < 1e-3


def test_generate_then_render_round_trip(embedded_model):
    res = generate(embedded_model, BRIDGE, GenerationConfig(max_new_tokens=32))
    ex = BRIDGE.with_response(res.text)
    layout = render(ex, embedded_model, response_ids=res.token_ids)
    assert layout.response_ids.tolist() == list(res.token_ids)
    decoded = embedded_model.tokenizer.decode(
        layout.response_ids.tolist(), clean_up_tokenization_spaces=False
    )
    assert decoded == res.text
    assert (
        layout.token_ids[: layout.response.start].tolist()
        == AnswerStream(
            embedded_model, question=BRIDGE.question, passages=BRIDGE.passages
        ).prompt_ids
    )
    o = layout.response_offsets
    assert o[0, 0] == 0 and o[-1, 1] == len(res.text)
    assert np.all(np.diff(o[:, 0]) >= 0)


def test_kv_cached_aarf_equals_rerunning_the_sequence(embedded_model):
    """On the embedded model with its shipped redeep_token: the incremental AARF decodes
    the same tokens, intervenes on the same steps and reads the same scores as
    re-running the whole sequence at every step."""
    det = load_shipped("redeep_token", embedded_model.info.key)
    ex = _long_example()
    n = 8
    options = AARFOptions(tau=1.0, max_new_tokens=n, plain=False)
    free = aarf_generate(embedded_model, ex, det, options)
    tau = float(np.median(free.probability))
    kw = dict(tau=tau, max_new_tokens=n, plain=False, keep_logits=True)
    cached = aarf_generate(embedded_model, ex, det, AARFOptions(**kw))
    uncached = aarf_generate(embedded_model, ex, det, AARFOptions(kv_cache=False, **kw))
    assert 0 < uncached.n_intervened < uncached.n_steps, uncached.intervened
    assert cached.token_ids == uncached.token_ids and cached.text == uncached.text
    assert np.array_equal(cached.intervened, uncached.intervened)
    assert np.array_equal(cached.step_tokens, uncached.step_tokens)
    np.testing.assert_allclose(cached.probability, uncached.probability, atol=1e-4)
    np.testing.assert_allclose(cached.step_logits, uncached.step_logits, rtol=1e-3, atol=1e-3)
