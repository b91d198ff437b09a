"""The model answering: ``generate`` (one example's answer, streamed) and ``answer``
(the model's own answers to a dataset's prompts, written resumably)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from core.base.examples import Provenance, source_key
from core.base.paths import repo_root
from core.base.words import counted
from core.cli.common import (
    Subparsers,
    add_example_args,
    add_model_args,
    load,
    pick_example,
    tqdm_progress,
)
from core.data import load_dataset, resolve_dataset, save_jsonl
from core.engine.generate import AnswerStream, GenerationConfig, generate


def _add_generate(sub: Subparsers) -> None:
    p = sub.add_parser("generate", help="let the model answer an example's question (streamed)")
    add_model_args(p)
    add_example_args(p, need_response=False)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    ex = pick_example(args, need_response=False)
    model = load(args)
    cfg = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
    )
    stream = AnswerStream(
        model,
        task=ex.task,
        question=ex.question,
        passages=ex.passages,
        prompt=ex.prompt,
        config=cfg,
    )
    for piece in stream:
        print(piece, end="", flush=True)
    print()
    g = stream.result()
    print(
        f"[{len(g.token_ids)} tokens in {g.seconds:.1f} s, stop: {g.stop}, prompt {g.prompt_tokens} tokens]",
        file=sys.stderr,
    )
    return 0


def _add_answer(sub: Subparsers) -> None:
    p = sub.add_parser(
        "answer", help="write the model's own (unlabelled) answers to a dataset's prompts"
    )
    add_model_args(p)
    p.add_argument(
        "--dataset", default="builtin", help="demo, builtin, a file/folder or a stored name"
    )
    p.add_argument("--out", required=True, help="ragscope JSONL to write (resumes when it exists)")
    p.add_argument("--one-per-source", action="store_true", help="one prompt per source document")
    p.add_argument("--split", default=None, help="only these splits, comma-separated (e.g. test)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_answer)


def cmd_answer(args: argparse.Namespace) -> int:
    """Write the model's own answers to a dataset's prompts (unlabelled), resumably."""
    import dataclasses

    name, examples = resolve_dataset(args.dataset)
    if args.split:
        examples = [e for e in examples if e.provenance.split in args.split.split(",")]
    if args.one_per_source:
        seen: set[str] = set()
        firsts = []
        for e in examples:
            if source_key(e) not in seen:
                seen.add(source_key(e))
                firsts.append(e)
        examples = firsts
    if args.limit:
        examples = examples[: args.limit]
    out = Path(args.out)
    done = list(load_dataset(out, fmt="ragscope").examples) if out.is_file() else []
    have = {e.id for e in done}
    todo = [e for e in examples if f"{e.id}-answer" not in have]
    model = load(args)
    cfg = GenerationConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed
    )
    root = str(repo_root()) + "/"
    update = tqdm_progress("answers")
    for i, ex in enumerate(todo):
        g = generate(model, ex, cfg)
        if g.text.strip():
            done.append(
                dataclasses.replace(
                    ex.with_response(g.text),
                    id=f"{ex.id}-answer",
                    provenance=Provenance(
                        dataset=f"{name}-answers",
                        generator=model.info.display_name,
                        # Shipped files must not carry this machine's paths.
                        source=(ex.provenance.source or "").removeprefix(root) or None,
                        split=ex.provenance.split,
                        group=ex.provenance.group,
                    ),
                )
            )
        if (i + 1) % 10 == 0 or i + 1 == len(todo):
            save_jsonl(done, out)  # written atomically: an interrupted run resumes here
        update(i + 1, len(todo))
    if not todo:
        save_jsonl(done, out)
    print(f"{counted(len(done), 'answer')} in {out} ({len(todo)} generated now)")
    return 0


_PARSERS: dict[str, Callable[[Subparsers], None]] = {
    "generate": _add_generate,
    "answer": _add_answer,
}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
