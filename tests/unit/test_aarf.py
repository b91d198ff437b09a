"""AARF on the tiny model: scoped scaling hooks, guarded decoding, re-scoring, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from core.cli import main
from core.data import resolve_dataset
from core.detectors import make_detector
from core.engine.generate import GenerationConfig, generate
from core.engine.layout import render
from core.interventions.aarf import (
    AARFOptions,
    AnswerPrompt,
    StepScorer,
    aarf_generate,
    rescore_answers,
    scaled_components,
)
from core.pipeline.extract import extract_features, run_example

# Strong enough to change the tiny model's greedy token (5 only nudges its logits).
STRONG = 50.0


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """Tiny, latency-bound forwards: one torch thread (see tests/conftest.py)."""


@pytest.fixture(scope="module")
def detector(tiny_model):
    """redeep_token fitted on the 4 + 4 built-in examples with the shortest passages."""
    _, examples = resolve_dataset("builtin")

    def shortest(label: bool) -> list:
        pool = [e for e in examples if e.label is label]
        return sorted(pool, key=lambda e: (sum(map(len, e.passages)), e.id))[:4]

    chosen = shortest(False) + shortest(True)
    det = make_detector("redeep_token")
    ext = extract_features(tiny_model, chosen, [det])
    return det.fit(ext.features[det.name], ext.examples)


@pytest.fixture(scope="module")
def prompt_ids(tiny_model, toy_example) -> torch.Tensor:
    layout = render(toy_example, tiny_model)
    return torch.as_tensor([layout.token_ids[: layout.response.start].tolist()])


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model.bridge(ids, return_type="logits")[0].float()


def _hooked(model) -> list[str]:
    return [n for n, hp in model.bridge.hook_dict.items() if hp._forward_hooks]


# --------------------------------------------------------------------------- scaled_components


def test_scaling_changes_logits_while_active_and_leaves_no_hooks(tiny_model, prompt_ids):
    base = _logits(tiny_model, prompt_ids)
    with scaled_components(tiny_model, [(1, 1), (0, 2)], [1], alpha2=5.0, beta2=0.2):
        assert _hooked(tiny_model)
        inside = _logits(tiny_model, prompt_ids)
    assert (inside - base).abs().max() > 1e-3
    assert _hooked(tiny_model) == []
    assert torch.equal(_logits(tiny_model, prompt_ids), base)


def test_scaling_by_one_is_the_identity(tiny_model, prompt_ids):
    base = _logits(tiny_model, prompt_ids)
    info = tiny_model.info
    heads = [(ly, h) for ly in range(info.n_layers) for h in range(info.n_heads)]
    with scaled_components(tiny_model, heads, range(info.n_layers), alpha2=1.0, beta2=1.0):
        same = _logits(tiny_model, prompt_ids)
    assert torch.equal(same, base)


def test_head_and_mlp_contributions_scale_exactly(tiny_model, prompt_ids):
    """Head h's term z_h W_O[h] in attn_out scales by alpha2; the MLP output by beta2."""
    info = tiny_model.info
    names = ["blocks.0.attn.hook_z", "blocks.0.hook_attn_out", "blocks.1.hook_mlp_out"]

    def run() -> dict[str, torch.Tensor]:
        got: dict[str, torch.Tensor] = {}

        def saver(name):
            def save(act, hook):
                got[name] = act[0].detach().clone()

            return save

        with torch.inference_mode():
            tiny_model.bridge.run_with_hooks(prompt_ids, fwd_hooks=[(n, saver(n)) for n in names])
        return got

    base = run()
    with scaled_components(tiny_model, [(0, 2)], [], alpha2=3.0, beta2=1.0):
        heads_scaled = run()
    w_o = tiny_model.hf_model.model.layers[0].self_attn.o_proj.weight.detach()
    d = info.d_head
    term = base["blocks.0.attn.hook_z"][:, 2] @ w_o[:, 2 * d : 3 * d].T  # [pos, d_model]
    want = base["blocks.0.hook_attn_out"] + 2.0 * term
    torch.testing.assert_close(heads_scaled["blocks.0.hook_attn_out"], want, rtol=1e-5, atol=1e-5)
    # The captured z is the scaled one: only head 2's slice changed, by exactly 3x.
    z0, z1 = base["blocks.0.attn.hook_z"], heads_scaled["blocks.0.attn.hook_z"]
    torch.testing.assert_close(z1[:, 2], 3.0 * z0[:, 2])
    assert torch.equal(z1[:, [0, 1, 3]], z0[:, [0, 1, 3]])

    with scaled_components(tiny_model, [], [1], alpha2=1.0, beta2=0.25):
        mlp_scaled = run()
    # Layer 1's MLP reads the unchanged resid_mid, so its output is just scaled.
    torch.testing.assert_close(
        mlp_scaled["blocks.1.hook_mlp_out"], 0.25 * base["blocks.1.hook_mlp_out"]
    )
    assert _hooked(tiny_model) == []


def test_hooks_are_removed_when_the_block_raises(tiny_model, prompt_ids):
    base = _logits(tiny_model, prompt_ids)
    with pytest.raises(RuntimeError, match="inside the block"):
        with scaled_components(tiny_model, [(1, 0)], [0, 1], alpha2=5.0, beta2=0.2):
            _logits(tiny_model, prompt_ids)
            raise RuntimeError("inside the block")
    assert _hooked(tiny_model) == []
    assert torch.equal(_logits(tiny_model, prompt_ids), base)


@pytest.mark.parametrize(
    ("heads", "layers", "alpha2", "beta2", "match"),
    [
        ([(0, 0)], [0], 0.0, 0.2, "alpha2 .* got 0.0"),
        ([(0, 0)], [0], 5.0, -0.5, r"beta2 .* got -0.5"),
        ([(0, 0)], [0], 5.0, float("nan"), "beta2 .* got nan"),
        ([(2, 0)], [0], 5.0, 0.2, r"head \(2, 0\): layer 2 is outside 0..1"),
        ([(1, 4)], [0], 5.0, 0.2, r"head \(1, 4\): head 4 is outside 0..3"),
        ([(1, 1)], [-1], 5.0, 0.2, "layer -1 is outside 0..1"),
    ],
)
def test_scaling_rejects_bad_values(tiny_model, heads, layers, alpha2, beta2, match):
    with pytest.raises(ValueError, match=match):
        with scaled_components(tiny_model, heads, layers, alpha2=alpha2, beta2=beta2):
            pass
    assert _hooked(tiny_model) == []


# --------------------------------------------------------------------------- step scores


def test_step_scores_equal_the_detector_on_a_given_response(tiny_model, detector, toy_example):
    """Scoring a prefix one step at a time reads what predict() reads for that token."""
    feats = run_example(tiny_model, toy_example, [detector])[detector.name]
    verdict = detector.predict(feats)
    layout = render(toy_example, tiny_model)
    scorer = StepScorer(tiny_model, detector, toy_example)
    assert list(scorer.prompt_ids) == layout.token_ids[: layout.response.start].tolist()
    assert np.array_equal(scorer.context, layout.context_positions())
    resp = layout.response_ids.tolist()
    n = len(resp)
    for j in (0, 1, n - 1):
        s = scorer(resp[:j])
        np.testing.assert_allclose(s.ecs, feats.tokens[j, : len(s.ecs)], atol=1e-5)
        np.testing.assert_allclose(s.pks, feats.tokens[j, len(s.ecs) :], rtol=1e-4, atol=1e-7)
        assert s.probability == pytest.approx(float(verdict.token_scores[j]), abs=1e-4)
        assert s.h == pytest.approx(float(detector.unit_h(feats.tokens[j : j + 1])[0]), abs=1e-4)
        torch.testing.assert_close(
            s.logits,
            _logits(
                tiny_model,
                torch.as_tensor([layout.token_ids[: layout.response.start + j].tolist()]),
            )[-1],
        )


# --------------------------------------------------------------------------- aarf_generate


def test_never_intervening_gives_the_plain_greedy_answer(tiny_model, detector, toy_example):
    res = aarf_generate(tiny_model, toy_example, detector, AARFOptions(tau=1.0, max_new_tokens=5))
    plain = generate(tiny_model, toy_example, GenerationConfig(max_new_tokens=5))
    assert res.n_intervened == 0 and not res.intervened.any()
    assert res.token_ids == plain.token_ids and res.text == plain.text
    assert res.plain is not None and res.plain.token_ids == plain.token_ids
    assert not res.changed
    assert res.n_steps == len(res.token_ids) + (res.stop == "eos")
    assert np.array_equal(res.step_tokens, res.base_tokens)
    assert ((0 <= res.probability) & (res.probability <= 1)).all()
    assert res.tau == 1.0 and res.score_scale == "probability"


def test_always_intervening_scales_every_step(tiny_model, detector, toy_example):
    options = AARFOptions(tau=-1.0, max_new_tokens=3, alpha2=STRONG, plain=False)
    res = aarf_generate(tiny_model, toy_example, detector, options)
    assert res.n_intervened == res.n_steps == 3 and res.intervened.all()
    assert res.plain is None and res.answers() == {"aarf": res.text}
    assert res.heads == tuple(detector.selected_heads)
    assert res.layers == tuple(detector.selected_layers)


def test_explicit_components_replace_the_detectors_selection(tiny_model, detector, toy_example):
    kw = dict(tau=-1.0, max_new_tokens=3, plain=False, keep_logits=True)
    nothing = aarf_generate(
        tiny_model, toy_example, detector, AARFOptions(heads=(), layers=(), **kw)
    )
    never = aarf_generate(tiny_model, toy_example, detector, AARFOptions(**{**kw, "tau": 2.0}))
    # Scaling no component is the plain model, though every step "intervenes".
    assert nothing.n_intervened == 3 and nothing.heads == () and nothing.layers == ()
    np.testing.assert_allclose(nothing.step_logits, never.step_logits, rtol=1e-5, atol=1e-5)
    options = AARFOptions(heads=[(0, 1)], layers=[], alpha2=STRONG, **kw)
    some = aarf_generate(tiny_model, toy_example, detector, options)
    assert some.heads == ((0, 1),) and some.layers == ()
    assert not np.allclose(some.step_logits[0], never.step_logits[0])
    with pytest.raises(ValueError, match="outside"):
        aarf_generate(tiny_model, toy_example, detector, AARFOptions(layers=[99], **kw))


def test_logits_change_exactly_on_the_intervened_steps(tiny_model, detector, toy_example):
    n = 5
    options = AARFOptions(tau=1.0, max_new_tokens=n, plain=False)
    free = aarf_generate(tiny_model, toy_example, detector, options)
    s = free.probability
    # Until the first intervention AARF follows the plain trajectory, so with
    # tau = the first step's score, step 0 is left alone and the first later
    # step scoring above it is redone.
    assert s[1:].max() > s[0], f"no later step scores above step 0: {s}"
    tau = float(s[0])
    options = AARFOptions(tau=tau, alpha2=STRONG, max_new_tokens=n, keep_logits=True)
    res = aarf_generate(tiny_model, toy_example, detector, options)
    flags = res.intervened
    assert 0 < flags.sum() < len(flags), flags
    assert np.array_equal(flags, res.scores > tau)
    first = int(np.argmax(flags))
    assert np.array_equal(res.probability[: first + 1], s[: first + 1])
    assert res.step_logits is not None and res.base_logits is not None
    differs = [
        not np.array_equal(u, b) for u, b in zip(res.step_logits, res.base_logits, strict=True)
    ]
    assert differs == flags.tolist()
    assert np.array_equal(res.step_tokens, res.step_logits.argmax(-1))
    assert np.array_equal(res.base_tokens, res.base_logits.argmax(-1))
    # The used logits of the first intervened step are those of a scaled forward.
    ids = torch.as_tensor(
        [[*StepScorer(tiny_model, detector, toy_example).prompt_ids, *res.token_ids[:first]]]
    )
    with scaled_components(
        tiny_model, detector.selected_heads, detector.selected_layers, alpha2=STRONG, beta2=0.2
    ):
        want = _logits(tiny_model, ids)[-1]
    np.testing.assert_allclose(res.step_logits[first], want.numpy(), rtol=1e-5, atol=1e-5)
    # A strong intervention changes this model's greedy token, so the answer departs.
    assert res.step_tokens[first] != res.base_tokens[first]
    assert res.changed and res.token_ids[:first] == res.plain.token_ids[:first]
    assert _hooked(tiny_model) == []
    frame = res.to_frame(tiny_model.tokenizer)
    assert frame["intervened"].tolist() == flags.tolist() and "token" in frame


def _same_decoding(cached, uncached) -> None:
    """Token for token the same; scores and logits equal to float rounding."""
    assert cached.token_ids == uncached.token_ids and cached.text == uncached.text
    assert np.array_equal(cached.step_tokens, uncached.step_tokens)
    assert np.array_equal(cached.base_tokens, uncached.base_tokens)
    assert np.array_equal(cached.intervened, uncached.intervened)
    np.testing.assert_allclose(cached.probability, uncached.probability, atol=1e-5)
    np.testing.assert_allclose(cached.h, uncached.h, atol=1e-5)
    np.testing.assert_allclose(cached.step_logits, uncached.step_logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(cached.base_logits, uncached.base_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("when", ["some", "always"])
def test_kv_cached_decoding_equals_rerunning_the_sequence(tiny_model, detector, toy_example, when):
    """The cached path (incremental plain and scaled caches) decodes exactly what
    re-running the whole sequence at every step decodes, across steps that intervene,
    steps that do not, and runs of both (the scaled cache catching up over several
    tokens)."""
    n = 8
    options = AARFOptions(tau=1.0, max_new_tokens=n, plain=False)
    free = aarf_generate(tiny_model, toy_example, detector, options)
    # Intervene on the steps scoring above the median, or on all of them.
    tau = float(np.median(free.probability)) if when == "some" else -1.0
    # The default factor nudges the logits (same trajectory, so steps after an
    # intervened one score as before); the strong one changes the tokens.
    alpha2 = 5.0 if when == "some" else STRONG
    kw = dict(tau=tau, alpha2=alpha2, max_new_tokens=n, plain=False, keep_logits=True)
    cached = aarf_generate(tiny_model, toy_example, detector, AARFOptions(**kw))
    uncached = aarf_generate(tiny_model, toy_example, detector, AARFOptions(kv_cache=False, **kw))
    if when == "some":
        flags = uncached.intervened
        assert 0 < flags.sum() < len(flags), flags
        # A skipped step between intervened ones makes the scaled cache catch up.
        assert any(
            flags[i] and not flags[i + 1] and flags[i + 2 :].any() for i in range(len(flags) - 2)
        )
    _same_decoding(cached, uncached)
    scaled = [
        not np.allclose(u, b) for u, b in zip(cached.step_logits, cached.base_logits, strict=True)
    ]
    assert scaled == cached.intervened.tolist()
    assert _hooked(tiny_model) == []


def test_step_scorer_starts_over_on_an_answer_that_does_not_extend_the_last(
    tiny_model, detector, toy_example
):
    layout = render(toy_example, tiny_model)
    resp = layout.response_ids.tolist()
    cached = StepScorer(tiny_model, detector, toy_example)
    fresh = StepScorer(tiny_model, detector, toy_example, kv_cache=False)
    for prefix in (resp[:3], resp[:5], resp[:2], [resp[0], resp[2]], resp[:2]):
        a, b = cached(prefix), fresh(prefix)
        torch.testing.assert_close(a.logits, b.logits, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(a.ecs, b.ecs, atol=1e-5)
        assert a.probability == pytest.approx(b.probability, abs=1e-5)
    assert cached(resp[:2]) is cached(resp[:2])  # the same answer again: no new pass


def test_aarf_refuses_bad_arguments(tiny_model, detector, toy_example):
    with pytest.raises(ValueError, match="alpha2"):
        aarf_generate(tiny_model, toy_example, detector, AARFOptions(alpha2=-1.0))
    with pytest.raises(ValueError, match="give tau"):
        aarf_generate(tiny_model, toy_example, detector, AARFOptions(score="h"))
    with pytest.raises(ValueError, match="redeep_token"):
        aarf_generate(tiny_model, toy_example, make_detector("nll"))
    from core.base.errors import NotFittedError

    with pytest.raises(NotFittedError):
        aarf_generate(tiny_model, toy_example, make_detector("redeep_token"))


# --------------------------------------------------------------------------- re-scoring


def test_rescore_answers_scores_each_answer_with_every_detector(tiny_model, detector, toy_example):
    answers = {
        "given": toy_example.response,
        "short": "Ada Lovell built it in 1820.",
        "empty": "   ",
    }
    table = rescore_answers(tiny_model, AnswerPrompt.from_example(toy_example), answers, [detector])
    frame = table.to_frame()
    assert frame[["answer", "detector"]].values.tolist() == [
        ["given", "redeep_token"],
        ["short", "redeep_token"],
        ["empty", "redeep_token"],
    ]
    # A rescored answer is an unlabelled response: same score as predicting it directly.
    unlabelled = toy_example.with_response(toy_example.response)
    want = detector.predict(run_example(tiny_model, unlabelled, [detector])[detector.name])
    assert table.score("given", "redeep_token") == pytest.approx(want.score)
    assert 0 <= table.score("short", "redeep_token") <= 1
    empty = table.rows[2]
    assert empty.score is None and empty.hallucinated is None and "empty" in empty.error


# --------------------------------------------------------------------------- CLI


def test_cli_aarf_prints_both_answers_and_the_intervened_steps(
    tmp_path: Path, monkeypatch, capsys, tiny_model, detector
):
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "cli.sqlite3"))
    art = detector.save(tmp_path / "redeep_token")
    argv = [
        "aarf",
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--question",
        "Who built the Old Bridge?",
        "--passage",
        "The Old Bridge was built by Ada Lovell in 1820.",
        "--artifact",
        str(art),
        "--tau",
        "-1",
        "--alpha2",
        str(STRONG),
        "--max-new-tokens",
        "3",
        "--json",
    ]
    code = main(argv)
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["intervened_steps"] == out["steps"] == 3
    assert [s["intervened"] for s in out["step_scores"]] == [True] * 3
    assert isinstance(out["plain"], str) and isinstance(out["aarf"], str)
    assert out["plain"] != out["aarf"]
    assert {r["answer"] for r in out["rescored"]} == {"plain", "aarf"}
    assert out["heads"] == [f"L{a}H{b}" for a, b in detector.selected_heads]
    # Explicit components: --heads picks the heads, --layers '' scales no MLP.
    code = main([*argv, "--heads", "L0H1", "--layers", ""])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["heads"] == ["L0H1"] and out["layers"] == []
    assert main([*argv, "--heads", "0:1"]) == 2
    assert "L<layer>H<head>" in capsys.readouterr().err


def test_cli_aarf_default_artifact_must_match_the_model(
    tmp_path: Path, monkeypatch, capsys, detector
):
    """Without --artifact the shipped one is used, and one fitted on another model is refused."""
    art = detector.save(tmp_path / "shipped" / "redeep_token")
    cfg = json.loads((art / "cfg.json").read_text())
    cfg["model"] = "another-model|L30xH9/KV3|D576|V49152|float32"
    (art / "cfg.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(tmp_path / "shipped"))
    code = main(["aarf", "--model", "tiny", "--device", "cpu", "--max-new-tokens", "2"])
    assert code == 2
    err = capsys.readouterr().err
    assert "ragscope aarf: error:" in err and "was trained on model 'another-model" in err


def test_the_batch_compares_aarf_with_the_plain_greedy_answer(
    tiny_model, detector, toy_example, monkeypatch
):
    """AARF changes decoding, so the batch's "before" is the model's own plain answer
    (the tiny random model writes blanks, so its decoding is stood in for)."""
    import dataclasses
    from types import SimpleNamespace

    import core.interventions.mitigate
    from core.interventions.mitigate import mitigate_batch

    plain, steered = "The Old Bridge was built in 1820.", "Ada Lovell built the Old Bridge."
    seen = {}

    def fake(model, ex, det, options):
        seen.update(dataclasses.asdict(options))
        return SimpleNamespace(plain=SimpleNamespace(text=plain), text=steered)

    monkeypatch.setattr(core.interventions.mitigate, "aarf_generate", fake)
    report = mitigate_batch(
        tiny_model, [toy_example], [detector], method="aarf", max_new_tokens=6,
        aarf_options={"alpha2": 2.0},
    )  # fmt: skip
    assert seen["plain"] is True and seen["alpha2"] == 2.0 and seen["max_new_tokens"] == 6
    assert report.answers == ((plain, steered),)
    # two answers to one prompt (the corpus pairs them): decoded once
    calls = []
    monkeypatch.setattr(
        core.interventions.mitigate, "aarf_generate",
        lambda *a, **k: calls.append(1) or SimpleNamespace(plain=SimpleNamespace(text=plain), text=steered),
    )  # fmt: skip
    twin = dataclasses.replace(toy_example, id="toy-2", response="Ada Lovell built it.", spans=())
    pair = mitigate_batch(tiny_model, [toy_example, twin], [detector], method="aarf")
    assert len(calls) == 1 and pair.answers == ((plain, steered), (plain, steered))
    # both answers were scored as answers to the same prompt
    import dataclasses

    from core.interventions.counterfactual import on_template, score_one

    base = on_template(toy_example)
    want = score_one(tiny_model, [detector], dataclasses.replace(base, response=plain, spans=()))
    assert report.before["redeep_token"] == [want["redeep_token"].score]
    monkeypatch.setattr(
        core.interventions.mitigate, "aarf_generate",
        lambda *a, **k: SimpleNamespace(plain=SimpleNamespace(text="  "), text=steered),
    )  # fmt: skip
    blank = mitigate_batch(tiny_model, [toy_example], [detector], method="aarf")
    assert blank.errors and "plain answer" in blank.errors[0]


def test_bench_times_aarf_against_greedy_per_step(tiny_model, detector, toy_example):
    from core.services.bench import bench_aarf

    rep = bench_aarf(tiny_model, toy_example, 4, detector=detector, uncached=True)
    names = [r.name for r in rep.runs]
    assert names[0] == "greedy" and len(names) == 4 and any("no cache" in n for n in names)
    assert all(r.seconds > 0 and 1 <= r.steps <= 4 for r in rep.runs)
    every = next(r for r in rep.runs if "every step" in r.name)
    assert every.intervened == every.steps
    assert rep.ratio(rep.runs[0]) == pytest.approx(1.0)
    assert rep.n_prompt == render(toy_example, tiny_model).response.start
    text = "\n".join(rep.to_lines())
    assert "x greedy per step" in text and "AARF on a" in text


def test_bench_times_the_playground_against_one_forward(tiny_model, detector, toy_example):
    from core.services.bench import bench_playground

    lexical = make_detector("lexical")
    _, examples = resolve_dataset("builtin")
    pool = examples[:6]
    ext = extract_features(tiny_model, pool, [lexical])
    lexical.fit(ext.features["lexical"], ext.examples)
    # lexical reads no activations: its verdict comes before any pass, redeep's after one
    rep = bench_playground(tiny_model, toy_example, [lexical, detector], repeats=1)
    assert rep.detectors == ("lexical", "redeep_token")
    assert rep.n_tokens == len(render(toy_example, tiny_model))
    assert 0 < rep.first_verdict_s < rep.first_traced_verdict_s <= rep.streamed_s
    assert rep.forward_s > 0 and rep.separate_s > 0 and rep.first_click_s > 0
    assert rep.warm_up_s > 0
    text = "\n".join(rep.to_lines())
    assert "x forward" in text and "first verdict from activations" in text
    assert "background warm-up in a fresh process" in text and "after the warm-up" in text
