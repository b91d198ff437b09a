"""The model itself: ``info`` (versions, caches, model facts), ``prepare`` (cache the
dequantized embedded model), ``serve-llm`` (a local OpenAI-compatible endpoint) and
``bench`` (load times and trace overhead)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from core.base.errors import RagscopeError
from core.base.paths import cache_dir
from core.cli.common import Subparsers, add_model_args, emit, load, progress
from core.engine.model import embedded_cache_path, embedded_gguf_path, prepare_embedded
from core.services.bench import BenchOptions, run_bench
from core.services.distributed import bench_ray
from core.services.llmserve import DEFAULT_ORIGINS, ENV_API_KEY, ServeLimits, make_server
from core.services.longbench import WHATS as LONG_WHATS
from core.services.longbench import long_dicts, long_text, run_long_bench


def _add_info(sub: Subparsers) -> None:
    p = sub.add_parser("info", help="versions, cache locations and (with --load) model facts")
    add_model_args(p)
    p.add_argument("--load", action="store_true", help="load the model and print its facts")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace) -> int:
    import importlib.metadata as md

    out: dict[str, Any] = {
        "ragscope": md.version("ragscope"),
        "cache_dir": str(cache_dir()),
        "embedded_cache": str(embedded_cache_path()) if embedded_cache_path().exists() else None,
    }
    try:
        out["embedded_gguf"] = str(embedded_gguf_path())
    except RagscopeError as e:
        out["embedded_gguf"] = f"missing: {e}"
    for pkg in ("torch", "transformers", "transformer-lens", "streamlit"):
        out[pkg] = md.version(pkg)
    if args.load:
        model = load(args)
        out["model"] = model.info.to_dict() | {
            "load_seconds": round(model.load_seconds, 2),
            "source": model.source,
        }
    emit(out, args.json)
    return 0


def _add_prepare(sub: Subparsers) -> None:
    p = sub.add_parser("prepare", help="dequantize the embedded model once and cache it")
    p.add_argument("--force", action="store_true", help="rebuild the cache")
    p.set_defaults(func=cmd_prepare)


def cmd_prepare(args: argparse.Namespace) -> int:
    import time

    t0 = time.perf_counter()
    already = (embedded_cache_path() / "model.safetensors").is_file() and not args.force
    path = prepare_embedded(progress, force=args.force)
    state = "already cached" if already else f"dequantized in {time.perf_counter() - t0:.1f} s"
    print(f"embedded model ready at {path} ({state})")
    return 0


def _add_serve_llm(sub: Subparsers) -> None:
    p = sub.add_parser(
        "serve-llm",
        help="serve the model as a local OpenAI-compatible chat endpoint (for feature "
        "explanations offline)",
    )
    add_model_args(p)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only; any other needs an "
        "API key)",
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every request (better: set "
        "RAGSCOPE_SERVE_API_KEY, which other users cannot see in the process list)",
    )
    p.add_argument("--max-body-bytes", type=int, default=1024 * 1024, help="largest request body")
    p.add_argument(
        "--read-timeout",
        type=float,
        default=10.0,
        help="seconds a client has to send its headers, and again its body",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=4,
        help="complete, authorised requests answered at once (503 beyond)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=64,
        help="open connections in all; beyond it the oldest idle one is closed",
    )
    p.add_argument(
        "--max-client-connections",
        type=int,
        default=16,
        help="open connections from one client address; beyond it that client's oldest "
        "idle one is closed",
    )
    p.add_argument(
        "--allow-origin",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="a web page origin (scheme://host:port) allowed to call; repeat for more "
        f"(default: the app's {' and '.join(DEFAULT_ORIGINS)}); requests from other pages, "
        "other localhost ports included, get 403",
    )
    p.add_argument(
        "--max-prompt-chars",
        type=int,
        default=None,
        help="characters of messages accepted before tokenizing (default 16 per context token)",
    )
    p.set_defaults(func=cmd_serve_llm)


def cmd_serve_llm(args: argparse.Namespace) -> int:
    """Serve the loaded model at ``http://HOST:PORT/v1`` until interrupted."""
    import os

    limits = ServeLimits(
        max_body_bytes=args.max_body_bytes,
        read_timeout=args.read_timeout,
        max_in_flight=args.max_in_flight,
        max_prompt_chars=args.max_prompt_chars,
        max_connections=args.max_connections,
        max_client_connections=args.max_client_connections,
        allow_origins=tuple(args.allow_origin or DEFAULT_ORIGINS),
    )
    api_key = args.api_key or os.environ.get(ENV_API_KEY) or None
    model = load(args)
    name = model.info.display_name
    server, sock = make_server(model, args.host, args.port, limits=limits, api_key=api_key)
    host, port = sock.getsockname()[:2]
    key_env = " RAGSCOPE_LLM_API_KEY=<the key>" if api_key else ""
    print(
        f"serving {name} at http://{host}:{port}/v1 (Ctrl-C stops; "
        f"{'API key required' if api_key else 'no API key: this machine only'}); for the app:\n"
        f"  RAGSCOPE_LLM_BASE_URL=http://{host}:{port}/v1 RAGSCOPE_LLM_MODEL={name!r}{key_env} "
        "make app",
        flush=True,
    )
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0


def _add_bench(sub: Subparsers) -> None:
    p = sub.add_parser("bench", help="load times and trace overhead, as ratios measured in one run")
    add_model_args(p)
    p.add_argument("--tokens", type=int, default=600, help="length of the RAG example")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="the weights' dtype (traces and features stay float32)",
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-cold", action="store_true", help="skip the cold (dequantizing) load")
    p.add_argument(
        "--extraction",
        type=int,
        default=60,
        metavar="N",
        help="also time feature extraction of every detector over N built-in examples, "
        "cold and cached (0: skip)",
    )
    p.add_argument(
        "--features",
        default="redeep_token,redeep_chunk,interpdetect",
        metavar="NAMES",
        help="time each detector's feature pass (trace + features) on the example, and all "
        "together, as a ratio to one plain forward; also the copying-score time ('' to skip)",
    )
    p.add_argument(
        "--dataset",
        default="builtin",
        help="the examples --extraction times (e.g. shared:ragtruth_qa_dev for ~700-token "
        "RAG prompts)",
    )
    p.add_argument(
        "--ray-actors",
        type=int,
        default=0,
        metavar="N",
        help="also time the cold extraction on a local Ray with N actors (0: skip)",
    )
    p.add_argument(
        "--batch-sizes",
        default="4",
        metavar="B,B",
        help="also time the cold extraction with these many examples per forward pass, as "
        "a speed ratio to one at a time ('' to skip)",
    )
    p.add_argument(
        "--aarf",
        type=int,
        default=32,
        metavar="N",
        help="also time AARF (with the shipped redeep_token, KV-cached) against "
        "plain greedy decoding of up to N tokens on the example, as a ratio per step (0: skip; "
        "skipped when no redeep_token is shipped for the model)",
    )
    p.add_argument(
        "--aarf-uncached",
        action="store_true",
        help="with --aarf, also time the reference that re-runs the whole sequence at every "
        "step (slow: about 10-30 x greedy per step)",
    )
    p.add_argument(
        "--playground",
        action="store_true",
        help="also time the Playground's Analyse on the first demo example with every "
        "shipped detector (click to full verdicts, to the first verdict, and the first "
        "click in a fresh process), as ratios to one plain forward of that example",
    )
    p.add_argument(
        "--judge",
        type=int,
        default=0,
        metavar="N",
        help="also time `ragscope judge` (no feature cache) over N --dataset answers with "
        "each of --judge-sets, as answers/min and a ratio to one plain forward per answer "
        "(each answer's forward timed just before it is judged)",
    )
    p.add_argument(
        "--judge-sets",
        default="",
        metavar="NAME,NAME",
        help="the detector sets --judge times (default: the set that applies)",
    )
    p.add_argument(
        "--long",
        default="",
        metavar="TOKENS,TOKENS",
        help="instead, measure long prompts of these sizes (e.g. 1024,2048,4096,8192: real "
        "passages, a short and a long answer): a plain forward, the fast and the default set, "
        "each in a subprocess, its peak RSS, seconds and the budget check's estimate",
    )
    p.add_argument(
        "--long-runs",
        default=",".join(LONG_WHATS),
        metavar="RUN,RUN",
        help=f"with --long, which runs ({', '.join(LONG_WHATS)})",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)


def _long_bench(args: argparse.Namespace) -> int:
    try:
        sizes = [int(n) for n in args.long.split(",") if n.strip()]
    except ValueError:
        print("--long takes token counts, e.g. 1024,2048,4096,8192", file=sys.stderr)
        return 2
    runs = [r.strip() for r in args.long_runs.split(",") if r.strip()]
    bad = [r for r in runs if r not in LONG_WHATS] + [str(n) for n in sizes if n < 64]
    if bad or not sizes or not runs:
        print(
            f"--long takes sizes of 64 tokens or more and --long-runs some of "
            f"{', '.join(LONG_WHATS)}; not {', '.join(bad) or 'nothing'}",
            file=sys.stderr,
        )
        return 2
    rows = run_long_bench(
        args.model, sizes, whats=runs, log=lambda m: print(m, file=sys.stderr, flush=True)
    )
    print(json.dumps(long_dicts(rows), indent=2) if args.json else long_text(rows))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.long:
        return _long_bench(args)
    options = BenchOptions(
        n_tokens=args.tokens,
        repeats=args.repeats,
        cold=not args.no_cold,
        device=args.device,
        dtype=args.dtype,
        extraction=args.extraction,
        batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",") if b.strip()),
        dataset=args.dataset,
        ray=(
            (
                lambda model, exs, names: bench_ray(
                    args.model, args.device, model, exs, names, args.ray_actors
                )
            )
            if args.ray_actors
            else None
        ),
        features=tuple(n for n in args.features.split(",") if n),
        aarf=args.aarf,
        aarf_uncached=args.aarf_uncached,
        playground=args.playground,
        judge=args.judge,
        judge_sets=tuple(n.strip() for n in args.judge_sets.split(",") if n.strip()) or (None,),
    )
    rep = run_bench(args.model, options, log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(rep.to_dict(), indent=2))
    else:
        print(rep.to_text())
    return 0


_PARSERS: dict[str, Callable[[Subparsers], None]] = {
    "info": _add_info,
    "prepare": _add_prepare,
    "serve-llm": _add_serve_llm,
    "bench": _add_bench,
}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
