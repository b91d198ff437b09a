"""Looking inside the model: ``trace`` (one traced forward pass), ``spad-check`` (the
SPAD decomposition sums to each token's probability) and ``shap`` (a fitted spad
detector's features ranked by mean |SHAP|)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from core.analysis.shap_values import shap_values
from core.base.errors import DataError
from core.cli.common import (
    Subparsers,
    add_example_args,
    add_model_args,
    add_split_args,
    emit,
    eval_splits,
    load,
    pick_example,
    split_examples,
    tqdm_progress,
)
from core.detectors import detector_class, make_detector
from core.detectors.spad import SpadDetector, split_errors
from core.engine.layout import render
from core.engine.trace import Needs, response_needs, token_surprisal, trace
from core.pipeline.extract import FeatureCache, extract_features
from core.pipeline.sets import set_detector
from core.signals.attribution import SPLIT_TOLERANCE
from core.storage import Store


def _add_trace(sub: Subparsers) -> None:
    p = sub.add_parser("trace", help="run one traced forward pass and summarise it")
    add_model_args(p)
    add_example_args(p, need_response=True)
    p.add_argument(
        "--hooks",
        default="",
        help="comma-separated hook kinds to capture besides logits "
        "(resid_pre,resid_mid,resid_post,attn_out,mlp_out,z,pattern,ln_final)",
    )
    p.add_argument("--layers", default="all", help="comma-separated layers or 'all'")
    p.add_argument(
        "--positions", default="response", choices=["all", "response", "generation", "context"]
    )
    p.add_argument("--top", type=int, default=5, help="how many most surprising tokens to list")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_trace)


def cmd_trace(args: argparse.Namespace) -> int:
    import numpy as np

    ex = pick_example(args, need_response=True)
    model = load(args)
    layout = render(ex, model)
    layers = None if args.layers == "all" else [int(x) for x in args.layers.split(",") if x]
    kinds = [k for k in args.hooks.split(",") if k]
    needs = response_needs()
    if kinds:
        needs = needs | Needs.of(
            kinds, layers=layers, n_layers=model.info.n_layers, positions=args.positions
        )
    tr = trace(model, layout, needs)
    s = token_surprisal(tr)
    toks = layout.response_token_strings()
    labels = layout.token_labels()
    top = np.argsort(-s)[: args.top]
    out: dict[str, Any] = {
        "example": ex.id,
        "model": model.info.display_name,
        "tokens": len(layout),
        "segments": [
            {"segment": seg.label, "start": seg.start, "end": seg.end, "tokens": len(seg)}
            for seg in layout.segments
        ],
        "kept_positions": int(tr.positions.size),
        "hooks": {
            f"{k}@{ly}" if ly is not None else k: list(t.shape)
            for (k, ly), t in sorted(
                tr.acts.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])
            )
        },
        "kept_mib": round(tr.nbytes / 2**20, 2),
        "trace_ms": round(tr.seconds * 1000, 1),
        "surprisal_bits": {"mean": float(s.mean()), "max": float(s.max())},
        "most_surprising": [
            {
                "token": toks[j],
                "index": int(j),
                "bits": round(float(s[j]), 2),
                **({"gold": int(labels[j])} if labels is not None else {}),
            }
            for j in top
        ],
    }
    emit(out, args.json)
    return 0


def _add_spad_check(sub: Subparsers) -> None:
    p = sub.add_parser(
        "spad-check",
        help="check that the seven SPAD sources sum to each answer token's probability",
    )
    add_split_args(p)
    p.set_defaults(func=cmd_spad_check)


def cmd_spad_check(args: argparse.Namespace) -> int:
    """Max ``|sum of the seven SPAD sources - P_final|`` over a dataset's answer tokens."""
    import numpy as np

    _, _, splits = eval_splits(args)
    examples = [e for part in ("train", "validation", "test") for e in splits[part]]
    model = load(args)
    det = make_detector(SpadDetector.name)
    with Store() as store:
        ext = extract_features(
            model,
            examples,
            [det],
            cache=None if args.no_cache else FeatureCache(store),
            progress=tqdm_progress(SpadDetector.name),
        )
    feats = ext.features[SpadDetector.name]
    err = split_errors(feats)
    n_tok = sum(len(f.tokens) for f in feats if f.tokens is not None)
    worst = int(err.argmax()) if len(err) else -1
    print(f"{len(feats)} answers, {n_tok} answer tokens, model {model.info.display_name}")
    print(f"max |Query+RAG+Past+Self+FFN+LN+Init - P_final| = {err.max(initial=0.0):.3e}")
    if worst >= 0:
        print(f"  worst answer {feats[worst].example_id!r}; median {np.median(err):.3e}")
    ok = bool(err.max(initial=0.0) <= SPLIT_TOLERANCE)
    print(f"{'within' if ok else 'OVER'} the tolerance {SPLIT_TOLERANCE:g}")
    return 0 if ok else 1


def _add_shap(sub: Subparsers) -> None:
    p = sub.add_parser(
        "shap", help="rank a fitted spad detector's 126 POS x source features by mean |SHAP|"
    )
    add_split_args(p, split_help="which split to explain")
    p.add_argument(
        "--artifact",
        default=None,
        help="a spad artifact folder (default: the shipped assets/detectors/spad)",
    )
    p.add_argument("--top", type=int, default=10, help="how many features to list")
    p.set_defaults(func=cmd_shap)


def cmd_shap(args: argparse.Namespace) -> int:
    """Global SHAP ranking of a fitted ``spad`` detector's 126 features on a dataset split."""
    examples = split_examples(args)
    model = load(args)
    if args.artifact:
        det = detector_class(SpadDetector.name).load(args.artifact, model_key=model.info.key)
    else:
        det = set_detector(model.info.key, SpadDetector.name)
    if not isinstance(det, SpadDetector):
        raise DataError(f"the spad artifact holds a {det.name} detector; give a spad artifact")
    with Store() as store:
        ext = extract_features(
            model,
            examples,
            [det],
            cache=None if args.no_cache else FeatureCache(store),
            progress=tqdm_progress(SpadDetector.name),
        )
    res = shap_values(det, ext.features[SpadDetector.name])
    df = res.to_frame().head(args.top)
    n_pos = sum(bool(e.label) for e in ext.examples)
    print(
        f"spad SHAP on {args.dataset} ({args.split}: {len(res)} answers, {n_pos} hallucinated); "
        f"base margin {res.base:+.3f}"
    )
    print(
        "direction = Spearman r of the feature's value with its SHAP value "
        "(+: higher pushes towards hallucinated)"
    )
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0


_PARSERS: dict[str, Callable[[Subparsers], None]] = {
    "trace": _add_trace,
    "spad-check": _add_spad_check,
    "shap": _add_shap,
}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
