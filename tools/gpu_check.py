"""The GPU path no CPU test reaches, in one bounded run: CUDA features against CPU ones on
the tiny model, and ``ragscope bench``'s extraction throughput on random-weight models of
SmolLM2-135M's and Llama-3-8B's shapes (``random:smollm2``, ``random:llama8b``).

    python -m tools.gpu_check --device cuda --out gpu.jsonl           # on a GPU machine
    python -m tools.gpu_check --device cpu --shapes smollm2 --dtypes float32 \\
        --examples 2 --out /tmp/gpu.jsonl                              # end to end on a CPU

1. **Equality**: every detector's features of ``--equality-examples`` built-in examples
   (mixed lengths) on the tiny model in float32, on the CPU one at a time and on the
   device one at a time and ``--batch-size`` at a time; the largest absolute difference
   per detector, and whether all agree within ``--atol``/``--rtol``.
2. **Throughput**: for each shape and dtype, :func:`core.services.bench.bench_extraction` over
   ``--examples`` built-in examples (cold one at a time, cached, cold ``--batch-size``
   at a time, against one plain forward per example), then one feature pass (trace +
   every detector's features) on the ``--tokens``-token bench example against one plain
   forward of it, as ``ragscope bench --features`` does.

Each result is one JSON line in ``--out``, written as soon as it is measured; each case
runs under an alarm bounded by what is left of ``--budget-s``, and a case that runs out
of time or device memory is recorded as such and the next one runs.

Machines without spaCy, LangChain or the sentence embedder (a bare GPU machine) replay
those text steps: ``--text-record FILE`` runs every example of the run through them here
(tiny model, CPU) and saves what they returned (SPAD's part-of-speech words, sentence and
recursive chunk spans, all-MiniLM-L6-v2 chunk embeddings as float16, by text hash);
``--text-replay FILE`` answers the same calls from that file. The replayed steps cost no
time, so the GPU throughput leaves out spaCy, LangChain and the embedder (measured here:
``text_s`` in the recording's summary line). The ``lexical`` baseline (spaCy, no
activations) is left out when replaying.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gc
import gzip
import hashlib
import json
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch

import core.signals.attribution
import core.signals.chunking
import core.signals.embed
from core.base.examples import RAGExample
from core.data import resolve_dataset, stratified_head
from core.detectors import make_detector, runnable_detectors
from core.detectors.registry import MEMBERS
from core.engine.layout import render
from core.engine.model import TINY, LoadedModel, load_model
from core.learning.contract import Detector, Features
from core.pipeline.extract import extract_features, run_example
from core.services.bench import bench_example, bench_extraction

TEXT_ONLY = tuple(n for n in MEMBERS.names() if MEMBERS.get(n).reads_text_only)
"""Detectors that read no activations and need spaCy itself (left out when replaying)."""
DETECTORS = tuple(n for n in MEMBERS.names() if not MEMBERS.get(n).needs_sae)
"""What :func:`core.detectors.runnable_detectors` gives a random model (checked when
recording): a detector that needs an SAE trained on the model cannot read it. Read from
the classes' traits, because asking a detector imports sae-lens, which a bare GPU machine
lacks."""


# --------------------------------------------------------------------------- output


class Out:
    """JSON lines, flushed one by one (a killed run keeps what it measured)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = path.open("a", encoding="utf-8")

    def write(self, kind: str, **row: Any) -> None:
        line = json.dumps({"kind": kind, "t": round(time.time(), 1), **row}, default=str)
        self.f.write(line + "\n")
        self.f.flush()
        print(line, flush=True)


class Budget:
    """What is left of the run's time; each case runs under an alarm within it."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    @contextlib.contextmanager
    def case(self, limit: float) -> Iterator[None]:
        sec = int(min(limit, self.left()))
        if sec < 5:
            raise TimeoutError("no time left in the budget")

        def ring(_sig: int, _frame: object) -> None:
            raise TimeoutError(f"case ran past its {sec} s")

        old = signal.signal(signal.SIGALRM, ring)
        signal.alarm(sec)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)


# --------------------------------------------------------------------------- text steps


def _h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@contextlib.contextmanager
def text_steps(record: Path | None, replay: Path | None) -> Iterator[dict[str, Any]]:
    """Record or replay the spaCy/LangChain steps the detectors call (module doc)."""
    table: dict[str, Any] = {}
    stats = {"text_s": 0.0, "calls": 0}
    if replay is not None:
        table = json.loads(gzip.decompress(replay.read_bytes()))
    words0 = core.signals.attribution.spacy_words
    sents0 = core.signals.chunking.split_sentences_many
    rec0 = core.signals.chunking.split_recursive
    load0 = core.signals.embed.SentenceEmbedder._load

    def look(key: str) -> Any:
        if key not in table:
            raise KeyError(f"text step {key} is not in {replay}; record it with --text-record")
        return table[key]

    def timed(fn: Callable[..., Any], *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*a, **k)
        stats["text_s"] += time.perf_counter() - t0
        stats["calls"] += 1
        return out

    def words(text: str) -> list[tuple[int, int, str]]:
        key = f"w:{_h(text)}"
        if replay is not None:
            return [tuple(w) for w in look(key)]
        table[key] = out = timed(words0, text)
        return out

    def sents(texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        keys = [f"s:{_h(t)}" for t in texts]
        if replay is not None:
            return [[tuple(s) for s in look(k)] for k in keys]
        out = timed(sents0, texts)
        table.update(zip(keys, out, strict=True))
        return out

    def recursive(text: str, *, chunk_size: int, chunk_overlap: int) -> list[tuple[int, int]]:
        key = f"r:{chunk_size}:{chunk_overlap}:{_h(text)}"
        if replay is not None:
            return [tuple(s) for s in look(key)]
        out = timed(rec0, text, chunk_size=chunk_size, chunk_overlap=chunk_overlap)
        table[key] = out
        return out

    def vec(v: np.ndarray) -> str:
        return base64.b64encode(np.asarray(v, np.float16).tobytes()).decode()

    class Replayed:
        """The sentence embedder's ``encode``, answered from the recording."""

        def encode(self, texts: Sequence[str], **_: Any) -> np.ndarray:
            rows = [base64.b64decode(look(f"e:{_h(t)}")) for t in texts]
            return np.stack([np.frombuffer(r, np.float16).astype(np.float32) for r in rows])

    class Recording:
        """The sentence embedder's ``encode``, its vectors recorded (as float16)."""

        def __init__(self, real: Any) -> None:
            self.real = real

        def encode(self, texts: Sequence[str], **kw: Any) -> np.ndarray:
            out = timed(self.real.encode, texts, **kw)
            table.update({f"e:{_h(t)}": vec(v) for t, v in zip(texts, out, strict=True)})
            return out

    def load(self: core.signals.embed.SentenceEmbedder) -> Any:
        if self._model is None:
            self._model = Replayed() if replay is not None else Recording(load0(self))
        return self._model

    if record is not None or replay is not None:
        core.signals.embed.SentenceEmbedder._load = load  # type: ignore[method-assign]
        core.signals.attribution.spacy_words = words
        core.signals.chunking.split_sentences_many = sents
        core.signals.chunking.split_recursive = recursive  # type: ignore[assignment]
    try:
        yield stats
    finally:
        core.signals.embed.SentenceEmbedder._load = load0  # type: ignore[method-assign]
        core.signals.attribution.spacy_words = words0
        core.signals.chunking.split_sentences_many = sents0
        core.signals.chunking.split_recursive = rec0
        if record is not None:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_bytes(gzip.compress(json.dumps(table).encode(), mtime=0))


# --------------------------------------------------------------------------- examples


def equality_examples(n: int) -> list[RAGExample]:
    """``n`` built-in examples of mixed lengths (shortest, longest, between)."""
    pool = sorted(resolve_dataset("builtin")[1], key=lambda e: (sum(map(len, e.passages)), e.id))
    idx = np.linspace(0, len(pool) - 1, n).round().astype(int)
    return [pool[i] for i in idx]


def throughput_examples(n: int) -> list[RAGExample]:
    """The examples :func:`core.services.bench.bench_extraction` times."""
    return stratified_head(resolve_dataset("builtin")[1], n)


def detector_names(replaying: bool) -> list[str]:
    return [n for n in DETECTORS if not (replaying and n in TEXT_ONLY)]


# --------------------------------------------------------------------------- measurements


def _arrays(f: Features) -> Iterator[tuple[str, np.ndarray]]:
    yield "response", f.response
    if f.tokens is not None:
        yield "tokens", f.tokens
    if f.chunks is not None:
        yield "chunks", f.chunks


def compare(
    want: dict[str, tuple[Features, ...]],
    got: dict[str, tuple[Features, ...]],
    atol: float,
    rtol: float,
) -> dict[str, dict[str, Any]]:
    """Per detector: max |got - want| over every example and array, and allclose."""
    out = {}
    for name, fs in want.items():
        worst, ok, worst_where = 0.0, True, ""
        for f, g in zip(fs, got[name], strict=True):
            for (part, a), (_, b) in zip(_arrays(f), _arrays(g), strict=True):
                if a.shape != b.shape:
                    ok, worst_where = False, f"{f.example_id}/{part}: shape {a.shape} vs {b.shape}"
                    continue
                a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
                d = np.abs(a64 - b64)
                d = np.where(np.isnan(a64) & np.isnan(b64), 0.0, d)
                if d.size and float(np.nanmax(d)) > worst:
                    worst, worst_where = float(np.nanmax(d)), f"{f.example_id}/{part}"
                ok &= bool(np.allclose(b64, a64, atol=atol, rtol=rtol, equal_nan=True))
        out[name] = {"max_abs": worst, "where": worst_where, "ok": ok}
    return out


def check_equality(
    out: Out,
    budget: Budget,
    device: str,
    n: int,
    batch: int,
    atol: float,
    rtol: float,
    replay: bool,
) -> None:
    exs = equality_examples(n)
    cpu = load_model(TINY, device="cpu")
    dev = load_model(TINY, device=device)
    names = detector_names(replay)

    def feats(model: LoadedModel, b: int) -> dict[str, tuple[Features, ...]]:
        dets = [make_detector(x) for x in names]
        return dict(extract_features(model, exs, dets, batch_size=b).features)

    with budget.case(240):
        t0 = time.perf_counter()
        want = feats(cpu, 1)
        cpu_s = time.perf_counter() - t0
        for b in (1, batch):
            t0 = time.perf_counter()
            got = feats(dev, b)
            sec = time.perf_counter() - t0
            res = compare(want, got, atol, rtol)
            out.write(
                "equality",
                model=cpu.info.display_name,
                against="cpu, one at a time",
                device=device,
                batch_size=b,
                examples=[e.id for e in exs],
                tokens=[len(render(e, cpu)) for e in exs],
                atol=atol,
                rtol=rtol,
                all_ok=all(r["ok"] for r in res.values()),
                detectors=res,
                cpu_s=round(cpu_s, 2),
                device_s=round(sec, 2),
            )


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def feature_pass(model: LoadedModel, dets: list[Detector], n_tokens: int, repeats: int) -> dict:
    """One traced pass + every detector's features on the bench example, against one
    plain forward of it (medians), as ``ragscope bench --features`` times it."""
    example, layout = bench_example(model, n_tokens)
    ids = torch.as_tensor(layout.token_ids, device=model.device).unsqueeze(0)

    def med(fn: Callable[[], object]) -> float:
        fn()
        _sync(model.device)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            _sync(model.device)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def plain() -> None:
        with torch.inference_mode():
            model.hf_model(ids)

    fwd = med(plain)
    feat = med(lambda: run_example(model, example, dets))
    return {
        "n_tokens": len(layout),
        "forward_s": fwd,
        "feature_pass_s": feat,
        "ratio": feat / fwd,
        "tokens_per_s": len(layout) / feat,
    }


def _why(e: BaseException) -> str:
    tb = "".join(traceback.format_exception(e)[-6:])
    return f"{e}"[:400] + " | " + tb[-1500:]


def _cuda_mib() -> dict[str, float]:
    if not torch.cuda.is_available():
        return {}
    return {
        "cuda_peak_mib": round(torch.cuda.max_memory_allocated() / 2**20),
        "cuda_now_mib": round(torch.cuda.memory_allocated() / 2**20),
    }


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def throughput(
    out: Out, budget: Budget, args: argparse.Namespace, shape: str, dtype: str, replay: bool
) -> None:
    spec = f"random:{shape}"
    row: dict[str, Any] = {"model": spec, "dtype": dtype, "device": args.device}
    model = None
    try:
        with budget.case(args.case_s):
            t0 = time.perf_counter()
            model = load_model(spec, device=args.device, dtype=dtype)
            _sync(args.device)
            row.update(
                load_s=round(time.perf_counter() - t0, 1),
                n_params=model.info.n_params,
                key=model.info.key,
            )
            names = detector_names(replay)
            ext = bench_extraction(
                model, args.examples, detectors=tuple(names), batch_sizes=(args.batch_size,)
            )
            b = args.batch_size
            cold_b = ext.batched_s[b]
            row.update(
                detectors=list(ext.detectors),
                n_examples=ext.n_examples,
                mean_tokens=round(ext.mean_tokens, 1),
                plain_s=ext.plain_s,
                cold_b1_s=ext.cold_s,
                warm_s=ext.warm_s,
                **{f"cold_b{b}_s": cold_b},
                b1_examples_per_s=ext.n_examples / ext.cold_s,
                **{f"b{b}_examples_per_s": ext.n_examples / cold_b},
                b1_tokens_per_s=ext.tokens_per_s(ext.cold_s),
                **{f"b{b}_tokens_per_s": ext.tokens_per_s(cold_b)},
                b1_ratio_to_forward=ext.cold_s / ext.plain_s,
                **{f"b{b}_ratio_to_forward": cold_b / ext.plain_s},
                **{f"b{b}_speedup": ext.cold_s / cold_b},
                **_cuda_mib(),
            )
            out.write("extraction", **row)
            dets = [make_detector(x) for x in names]
            fp = feature_pass(model, dets, args.tokens, args.repeats)
            out.write(
                "feature_pass", model=spec, dtype=dtype, device=args.device, **fp, **_cuda_mib()
            )
    except Exception as e:  # noqa: BLE001 -- any failure is a result; the next case runs
        kind = "oom" if isinstance(e, torch.cuda.OutOfMemoryError) else type(e).__name__
        out.write("case_failed", **row, error=kind, message=_why(e), **_cuda_mib())
    finally:
        del model
        _free()


# --------------------------------------------------------------------------- main


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "transformer_lens": version("transformer-lens"),
        "datasets": _version("datasets"),
        "pyarrow": _version("pyarrow"),
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "device": device,
    }
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        env.update(
            gpu=p.name,
            gpu_mib=round(p.total_memory / 2**20),
            cuda=torch.version.cuda,
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
        )
    return env


def record(args: argparse.Namespace) -> int:
    """Run every example of a device run through the text steps (tiny model, CPU)."""
    exs = {e.id: e for e in equality_examples(args.equality_examples)}
    exs.update({e.id: e for e in throughput_examples(args.examples)})
    model = load_model(TINY, device="cpu")
    if tuple(runnable_detectors(model)) != DETECTORS:
        raise SystemExit(f"DETECTORS is stale: runnable now {runnable_detectors(model)}")
    with text_steps(Path(args.text_record), None) as stats:
        dets = [make_detector(x) for x in detector_names(True)]
        extract_features(model, list(exs.values()), dets, batch_size=1)
        run_example(model, bench_example(model, args.tokens)[0], dets)
    print(json.dumps({"kind": "recorded", "examples": len(exs) + 1, **stats}))
    return 0


def table(path: Path) -> str:
    """The results of a run (its JSON lines) as Markdown tables."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    env: dict[str, Any] = next((r for r in rows if r["kind"] == "env"), {})
    lines = [
        f"{env.get('gpu', env.get('device', '?'))}, torch {env.get('torch')}, transformers "
        f"{env.get('transformers')}, TransformerLens {env.get('transformer_lens')}, "
        f"Python {env.get('python')}",
        "",
        "| tiny model, float32: device vs CPU (one at a time) | batch | detectors | "
        "max abs diff | where | all within tolerance |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["kind"] != "equality":
            continue
        d = r["detectors"]
        worst = max(d, key=lambda k: d[k]["max_abs"])
        per = ", ".join(f"{k} {v['max_abs']:.1e}" for k, v in d.items())
        lines.append(
            f"| {len(r['examples'])} examples ({min(r['tokens'])}-{max(r['tokens'])} tokens) | "
            f"{r['batch_size']} | {per} | {d[worst]['max_abs']:.1e} ({worst}) | "
            f"{d[worst]['where']} | {r['all_ok']} (atol {r['atol']}, rtol {r['rtol']}) |"
        )
    lines += [
        "",
        "| model | dtype | load s | examples (mean tokens) | plain forward s/example | "
        "batch 1: examples/s, tokens/s, x forward | batch 8: examples/s, tokens/s, x forward | "
        "batch 8 speed-up | feature pass at ~600 tokens: ms, x forward | peak GPU MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    fps = {(r["model"], r["dtype"]): r for r in rows if r["kind"] == "feature_pass"}
    for r in rows:
        if r["kind"] == "case_failed" and "model" in r:
            lines.append(
                f"| {r['model']} | {r['dtype']} | {r.get('load_s', '')} | failed: {r['error']} "
                f"({' '.join(r['message'].split('|')[0].split())[:120]}) | | | | | | "
                f"{r.get('cuda_peak_mib', '')} |"
            )
        if r["kind"] != "extraction":
            continue
        fp = fps.get((r["model"], r["dtype"]))
        b = next(int(k[6:-2]) for k in r if k.startswith("cold_b") and k != "cold_b1_s")
        fp_cell = (
            f"{fp['feature_pass_s'] * 1000:.0f} ms, {fp['ratio']:.2f} x ({fp['n_tokens']} tokens)"
            if fp
            else "-"
        )
        lines.append(
            f"| {r['model']} ({r['n_params'] / 1e9:.2f} B) | {r['dtype']} | {r['load_s']} | "
            f"{r['n_examples']} ({r['mean_tokens']:.0f}) | "
            f"{r['plain_s'] / r['n_examples'] * 1000:.1f} ms | "
            f"{r['b1_examples_per_s']:.2f}, {r['b1_tokens_per_s']:.0f}, "
            f"{r['b1_ratio_to_forward']:.1f} x | "
            f"{r[f'b{b}_examples_per_s']:.2f}, {r[f'b{b}_tokens_per_s']:.0f}, "
            f"{r[f'b{b}_ratio_to_forward']:.1f} x | {r[f'b{b}_speedup']:.2f} x | {fp_cell} | "
            f"{r.get('cuda_peak_mib', '-')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=Path("gpu.jsonl"))
    ap.add_argument("--shapes", default="smollm2,llama8b")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--examples", type=int, default=16)
    ap.add_argument("--equality-examples", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--budget-s", type=float, default=380.0)
    ap.add_argument("--case-s", type=float, default=150.0, help="most seconds one case may take")
    ap.add_argument("--no-equality", action="store_true")
    ap.add_argument("--text-record", metavar="FILE")
    ap.add_argument("--text-replay", metavar="FILE")
    ap.add_argument("--table", metavar="JSONL", help="print a run's results as Markdown")
    args = ap.parse_args(argv)
    if args.table:
        print(table(Path(args.table)), end="")
        return 0
    if args.text_record:
        return record(args)
    budget = Budget(args.budget_s)
    out = Out(args.out)
    replay = Path(args.text_replay) if args.text_replay else None
    out.write("env", **environment(args.device), argv=sys.argv[1:])
    with text_steps(None, replay):
        if not args.no_equality:
            try:
                check_equality(
                    out,
                    budget,
                    args.device,
                    args.equality_examples,
                    args.batch_size,
                    args.atol,
                    args.rtol,
                    replay is not None,
                )
            except Exception as e:  # noqa: BLE001 -- recorded; the throughput cases still run
                out.write("case_failed", case="equality", error=type(e).__name__, message=_why(e))
            _free()
        for shape in args.shapes.split(","):
            for dtype in args.dtypes.split(","):
                throughput(out, budget, args, shape, dtype, replay is not None)
    out.write("done", left_s=round(budget.left(), 1), pid=os.getpid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
