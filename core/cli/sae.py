"""``sae train|eval``: train the residual-stream SAE (RAGLens) or measure one."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from core.base.errors import DataError
from core.base.paths import shipped_sae_dir
from core.cli.common import Subparsers, add_model_args, load, tqdm_progress
from core.signals.sae import (
    DEFAULT_SOURCES,
    SaeSettings,
    evaluate_sae,
    load_sae,
    sae_corpus,
    train_and_save,
)


def _add_sae(sub: Subparsers) -> None:
    p = sub.add_parser("sae", help="train or measure the residual-stream SAE (RAGLens)")
    p.add_argument("action", choices=("train", "eval"))
    add_model_args(p)
    p.add_argument(
        "--sources",
        default=None,
        help="comma-separated training text: builtin, builtin-answers, shared:FILE, a path "
        "or stored name (default: builtin, builtin-answers and the ../shared/data sets)",
    )
    p.add_argument("--out", default=None, help="SAE folder (default: assets/sae/<model>)")
    p.add_argument("--sae", default=None, help="eval: the SAE folder (default: the shipped one)")
    p.add_argument("--layer", type=int, default=None, help="block (default: the middle one)")
    p.add_argument("--expansion", type=int, default=8, help="d_sae = expansion x d_model")
    p.add_argument("--k", type=int, default=32, help="active features per token (TopK)")
    p.add_argument("--training-tokens", type=int, default=2_000_000)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32")
    p.add_argument(
        "--eval-tokens", type=int, default=100_000, help="held-out tokens to evaluate on"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_sae)


def _sae_out(args: argparse.Namespace) -> Path:
    if args.out:
        return Path(args.out)
    if args.model != "embedded":
        raise DataError(
            f"--out is needed for a model other than the embedded one ({args.model!r}); the "
            "shipped folder holds the embedded model's SAE"
        )
    return shipped_sae_dir()


def cmd_sae(args: argparse.Namespace) -> int:
    """Train (``sae train``) or measure (``sae eval``) the residual-stream SAE."""
    sources = tuple(x for x in args.sources.split(",") if x) if args.sources else DEFAULT_SOURCES
    model = load(args)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if args.action == "train":
        settings = SaeSettings(
            layer=args.layer,
            expansion=args.expansion,
            k=args.k,
            training_tokens=args.training_tokens,
            batch_size=args.batch_size,
            lr=args.lr,
            seed=args.seed,
            dtype=args.dtype,
        )
        out = _sae_out(args)
        sae, quality = train_and_save(
            model,
            out,
            settings,
            sources=sources,
            eval_tokens=args.eval_tokens,
            log=log,
            progress=tqdm_progress,
        )
        print(f"saved the SAE (layer {sae.layer}, {sae.d_sae} features) to {out}")
    else:
        folder = Path(args.sae) if args.sae else _sae_out(args)
        sae = load_sae(folder)
        corpus = sae_corpus(sources)
        quality = evaluate_sae(
            model,
            sae,
            corpus.held_out,
            max_tokens=args.eval_tokens,
            progress=tqdm_progress("evaluation"),
        )
        print(f"SAE {folder} (layer {sae.layer}, {sae.d_sae} features)")
    print(quality.to_text())
    if args.json:
        print(json.dumps(quality.to_dict(), indent=2))
    return 0


_PARSERS: dict[str, Callable[[Subparsers], None]] = {"sae": _add_sae}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
