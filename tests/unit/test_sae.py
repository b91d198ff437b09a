"""The residual-stream SAE (sae-lens on TransformerLens 4): corpus, activations, training,
save/load, quality numbers and the command line, on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from core.base.errors import DataError, ModelError
from core.cli import main
from core.engine.layout import render
from core.engine.sae_compat import import_sae_lens
from core.engine.trace import Needs, residuals_until, trace
from core.signals.sae import (
    META_FILE,
    evaluate_sae,
    example_ids,
    is_held_out,
    load_pretrained,
    load_sae,
    sae_corpus,
    save_sae,
)


def test_sae_lens_imports_under_transformer_lens_4() -> None:
    sl = import_sae_lens()
    assert hasattr(sl, "TopKTrainingSAE") and hasattr(sl, "SAETrainer")
    from transformer_lens import HookedTransformer

    with pytest.raises(ImportError, match="TransformerBridge"):
        HookedTransformer()


def test_a_second_thread_waits_for_the_whole_sae_lens_import() -> None:
    # sae_lens enters sys.modules seconds before its __init__ registers the SAE
    # architectures; a thread asking meanwhile must get the finished module (a Playground
    # judging an answer while another thread loads an SAE once got ``KeyError: 'topk'``).
    # A fresh interpreter, so that sae_lens is not imported yet.
    script = textwrap.dedent(
        """
        import sys, threading, time
        from core.engine.sae_compat import import_sae_lens
        first = threading.Thread(target=import_sae_lens)
        first.start()
        while "sae_lens" not in sys.modules:
            time.sleep(0.001)
        assert first.is_alive(), "the import finished before the second thread asked"
        sl = import_sae_lens()
        from sae_lens.registry import SAE_CLASS_REGISTRY
        print(sorted(SAE_CLASS_REGISTRY) if "topk" in SAE_CLASS_REGISTRY else "HALF-BUILT")
        first.join()
        """
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'topk'" in done.stdout, done.stdout


def test_corpus_holds_out_whole_sources_and_records_hashes(monkeypatch, tmp_path) -> None:
    from core.base.examples import source_key

    monkeypatch.setenv("RAGSCOPE_SHARED_DATA", str(tmp_path / "absent"))
    c = sae_corpus(("demo", "builtin", "shared:ragtruth_qa_dev.jsonl"))
    assert c.skipped == ("shared:ragtruth_qa_dev.jsonl",)
    assert [s.name for s in c.sources] == ["demo", "builtin"]
    assert all(len(s.content_sha256) == 64 for s in c.sources)
    assert {source_key(e) for e in c.train}.isdisjoint({source_key(e) for e in c.held_out})
    assert all(is_held_out(e) for e in c.held_out) and not any(is_held_out(e) for e in c.train)
    assert 0.03 < len(c.held_out) / (len(c.train) + len(c.held_out)) < 0.2
    # Same inputs, same record.
    assert sae_corpus(("demo", "builtin")).sources == c.sources
    with pytest.raises(DataError, match="no such file"):
        sae_corpus(("no-such-dataset",))


def test_residuals_stop_early_but_equal_the_traced_stream(tiny_model, toy_example) -> None:
    layout = render(toy_example, tiny_model)
    tr = trace(tiny_model, layout, Needs.of(["resid_post"], layers=[1], positions="all"))
    got = residuals_until(tiny_model, example_ids(tiny_model, toy_example), 1)
    torch.testing.assert_close(got, tr.get("resid_post", 1), rtol=1e-5, atol=1e-5)
    # No hook is left behind by the early stop.
    assert not any(hp.fwd_hooks for hp in tiny_model.bridge.hook_dict.values())


def test_trained_sae_reconstructs_and_round_trips(
    tiny_model, tiny_sae, toy_example, tmp_path
) -> None:
    x = residuals_until(tiny_model, example_ids(tiny_model, toy_example), 1)[1:]
    f = tiny_sae.encode(x)
    assert f.shape == (x.shape[0], tiny_sae.d_sae) and f.dtype == torch.float32
    assert ((f > 0).sum(1) <= 8).all()  # TopK, k = 8
    pre = tiny_sae.encode(x, "pre")
    assert ((pre > 0).sum(1) >= (f > 0).sum(1)).all()  # before the top-k cut
    active = f > 0
    torch.testing.assert_close(pre[active], f[active], rtol=1e-4, atol=1e-5)
    rec = tiny_sae.decode(f)
    fve = 1 - ((x - rec) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    assert fve > 0.3
    # fp16 on disk, float32 in memory, same features up to fp16 rounding.
    out = save_sae(
        tiny_sae.sae.half(), tmp_path / "half", layer=1, model_key=tiny_model.info.key, meta={}
    )
    tiny_sae.sae.float()
    again = load_sae(out)
    assert again.sae.W_enc.dtype == torch.float32 and again.layer == 1
    meta = json.loads((out / META_FILE).read_text())
    assert meta["hook"] == "blocks.1.hook_resid_post" and len(meta["weights_sha256"]) == 64
    torch.testing.assert_close(again.encode(x), f, rtol=2e-2, atol=2e-2)


def test_quality_numbers_are_consistent(tiny_model, tiny_sae) -> None:
    held = sae_corpus(("demo", "builtin")).held_out[:6]
    q = evaluate_sae(tiny_model, tiny_sae, held)
    assert 0.0 < q.fve <= 1.0 and q.mean_l0 == pytest.approx(8.0)
    assert 0.0 <= q.dead_fraction < 1.0 and q.n_examples == 6
    n_tok = sum(len(example_ids(tiny_model, e)) - 1 for e in held)
    assert q.n_tokens == n_tok
    # The clean CE is the model's own next-token loss.
    ids = torch.as_tensor(example_ids(tiny_model, held[0]))[None]
    with torch.inference_mode():
        logits = tiny_model.bridge(ids, return_type="logits")
    ce0 = torch.nn.functional.cross_entropy(logits[0, :-1].double(), ids[0, 1:]).item()
    one = evaluate_sae(tiny_model, tiny_sae, held[:1])
    assert one.ce_clean == pytest.approx(ce0, rel=1e-5)
    assert set(q.to_dict()) >= {"fve", "ce_increase", "ce_recovered", "dead_fraction"}


def test_bad_folders_and_models_get_clear_errors(tmp_path, tiny_sae) -> None:
    with pytest.raises(DataError, match="ragscope sae train"):
        load_sae(tmp_path)
    with pytest.raises(ModelError, match="trained on"):
        tiny_sae.check_model("some-other-model", tiny_sae.d_in)
    with pytest.raises(ModelError, match="-dim"):
        tiny_sae.check_model(tiny_sae.model_key, tiny_sae.d_in + 1)


def test_registry_sae_offline_fails_clearly(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="network access"):
        load_pretrained("gpt2-small-res-jb", "blocks.8.hook_resid_pre")


def test_cli_trains_and_evaluates_an_sae(tmp_path: Path, capsys, monkeypatch, tiny_model) -> None:
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "sae"
    # A slice of the built-in corpus (a source spec takes one): 219 answers to trace, not 1,631.
    argv = ["--model", "tiny", "--sources", "demo,builtin[:240]", "--eval-tokens", "3000"]
    code = main(["sae", "train", *argv, "--training-tokens", "8192", "--k", "4", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "fraction of variance explained" in text and "saved the SAE (layer 1" in text
    meta = json.loads((out / META_FILE).read_text())
    assert meta["settings"]["k"] == 4 and meta["activation_tokens"] > 8192 // 4
    assert [s["name"] for s in meta["corpus"]["sources"]] == ["demo", "builtin"]
    assert meta["corpus"]["sources"][1]["spec"] == "builtin[:240]"  # the slice, to redo it
    assert main(["sae", "eval", *argv, "--sae", str(out), "--json"]) == 0
    rep = json.loads("{" + capsys.readouterr().out.split("\n{", 1)[1])
    assert rep["mean_l0"] == pytest.approx(4.0) and rep["fve"] == pytest.approx(
        meta["quality"]["fve"], rel=1e-6
    )
    # Without --out a non-embedded model has nowhere to go.
    assert main(["sae", "train", *argv]) == 2
    assert "--out" in capsys.readouterr().err
    assert np.isfinite(meta["seconds"]["total"])
