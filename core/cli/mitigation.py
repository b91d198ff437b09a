"""Mitigating hallucination: ``mitigate`` (regenerate a split's answers with a method and
compare the detectors' flagged rates) and ``aarf`` (one answer with ReDeEP's AARF
against the plain greedy one)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from core.base.errors import DataError
from core.base.llm import CONFIG_HELP, LLMEndpoint
from core.base.safeio import replace_file
from core.cli.common import (
    Subparsers,
    add_example_args,
    add_model_args,
    add_split_args,
    emit,
    load,
    pick_example,
    split_examples,
    tqdm_progress,
)
from core.detectors import DETECTORS, detector_class
from core.interventions.aarf import AARFOptions, aarf_generate
from core.interventions.mitigate import mitigate_batch
from core.pipeline.sets import load_set, set_detector


def _parse_ints(text: str, flag: str) -> list[int]:
    """``"29,25"`` -> ``[29, 25]`` (``""`` -> ``[]``), or a DataError naming the flag."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise DataError(f"{flag} {text!r}: write comma-separated integers, e.g. 29,25") from None


def _parse_heads(text: str) -> list[tuple[int, int]]:
    """``"L21H8,L22H7"`` -> ``[(21, 8), (22, 7)]`` (``""`` -> ``[]``)."""
    import re

    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        m = re.fullmatch(r"L(\d+)H(\d+)", item, flags=re.IGNORECASE)
        if m is None:
            raise DataError(f"--heads {item!r}: write heads as L<layer>H<head>, e.g. L21H8")
        out.append((int(m[1]), int(m[2])))
    return out


def _add_mitigate(sub: Subparsers) -> None:
    p = sub.add_parser(
        "mitigate",
        help="regenerate answers with a mitigation method and report each detector's "
        "flagged rate before and after",
    )
    add_split_args(p, split_help="which split's answers to mitigate")
    p.add_argument(
        "--method",
        choices=("feedback-instance", "feedback-token", "aarf"),
        default="feedback-token",
    )
    p.add_argument(
        "--detectors",
        default=None,
        help="comma-separated shipped detectors that re-score (default: every shipped one)",
    )
    p.add_argument(
        "--guide",
        default=None,
        help="detector whose token flags guide token feedback (default: ensemble, else cortex) "
        "or AARF "
        "(redeep_token)",
    )
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--alpha2", type=float, default=2.0, help="aarf: factor on the selected heads")
    p.add_argument("--beta2", type=float, default=0.8, help="aarf: factor on the MLPs")
    p.add_argument(
        "--layers",
        default="",
        metavar="29,25,...",
        help="aarf: layers whose MLPs are scaled (default '': none, heads only; 'selected': "
        "the detector's selection, which derails a 135M model at the paper's beta2 0.2)",
    )
    p.add_argument(
        "--judge",
        action="store_true",
        help="also ask the OpenAI-compatible endpoint of RAGSCOPE_LLM_* whether each answer "
        "is supported (e.g. one `ragscope serve-llm` serves)",
    )
    p.add_argument("--out", default=None, help="write the report's JSON here")
    p.set_defaults(func=cmd_mitigate)


def cmd_mitigate(args: argparse.Namespace) -> int:
    """Regenerate a split's answers with a mitigation method; flagged rates before/after."""
    import dataclasses

    examples = split_examples(args)
    model = load(args)
    dset = load_set(model.info.key)
    if args.detectors:
        dset = dset.subset([n for n in args.detectors.split(",") if n])
    dets = dset.fitted
    judge = None
    if args.judge:
        judge = LLMEndpoint.resolve()
        if judge is None:
            raise DataError(f"--judge needs an LLM endpoint. {CONFIG_HELP}")
    report = mitigate_batch(
        model,
        examples,
        dets,
        method=args.method,
        guide=args.guide,
        max_new_tokens=args.max_new_tokens,
        progress=tqdm_progress(args.method),
        judge=judge,
        aarf_options={
            "alpha2": args.alpha2,
            "beta2": args.beta2,
            "layers": None if args.layers == "selected" else _parse_ints(args.layers, "--layers"),
        },
    )
    print(report.to_markdown())
    for err in report.errors[:10]:
        print(f"  failed: {err}")
    if args.out:
        out = replace_file(
            args.out, json.dumps(dataclasses.asdict(report), indent=1, default=str) + "\n"
        )
        print(f"saved {out}")
    return 0


def _add_aarf(sub: Subparsers) -> None:
    p = sub.add_parser(
        "aarf", help="answer with AARF (ReDeEP's mitigation) and compare with plain greedy"
    )
    add_model_args(p)
    add_example_args(p, need_response=False)
    p.add_argument(
        "--artifact",
        default=None,
        metavar="DIR",
        help="a fitted redeep_token artifact folder (default: the shipped one)",
    )
    p.add_argument(
        "--tau",
        type=float,
        default=None,
        help="intervene when the step's calibrated probability exceeds it "
        "(default: the detector's threshold)",
    )
    p.add_argument("--alpha2", type=float, default=5.0, help="factor on the selected heads")
    p.add_argument("--beta2", type=float, default=0.2, help="factor on the selected MLPs")
    p.add_argument(
        "--heads",
        default=None,
        metavar="L21H8,...",
        help="scale these heads instead of the detector's selected ones ('' = none)",
    )
    p.add_argument(
        "--layers",
        default=None,
        metavar="29,25,...",
        help="scale these layers' MLPs instead of the detector's selected ones ('' = none)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--rescore",
        default="",
        metavar="NAMES",
        help="also re-score both answers with these shipped detectors (comma-separated)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_aarf)


def cmd_aarf(args: argparse.Namespace) -> int:
    """Answer with AARF (ReDeEP's mitigation) and compare with the plain greedy answer."""
    ex = pick_example(args, need_response=False)
    model = load(args)
    name = DETECTORS.explained("head-tokens")
    key = model.info.key
    if args.artifact:
        det = detector_class(name).load(args.artifact, model_key=key)
    else:
        det = set_detector(key, name)
    options = AARFOptions(
        tau=args.tau,
        alpha2=args.alpha2,
        beta2=args.beta2,
        max_new_tokens=args.max_new_tokens,
        heads=None if args.heads is None else _parse_heads(args.heads),
        layers=None if args.layers is None else _parse_ints(args.layers, "--layers"),
    )
    res = aarf_generate(model, ex, det, options)
    others = [set_detector(key, n) for n in args.rescore.split(",") if n and n != name]
    table = res.rescore(model, [det, *others])
    out: dict[str, Any] = {
        "example": ex.id,
        "model": model.info.display_name,
        "heads": [f"L{ly}H{h}" for ly, h in res.heads],
        "layers": list(res.layers),
        "tau": res.tau,
        "alpha2": res.alpha2,
        "beta2": res.beta2,
        "plain": res.plain_text,
        "aarf": res.text,
        "steps": res.n_steps,
        "intervened_steps": res.n_intervened,
        "step_scores": [
            {
                "step": i,
                "token": model.tokenizer.decode([int(t)]),
                "probability": round(float(p), 4),
                "H": round(float(h), 4),
                "intervened": bool(f),
            }
            for i, (t, p, h, f) in enumerate(
                zip(res.step_tokens, res.probability, res.h, res.intervened, strict=True)
            )
        ],
        "rescored": [
            {
                "answer": r.answer,
                "detector": r.detector,
                "score": None if r.score is None else round(r.score, 4),
                "hallucinated": r.hallucinated,
                **({"error": r.error} if r.error else {}),
            }
            for r in table.rows
        ],
    }
    emit(out, args.json)
    return 0


_PARSERS: dict[str, Callable[[Subparsers], None]] = {
    "mitigate": _add_mitigate,
    "aarf": _add_aarf,
}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
