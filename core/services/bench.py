"""Benchmarks of the heavy paths, reported as ratios measured in one run.

``ragscope bench`` loads the model cold (dequantizing the GGUF into a fresh
cache) and warm (from that cache), then times, on a RAG example of about
``n_tokens`` tokens, a plain HF forward pass against the trace engine with
several realistic sets of needs. Ratios are what to compare across machines;
seconds are for this machine only.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.data import builtin_examples, resolve_dataset, stratified_head
from core.detectors import DETECTORS, make_detector, runnable_detectors
from core.engine.generate import GenerationConfig, generate
from core.engine.layout import Layout, render
from core.engine.model import EMBEDDED, LoadedModel, load_model, prepare_embedded
from core.engine.trace import Needs, response_needs, token_surprisal, trace
from core.interventions.aarf import AARFOptions, aarf_generate
from core.learning.contract import Detector
from core.pipeline.extract import FeatureCache, extract_features, run_example
from core.pipeline.judge import AnswerVerdict, judge_many, judge_stream, warm_up
from core.pipeline.sets import load_set, set_detector
from core.signals.copying_heads import copying_scores
from core.storage import Store

_FILLER = (
    "The harbour town of Westmere grew around a tidal mill built in 1612. Its stone quay was "
    "extended twice, first in 1790 for the herring fleet and again in 1884 when the railway "
    "arrived. The mill stopped grinding grain in 1931 and now houses a small museum of tools, "
    "ledgers and photographs of the fishing families who worked the estuary."
)


@dataclass(frozen=True, kw_only=True)
class TimedCase:
    """One traced configuration: median seconds and ratio to the plain forward."""

    name: str
    seconds: float
    ratio: float
    kept_mib: float


@dataclass(frozen=True, kw_only=True)
class BenchReport:
    """Everything ``ragscope bench`` measured, in one run."""

    model: str
    device: str
    n_tokens: int
    repeats: int
    cold_load_s: float | None
    warm_load_s: float
    forward_s: float
    cases: tuple[TimedCase, ...]
    peak_rss_mib: float
    peak_cuda_mib: float | None
    extraction: ExtractionBench | None = None
    feature_cases: tuple[TimedCase, ...] = ()
    copying_s: float | None = None
    aarf: AARFBench | None = None
    playground: PlaygroundBench | None = None
    judge: tuple[JudgeBench, ...] = ()
    env: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["cases"] = [dict(vars(c)) for c in self.cases]
        d["feature_cases"] = [dict(vars(c)) for c in self.feature_cases]
        d["extraction"] = dict(vars(self.extraction)) if self.extraction else None
        if self.aarf is not None:
            d["aarf"] = {**vars(self.aarf), "runs": [dict(vars(r)) for r in self.aarf.runs]}
        d["playground"] = dict(vars(self.playground)) if self.playground else None
        d["judge"] = [
            {**vars(j), "answers_per_min": j.answers_per_min, "ratio": j.ratio} for j in self.judge
        ]
        return d

    def to_text(self) -> str:
        lines = [
            f"model {self.model} on {self.device}; {self.n_tokens}-token RAG example; "
            f"median of {self.repeats}",
            "cold load (dequantize + cache + load): "
            + (f"{self.cold_load_s:.1f} s" if self.cold_load_s is not None else "skipped"),
            f"warm load (from cache):                {self.warm_load_s:.1f} s",
            f"plain HF forward:                      {self.forward_s * 1000:.0f} ms",
        ]
        for c in self.cases:
            lines.append(
                f"trace [{c.name}]: {c.seconds * 1000:.0f} ms = {c.ratio:.2f} x forward "
                f"(kept {c.kept_mib:.1f} MiB)"
            )
        for c in self.feature_cases:
            lines.append(
                f"feature pass [{c.name}] (trace + features): {c.seconds * 1000:.0f} ms = "
                f"{c.ratio:.2f} x forward"
            )
        if self.copying_s is not None:
            lines.append(f"copying scores, every head (uncached): {self.copying_s:.2f} s")
        if self.extraction is not None:
            lines.extend(self.extraction.to_lines())
        if self.aarf is not None:
            lines.extend(self.aarf.to_lines())
        if self.playground is not None:
            lines.extend(self.playground.to_lines())
        for j in self.judge:
            lines.extend(j.to_lines())
        lines.append(f"peak RSS {self.peak_rss_mib:.0f} MiB")
        if self.peak_cuda_mib is not None:
            lines.append(f"peak CUDA {self.peak_cuda_mib:.0f} MiB")
        lines.append(" | ".join(f"{k} {v}" for k, v in self.env.items()))
        return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class ExtractionBench:
    """Batch feature extraction over real corpus examples: cold, cached, and plain forwards.

    Attributes:
        detectors: The detectors extracted together (one trace per example).
        n_examples: Examples extracted.
        mean_tokens: Mean layout length of those examples.
        plain_s: Total time of one plain HF forward per example (the floor).
        cold_s: Extraction with an empty feature cache.
        warm_s: The same extraction again, every example a cache hit.
    """

    detectors: tuple[str, ...]
    n_examples: int
    mean_tokens: float
    dataset: str = "builtin"
    plain_s: float
    cold_s: float
    warm_s: float
    batched_s: dict[int, float] = field(default_factory=dict)
    ray_s: float | None = None
    ray_actors: int = 0

    @property
    def cold_per_min(self) -> float:
        return 60.0 * self.n_examples / self.cold_s

    @property
    def warm_per_min(self) -> float:
        return 60.0 * self.n_examples / self.warm_s

    def tokens_per_s(self, seconds: float) -> float:
        """Layout tokens (prompt + answer) extracted per second in ``seconds``."""
        return self.n_examples * self.mean_tokens / seconds

    def to_lines(self) -> list[str]:
        return (
            [
                f"extraction [{', '.join(self.detectors)}] over {self.n_examples} {self.dataset} examples "
                f"(mean {self.mean_tokens:.0f} tokens):",
                f"  cold cache: {self.cold_s:.1f} s = {self.cold_per_min:.0f} examples/min "
                f"({self.tokens_per_s(self.cold_s):.0f} tokens/s) = "
                f"{self.cold_s / self.plain_s:.2f} x one plain forward per example",
                f"  warm cache: {self.warm_s:.2f} s = {self.warm_per_min:.0f} examples/min; "
                f"cache speed-up {self.cold_s / self.warm_s:.0f} x",
            ]
            + [
                f"  cold, {b} examples per forward pass: {sec:.1f} s = "
                f"{60.0 * self.n_examples / sec:.0f} examples/min "
                f"({self.tokens_per_s(sec):.0f} tokens/s) = {sec / self.plain_s:.2f} x "
                f"one plain forward per example ({self.cold_s / sec:.2f} x the speed of one at a time)"
                for b, sec in self.batched_s.items()
            ]
            + (
                []
                if self.ray_s is None
                else [
                    f"  cold, Ray local ({self.ray_actors} actors, start-up included): "
                    f"{self.ray_s:.1f} s = {60.0 * self.n_examples / self.ray_s:.0f} examples/min "
                    f"= {self.ray_s / self.plain_s:.2f} x one plain forward per example "
                    f"({self.cold_s / self.ray_s:.2f} x the speed of one process)"
                ]
            )
        )


RayTimer = Callable[[LoadedModel, list[RAGExample], tuple[str, ...]], tuple[float, int]]
"""Times a cold extraction of (model, examples, detector names) on Ray: (seconds, actors)."""


def bench_extraction(
    model: LoadedModel,
    n_examples: int = 60,
    detectors: tuple[str, ...] | None = None,
    batch_sizes: tuple[int, ...] = (),
    dataset: str = "builtin",
    ray: RayTimer | None = None,
) -> ExtractionBench:
    """Time :func:`core.pipeline.extract.extract_features` on ``n_examples`` built-in examples,
    one at a time (cold and cached) and, cold again, with each of ``batch_sizes``
    examples per forward pass.

    The caches live in throw-away stores, so the cold passes really compute.
    """
    import torch

    names = tuple(detectors or runnable_detectors(model))
    exs = stratified_head(resolve_dataset(dataset)[1], n_examples)
    layouts = [render(e, model) for e in exs]

    def plain_all() -> None:
        with torch.inference_mode():
            for lay in layouts:
                model.hf_model(torch.as_tensor(lay.token_ids, device=model.device).unsqueeze(0))
        _sync(model)  # CUDA runs ahead of the host: time the work, not its launch

    plain_all()  # warm-up
    t0 = time.perf_counter()
    plain_all()
    plain_s = time.perf_counter() - t0
    with (
        tempfile.TemporaryDirectory(prefix="ragscope-bench-") as tmp,
        Store(f"{tmp}/bench.sqlite3") as store,
    ):
        cache = FeatureCache(store)
        dets = [make_detector(n) for n in names]
        extract_features(model, exs[:1], dets)  # warm-up: lazy loads (spaCy, ...) not timed
        cold = extract_features(model, exs, dets, cache=cache, batch_size=1)
        warm = extract_features(model, exs, dets, cache=cache, batch_size=1)
        batched = {}
        for b in batch_sizes:
            with Store(f"{tmp}/bench-{b}.sqlite3") as fresh:
                t0 = time.perf_counter()
                extract_features(model, exs, dets, cache=FeatureCache(fresh), batch_size=b)
                batched[b] = time.perf_counter() - t0
    ray_run = None if ray is None else ray(model, exs, names)
    if warm.cache_hits != len(exs):
        raise RuntimeError(f"expected {len(exs)} cache hits, got {warm.cache_hits}")
    return ExtractionBench(
        detectors=names,
        n_examples=len(exs),
        dataset=dataset,
        ray_s=ray_run[0] if ray_run else None,
        ray_actors=ray_run[1] if ray_run else 0,
        mean_tokens=sum(len(x) for x in layouts) / len(layouts),
        plain_s=plain_s,
        cold_s=cold.seconds,
        warm_s=warm.seconds,
        batched_s=batched,
    )


@dataclass(frozen=True, kw_only=True)
class JudgeBench:
    """``ragscope judge``'s throughput with one detector set, against one plain forward
    per answer, measured in one run (no feature cache: every answer traced).

    Attributes:
        set_name: The detector set.
        detectors: Its detectors, in order.
        dataset: Where the answers come from.
        n_answers: Answers judged (those that could not be are left out of both timings).
        mean_tokens: Mean layout length (prompt + answer) of those answers.
        plain_s: One plain HF forward per answer, in total (each timed just before
            that answer is judged).
        judge_s: :func:`core.pipeline.judge.judge_many` over them, one answer per pass.
    """

    set_name: str
    detectors: tuple[str, ...]
    dataset: str
    n_answers: int
    mean_tokens: float
    plain_s: float
    judge_s: float

    @property
    def answers_per_min(self) -> float:
        return 60.0 * self.n_answers / self.judge_s

    @property
    def ratio(self) -> float:
        """Judging time as a multiple of one plain forward per answer."""
        return self.judge_s / self.plain_s

    def to_lines(self) -> list[str]:
        return [
            f"judge with the {self.set_name} set [{', '.join(self.detectors)}] over "
            f"{self.n_answers} {self.dataset} answers (mean {self.mean_tokens:.0f} tokens): "
            f"{self.judge_s:.1f} s = {self.answers_per_min:.1f} answers/min = "
            f"{self.ratio:.2f} x one plain forward per answer ({self.n_answers} plain "
            f"forwards: {self.plain_s:.1f} s)"
        ]


def bench_judge(
    model: LoadedModel,
    n_answers: int = 20,
    sets: tuple[str | None, ...] = (None,),
    dataset: str = "builtin",
) -> list[JudgeBench]:
    """Time :func:`core.pipeline.judge.judge_many` (no feature cache) with each of ``sets``
    (``None``: the set that applies) on the first ``n_answers`` answers of ``dataset``
    that the model can lay out, against one plain forward per answer, in one run.

    Each answer's plain forward and its judging alternate, so both see the same state of
    a noisy machine: timed in separate blocks, the five plain forwards of the same
    RAGTruth answers took 9.0 s in one run and 7.3 s in another while judging took 57.6
    and 61.7 s, which read as 6.4x and 8.4x.

    Raises:
        DataError: A set has no detectors for the model, or no answer fits the model.
    """
    import torch

    exs, layouts = [], []
    for e in stratified_head(resolve_dataset(dataset)[1], n_answers)[:n_answers]:
        try:
            layouts.append(render(e, model))
            exs.append(e)
        except DataError:
            continue  # longer than the model's context: judge would skip it too
    if not exs:
        raise DataError(f"no answer of {dataset} fits {model.info.display_name}")

    def plain(layout: Layout) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.hf_model(torch.as_tensor(layout.token_ids, device=model.device).unsqueeze(0))
        _sync(model)
        return time.perf_counter() - t0

    plain(layouts[0])  # warm-up
    out = []
    for name in sets:
        dset = load_set(model.info.key, name)
        if dset.error or not dset.detectors:
            raise DataError(
                dset.error or f"the {dset.name} set has no detectors for {model.info.display_name}"
            )
        list(judge_many(model, exs[:1], dset, batch_size=1))  # warm-up: lazy loads not timed
        plain_s = judge_s = 0.0
        failed = 0
        for e, layout in zip(exs, layouts, strict=True):
            plain_s += plain(layout)
            t0 = time.perf_counter()
            got = list(judge_many(model, [e], dset, batch_size=1))
            judge_s += time.perf_counter() - t0
            failed += sum(not isinstance(g, AnswerVerdict) for g in got)
        if failed:
            raise DataError(f"{failed} of {len(exs)} answers could not be judged")
        out.append(
            JudgeBench(
                set_name=dset.name,
                detectors=dset.names,
                dataset=dataset,
                n_answers=len(exs),
                mean_tokens=sum(len(x) for x in layouts) / len(layouts),
                plain_s=plain_s,
                judge_s=judge_s,
            )
        )
    return out


@dataclass(frozen=True, kw_only=True)
class DecodeRun:
    """One timed decoding: its steps (tokens chosen, the stop token included), how many
    were intervened on, and the wall time."""

    name: str
    steps: int
    intervened: int
    seconds: float


@dataclass(frozen=True, kw_only=True)
class AARFBench:
    """AARF against plain greedy decoding of the same prompt, timed in one run.

    ``runs[0]`` is plain greedy generation; the others are AARF with the shipped
    ``redeep_token`` (incremental KV-cached decoding at the detector's threshold and
    intervening on every step, and the uncached reference that re-runs the sequence at
    every step). Ratios compare seconds per step, since an intervention may change the
    answer's length.
    """

    n_prompt: int
    max_new_tokens: int
    runs: tuple[DecodeRun, ...]

    def ratio(self, run: DecodeRun) -> float:
        base = self.runs[0]
        return (run.seconds / max(run.steps, 1)) / (base.seconds / max(base.steps, 1))

    def to_lines(self) -> list[str]:
        lines = [f"AARF on a {self.n_prompt}-token prompt, up to {self.max_new_tokens} tokens:"]
        for r in self.runs:
            lines.append(
                f"  {r.name}: {r.seconds:.2f} s for {r.steps} steps ({r.intervened} "
                f"intervened) = {self.ratio(r):.2f} x greedy per step"
            )
        return lines


def bench_aarf(
    model: LoadedModel,
    example: RAGExample,
    max_new_tokens: int = 32,
    *,
    uncached: bool = False,
    detector: Any = None,
) -> AARFBench:
    """Time greedy decoding and AARF on ``example`` with ``detector`` (default: the
    model's shipped ``redeep_token``; see :class:`AARFBench`).

    Raises:
        DataError: No detector given and no ``redeep_token`` shipped for this model.
    """
    det = detector
    if det is None:
        try:
            det = set_detector(model.info.key, DETECTORS.explained("head-tokens"))
        except DataError as e:
            raise DataError(f"{e.reason}; or bench with --aarf 0") from e
    cfg = GenerationConfig(max_new_tokens=max_new_tokens)
    generate(model, example, GenerationConfig(max_new_tokens=2))  # warm-up
    t0 = time.perf_counter()
    plain = generate(model, example, cfg)
    runs = [
        DecodeRun(
            name="greedy",
            steps=len(plain.token_ids) + (plain.stop == "eos"),
            intervened=0,
            seconds=time.perf_counter() - t0,
        )
    ]
    cases: list[tuple[str, float | None, bool]] = [
        ("AARF, KV cache, detector threshold", None, True)
    ]
    cases.append(("AARF, KV cache, every step intervened", -1.0, True))
    if uncached:
        cases.append(("AARF, no cache (re-run every step), detector threshold", None, False))
    for name, tau, kv in cases:
        t0 = time.perf_counter()
        options = AARFOptions(tau=tau, max_new_tokens=max_new_tokens, plain=False, kv_cache=kv)
        res = aarf_generate(model, example, det, options)
        runs.append(
            DecodeRun(
                name=name,
                steps=res.n_steps,
                intervened=res.n_intervened,
                seconds=time.perf_counter() - t0,
            )
        )
    n_prompt = int(render(example, model).response.start)
    return AARFBench(n_prompt=n_prompt, max_new_tokens=max_new_tokens, runs=tuple(runs))


@dataclass(frozen=True, kw_only=True)
class PlaygroundBench:
    """The Playground's "Analyse" on one example with every shipped detector, warm model.

    Attributes:
        example: The example's id.
        n_tokens: Its length (prompt + answer).
        n_answer: Its answer's tokens.
        detectors: The shipped detectors that judged it.
        forward_s: One plain forward pass over it (median).
        warm_up_s: The app's background warm-up in a fresh process
            (:func:`core.pipeline.judge.warm_up`: the detectors' own resources -- spaCy,
            the SAE, ... -- load here; a first click paid this before it existed).
        first_click_s: The first analysis in this process after the warm-up, click to
            full verdicts.
        streamed_s: Click to full verdicts, median of the warm repeats: ONE pass with the
            passages for the surprisal and every detector (plus one without them), each
            verdict out as soon as ready (:func:`core.pipeline.judge.judge_stream`).
        first_verdict_s: Click to the first verdict (median).
        first_traced_verdict_s: Click to the first verdict that reads activations (median).
        separate_s: The former path, a surprisal pass then the detectors' own passes
            (median), for comparison.
    """

    example: str
    n_tokens: int
    n_answer: int
    detectors: tuple[str, ...]
    forward_s: float
    warm_up_s: float
    first_click_s: float
    streamed_s: float
    first_verdict_s: float
    first_traced_verdict_s: float
    separate_s: float

    def to_lines(self) -> list[str]:
        f = self.forward_s
        return [
            f"Playground analysis of {self.example!r} ({self.n_tokens} tokens, "
            f"{self.n_answer} in the answer) with {len(self.detectors)} shipped detectors; "
            f"plain forward {f * 1000:.0f} ms",
            f"  click -> full verdicts (warm, streamed, one shared pass): "
            f"{self.streamed_s:.2f} s = {self.streamed_s / f:.2f} x forward",
            f"  click -> first verdict: {self.first_verdict_s:.2f} s = "
            f"{self.first_verdict_s / f:.2f} x; first verdict from activations: "
            f"{self.first_traced_verdict_s:.2f} s = {self.first_traced_verdict_s / f:.2f} x",
            f"  separate surprisal pass + detectors' passes (before): {self.separate_s:.2f} s = "
            f"{self.separate_s / f:.2f} x forward",
            f"  background warm-up in a fresh process (detector resources load): "
            f"{self.warm_up_s:.2f} s = {self.warm_up_s / f:.2f} x forward",
            f"  first click in a fresh process, after the warm-up: "
            f"{self.first_click_s:.2f} s = {self.first_click_s / f:.2f} x forward",
        ]


def bench_playground(
    model: LoadedModel, example: RAGExample, detectors: list[Detector], repeats: int = 3
) -> PlaygroundBench:
    """Time the Playground's analysis of ``example`` against one plain forward pass."""
    import torch

    layout = render(example, model)
    ids = torch.as_tensor(layout.token_ids, device=model.device).unsqueeze(0)

    def plain() -> None:
        with torch.inference_mode():
            model.hf_model(ids)
        _sync(model)

    def streamed() -> tuple[float, float, float]:
        """(click to full verdicts, to the first verdict, to the first from activations)."""
        t0 = time.perf_counter()
        first = first_traced = None
        traced = False
        for j in judge_stream(model, example, detectors, extra=response_needs()):
            now = time.perf_counter() - t0
            if j.verdict is None:
                traced = True  # a pass is done: later verdicts read activations
                continue
            first = now if first is None else first
            if traced and first_traced is None:
                first_traced = now
        total = time.perf_counter() - t0
        return total, first or total, first_traced or total

    def separate() -> None:
        token_surprisal(trace(model, layout, response_needs()))
        feats = run_example(model, example, detectors)
        for d in detectors:
            d.predict(feats[d.name])

    warm_s = warm_up(model, detectors)
    first_click = streamed()[0]
    plain()
    # Forward passes and analyses alternate, so both see the same state of a noisy
    # machine (timed in separate blocks their ratio drifted by ~20% between runs).
    fwds: list[float] = []
    runs = []
    for _ in range(max(repeats, 3)):
        t0 = time.perf_counter()
        plain()
        fwds.append(time.perf_counter() - t0)
        runs.append(streamed())
    fwd = statistics.median(fwds)
    sep = _median_time(separate, repeats)
    return PlaygroundBench(
        example=example.id,
        n_tokens=len(layout),
        n_answer=len(layout.response_positions),
        detectors=tuple(d.name for d in detectors),
        forward_s=fwd,
        warm_up_s=warm_s,
        first_click_s=first_click,
        streamed_s=statistics.median(r[0] for r in runs),
        first_verdict_s=statistics.median(r[1] for r in runs),
        first_traced_verdict_s=statistics.median(r[2] for r in runs),
        separate_s=sep,
    )


def bench_example(model: LoadedModel, n_tokens: int = 600) -> tuple[RAGExample, Layout]:
    """A qa example padded with passages until its layout reaches ``n_tokens``."""
    passages: list[str] = []
    layout = None
    while True:
        passages.append(_FILLER)
        ex = RAGExample(
            id="bench",
            question="When was the quay of Westmere extended, and why?",
            passages=tuple(passages),
            response=(
                "The quay was extended in 1790 for the herring fleet and again in 1884 when the "
                "railway arrived; the mill itself stopped grinding grain in 1931."
            ),
        )
        layout = render(ex, model)
        if len(layout) >= n_tokens:
            break
    # Trim the last passage to land close to the target.
    over = len(layout) - n_tokens
    if over > 0:
        words = passages[-1].split()
        while over > 0 and len(words) > 5:
            words = words[:-1]
            trial = (*passages[:-1], " ".join(words))
            ex = RAGExample(id="bench", question=ex.question, passages=trial, response=ex.response)
            layout = render(ex, model)
            over = len(layout) - n_tokens
    return ex, layout


def _sync(model: LoadedModel) -> None:
    """Wait for the model's device to finish what was queued (a no-op on CPU)."""
    import torch

    if model.device.startswith("cuda"):
        torch.cuda.synchronize(model.device)


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    """What ``ragscope bench`` measures, and on what.

    Attributes:
        n_tokens: Length of the bench example (prompt + answer) in tokens.
        repeats: Timed repeats of each case (the median is reported).
        cold: Also time a cold load (dequantizing into a fresh cache; embedded model only).
        device: The model's device (``auto``, ``cpu``, ``cuda``).
        dtype: The model's dtype.
        extraction: Time feature extraction over this many ``dataset`` examples (0: skip).
        batch_sizes: Also time that extraction with these many examples per forward pass.
        dataset: The examples ``extraction`` and ``judge`` read.
        ray: Also times that extraction on Ray (``None``: skip).
        features: Time each of these detectors' feature pass (and all of them together).
        aarf: Time AARF against greedy decoding of up to this many tokens (0: skip).
        aarf_uncached: With ``aarf``, also time the reference without a KV cache.
        playground: Time the Playground's analysis with every shipped detector.
        judge: Time judging this many ``dataset`` answers (0: skip).
        judge_sets: The detector sets ``judge`` times (``None``: the set that applies).
    """

    n_tokens: int = 600
    repeats: int = 5
    cold: bool = True
    device: str | None = "auto"
    dtype: str = "float32"
    extraction: int = 0
    batch_sizes: tuple[int, ...] = ()
    dataset: str = "builtin"
    ray: RayTimer | None = None
    features: tuple[str, ...] = ()
    aarf: int = 0
    aarf_uncached: bool = False
    playground: bool = False
    judge: int = 0
    judge_sets: tuple[str | None, ...] = (None,)


def _cold_load_s(spec: str, options: BenchOptions, say: Callable[[str], None]) -> float | None:
    """Seconds of a cold load of the embedded model into a fresh cache (``None``: not timed)."""
    if not (options.cold and spec == EMBEDDED):
        return None
    say("cold load: dequantizing into a fresh cache ...")
    saved = os.environ.get("RAGSCOPE_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="ragscope-bench-") as tmp:
        os.environ["RAGSCOPE_CACHE_DIR"] = tmp
        try:
            t0 = time.perf_counter()
            prepare_embedded()
            m = load_model(spec, device=options.device, dtype=options.dtype)
            cold_s = time.perf_counter() - t0
            del m
        finally:
            if saved is None:
                os.environ.pop("RAGSCOPE_CACHE_DIR", None)
            else:
                os.environ["RAGSCOPE_CACHE_DIR"] = saved
    return cold_s


def _trace_cases(
    model: LoadedModel, layout: Layout, fwd: float, repeats: int, say: Callable[[str], None]
) -> list[TimedCase]:
    """The trace engine with several realistic sets of needs, against the plain forward."""
    n_layers = model.info.n_layers
    cases_needs = {
        "logits at answer": Needs.of(["logits"], positions="generation"),
        "resid_post all layers at answer": Needs.of(
            ["resid_post", "logits"], n_layers=n_layers, positions=["response", "generation"]
        ),
        "patterns + z all layers at answer (ReDeEP-like)": Needs.of(
            ["pattern", "z", "resid_mid", "resid_post", "logits"],
            n_layers=n_layers,
            positions="generation",
        ),
    }
    cases = []
    for name, needs in cases_needs.items():
        say(f"trace: {name} ...")
        kept = trace(model, layout, needs).nbytes / 2**20
        sec = _median_time(partial(trace, model, layout, needs), repeats)
        cases.append(TimedCase(name=name, seconds=sec, ratio=sec / fwd, kept_mib=kept))
    return cases


def _feature_cases(
    model: LoadedModel, options: BenchOptions, fwd: float, say: Callable[[str], None]
) -> tuple[list[TimedCase], float | None]:
    """Each detector's feature pass (and all together), and the uncached copying scores."""
    features = options.features
    if not features:
        return [], None
    say("copying scores (uncached) ...")
    t0 = time.perf_counter()
    copying_scores(model, cache=False)
    copying_s = time.perf_counter() - t0
    copying_scores(model)  # fill the cache: the feature passes below read it
    example, _ = bench_example(model, options.n_tokens)
    groups = [(n,) for n in features] + ([tuple(features)] if len(features) > 1 else [])
    feature_cases = []
    for group in groups:
        say(f"feature pass: {' + '.join(group)} ...")
        dets = [make_detector(n) for n in group]
        sec = _median_time(partial(run_example, model, example, dets), options.repeats)
        feature_cases.append(
            TimedCase(name=" + ".join(group), seconds=sec, ratio=sec / fwd, kept_mib=0.0)
        )
    return feature_cases, copying_s


def run_bench(
    spec: str = EMBEDDED,
    options: BenchOptions = BenchOptions(),
    log: Callable[[str], None] | None = None,
) -> BenchReport:
    """Measure load times and trace overhead in one run (see module doc).

    Args:
        spec: The model to bench.
        options: What to measure (:class:`BenchOptions`).
        log: Called with a line before each measurement.
    """
    import torch

    say = log or (lambda _m: None)
    cold_s = _cold_load_s(spec, options, say)
    if spec == EMBEDDED:
        prepare_embedded()  # make sure the real cache exists before timing a warm load
    say("warm load ...")
    t0 = time.perf_counter()
    model = load_model(spec, device=options.device, dtype=options.dtype)
    warm_s = time.perf_counter() - t0
    _, layout = bench_example(model, options.n_tokens)
    ids = torch.as_tensor(layout.token_ids, device=model.device).unsqueeze(0)
    if model.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()

    def plain() -> None:
        with torch.inference_mode():
            model.hf_model(ids)
        _sync(model)

    say("plain forward ...")
    fwd = _median_time(plain, options.repeats)
    cases = _trace_cases(model, layout, fwd, options.repeats, say)
    feature_cases, copying_s = _feature_cases(model, options, fwd, say)
    ext = None
    if options.extraction:
        say(
            f"extraction over {options.extraction} {options.dataset} examples "
            "(cold, then cached) ..."
        )
        ext = bench_extraction(
            model,
            options.extraction,
            batch_sizes=options.batch_sizes,
            dataset=options.dataset,
            ray=options.ray,
        )
    aarf_bench = None
    dset = load_set(model.info.key)
    heads = DETECTORS.explained("head-tokens")
    if options.aarf and heads not in dset.names:
        say(f"AARF skipped: the {dset.name} set has no {heads} for {model.info.display_name}")
    elif options.aarf:
        say(f"AARF vs greedy, up to {options.aarf} tokens ...")
        example, _ = bench_example(model, options.n_tokens)
        aarf_bench = bench_aarf(model, example, options.aarf, uncached=options.aarf_uncached)
    pg = None
    if options.playground and not dset.detectors:
        say(
            f"Playground skipped: the {dset.name} set has no detectors for {model.info.display_name}"
        )
    elif options.playground:
        say(f"Playground analysis with the {dset.name} set's {len(dset.detectors)} detectors ...")
        pg = bench_playground(model, builtin_examples()[0], dset.fitted, repeats=options.repeats)
    judged: list[JudgeBench] = []
    if options.judge:
        say(f"judge over {options.judge} {options.dataset} answers with each set ...")
        judged = bench_judge(model, options.judge, options.judge_sets, dataset=options.dataset)
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cuda = torch.cuda.max_memory_allocated() / 2**20 if model.device.startswith("cuda") else None
    return BenchReport(
        model=model.info.display_name,
        device=model.device,
        n_tokens=len(layout),
        repeats=options.repeats,
        cold_load_s=cold_s,
        warm_load_s=warm_s,
        forward_s=fwd,
        cases=tuple(cases),
        peak_rss_mib=rss_kib / 1024,
        peak_cuda_mib=cuda,
        extraction=ext,
        feature_cases=tuple(feature_cases),
        copying_s=copying_s,
        aarf=aarf_bench,
        playground=pg,
        judge=tuple(judged),
        env={
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "dtype": model.info.dtype,
            "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(),
        },
    )
