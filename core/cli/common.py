"""What the command groups share: argument helpers (model, dataset split, example),
model loading with progress, picking an example, a dataset's evaluation splits, and
printing a result as text or JSON."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.data import (
    BUILTIN,
    BUILTIN_ANSWERS,
    DEMO,
    DEMO_FULL,
    SHARED_PREFIX,
    STORED_PREFIX,
    make_splits,
    resolve_dataset,
)
from core.engine.model import LoadedModel, load_model
from core.evaluation.crossval import default_maker
from core.evaluation.recipe import options_from_flags
from core.learning.contract import Detector, Features
from core.pipeline.extract import DEFAULT_BATCH_SIZE, FeatureCache, iter_features, plain_detectors
from core.pipeline.featurestore import ShardWriter, import_store
from core.services.distributed import RayOptions, extract_ray
from core.storage import Store

REPORT_LINES = 20
"""Failures (failed examples, rejected rows) printed; the rest are counted."""

# What ``ArgumentParser.add_subparsers`` returns; each group's ``add_parser`` adds to it.
Subparsers = argparse._SubParsersAction


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="embedded",
        help="embedded (SmolLM2-135M-Instruct, default), tiny (random, for tests), a .gguf "
        "file, ollama:NAME[:TAG] (from the local Ollama store, $OLLAMA_MODELS or "
        "~/.ollama/models; no server needed), or a Hugging Face id / local folder",
    )
    p.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda")


def help_epilog(examples: Sequence[tuple[str, str]], detectors: Sequence[str] = ()) -> str:
    """A command's ``--help`` ending: worked examples (command, what it does) and, for a
    command that takes ``--detectors``, the registered detector names."""
    lines = ["examples:"]
    for cmd, what in examples:
        lines += [f"  {cmd}", f"      {what}"]
    if detectors:
        lines += ["", "detectors: " + ", ".join(detectors)]
    return "\n".join(lines)


def add_batch_size_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="B",
        help="examples per traced forward pass (right-padded; features equal one at a time "
        "to float rounding); default per device: "
        + ", ".join(f"{d} {b}" for d, b in DEFAULT_BATCH_SIZE.items()),
    )


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """``--batch-size`` and the engine options (``--engine local|ray``, ``--address``,
    ``--actors``, ``--gpus-per-actor``) of a command that extracts features, in a group of
    their own at the end of ``--help``."""
    g = p.add_argument_group("feature extraction (batching; Ray for several processes or machines)")
    add_batch_size_arg(g)
    g.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: this process (default); ray: a pool of Ray actors, "
        "each actor loading the model once (see --address, --actors, --gpus-per-actor)",
    )
    g.add_argument(
        "--address",
        default=None,
        help="with --engine ray: 'auto' (the cluster this machine is in) or ray://host:port; "
        "default: start a local Ray on the spot",
    )
    g.add_argument("--actors", type=int, default=2, help="with --engine ray: actors (model copies)")
    g.add_argument(
        "--gpus-per-actor",
        type=float,
        default=0.0,
        help="with --engine ray: GPUs each actor reserves (default 0: CPU actors)",
    )


def extract_on_ray(
    args: argparse.Namespace,
    model: LoadedModel,
    examples: Sequence[RAGExample],
    names: Sequence[str],
    flat: Sequence[Detector],
    store: Store,
    writer: ShardWriter | None,
) -> tuple[dict[str, int], list[dict[str, str]]]:
    """Extraction on Ray (:func:`core.services.distributed.extract_ray`): finished examples go
    into the local cache and, with ``--out``, the feature store."""
    cache = FeatureCache(store)
    by_name = {d.name: d for d in flat}

    def holds(key: tuple[str, str, str, str]) -> bool:
        if writer is not None:
            return writer.holds(key)
        m, h, det, cfg = key
        return store.has_analysis(example_hash=h, model=m, detector=det, config_hash=cfg)

    def sink(ex: RAGExample, rows: Sequence[tuple[tuple[str, str, str, str], Features]]) -> int:
        added = 0
        for key, feats in rows:
            cache.put(model.info.key, ex, by_name[key[2]], feats)
            added += writer.add(key, ex, feats) if writer is not None else 1
        if writer is not None:
            writer.example_done()
        return added

    options = RayOptions(
        address=args.address,
        actors=args.actors,
        gpus_per_actor=args.gpus_per_actor,
        batch_size=args.batch_size or 1,
        device=args.device,
        on_error=getattr(args, "on_error", "skip"),
    )
    with tqdm(total=len(examples), desc="features (ray)", unit="ex", file=sys.stderr) as bar:

        def progress(done: int, total: int) -> None:
            bar.update(done - bar.n)

        rep = extract_ray(
            model_spec=args.model,
            model_key=model.info.key,
            examples=examples,
            detectors=names,
            detector_options=detector_options(args),
            flat=flat,
            holds=holds,
            sink=sink,
            options=options,
            progress=progress,
        )
    counts = {
        "computed": rep.examples - len(rep.failures),
        "stored": rep.held,
        "failed": len(rep.failures),
    }
    return counts, rep.failures


def prefetch_features(
    args: argparse.Namespace,
    model: LoadedModel,
    examples: Sequence[RAGExample],
    names: Sequence[str],
) -> None:
    """``evaluate``/``train`` with ``--engine ray`` or ``--batch-size``: fill the local
    feature cache with what the run will read, on that engine, before the run reads it
    (from the cache, as always). Without either option, nothing happens here."""
    engine = getattr(args, "engine", "local")
    batch = getattr(args, "batch_size", None)
    if (engine == "local" and batch is None) or getattr(args, "no_cache", False):
        return
    make = default_maker(detector_options(args))
    detectors = [make(n) for n in names]
    flat = plain_detectors(detectors)
    with Store() as store:
        if engine == "ray":
            counts, failures = extract_on_ray(args, model, examples, names, flat, store, None)
        else:
            counts = {"computed": 0, "stored": 0, "failed": 0}
            failures = []
            stream = iter_features(
                model,
                examples,
                detectors,
                cache=FeatureCache(store),
                on_error="skip",
                batch_size=batch,
            )
            with tqdm(total=len(examples), desc="features", unit="ex", file=sys.stderr) as bar:
                for got in stream:
                    if got.error is not None:
                        counts["failed"] += 1
                        failures.append({"example": got.example.id, "error": str(got.error)})
                    else:
                        counts["computed" if got.computed else "stored"] += 1
                    bar.update(1)
    print(
        f"features ({engine}, batch size {batch or 'default'}): {counts['computed']} computed, "
        f"{counts['stored']} already stored, {counts['failed']} failed",
        file=sys.stderr,
    )


def add_split_args(p: argparse.ArgumentParser, *, split_help: str | None = None) -> None:
    """Model, dataset and the evaluation split options (``eval_splits``), plus --no-cache;
    with ``split_help``, also ``--split`` (one split or all, default test)."""
    add_model_args(p)
    p.add_argument(
        "--dataset", default="builtin", help="demo, builtin, a file/folder or a stored name"
    )
    p.add_argument("--test-dataset", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--limit", type=int, default=None, help="about this many examples (whole sources)"
    )
    p.add_argument("--seed", type=int, default=0, help="split seed (datasets without a split)")
    p.add_argument("--no-cache", action="store_true", help="recompute features (ignore the cache)")
    if split_help is not None:
        p.add_argument(
            "--split",
            choices=("train", "validation", "test", "all"),
            default="test",
            help=f"{split_help} (default: test)",
        )


def add_example_args(p: argparse.ArgumentParser, *, need_response: bool) -> None:
    g = p.add_argument_group("example (pick one from a dataset, or write one)")
    g.add_argument(
        "--dataset",
        default=None,
        help="demo (12 hand-written examples), builtin (the labelled corpus), a file/folder, "
        "or a stored dataset name",
    )
    g.add_argument("--id", default=None, help="example id within --dataset (default: first)")
    g.add_argument("--question", default=None, help="question text (instead of --dataset)")
    g.add_argument("--passage", action="append", default=[], help="a passage; repeat for several")
    g.add_argument("--task", default="qa", choices=["qa", "summary", "data2txt", "other"])
    if need_response:
        g.add_argument(
            "--response", default=None, help="answer to analyse (overrides the example's)"
        )


def add_detector_option_args(p: argparse.ArgumentParser) -> None:
    """``--set DETECTOR.OPTION=VALUE`` (repeatable); read with :func:`detector_options`."""
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="DETECTOR.OPTION=VALUE",
        help="a detector option (repeatable), e.g. redeep_token.scorer=logistic or "
        "redeep_chunk.pool=sum; options that only change learning reuse cached features",
    )


def detector_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """``--set NAME.OPTION=VALUE`` flags -> ``{name: {option: value}}``
    (:func:`core.evaluation.recipe.options_from_flags`)."""
    return options_from_flags(getattr(args, "set", None) or [])


def import_feature_stores(folders: Sequence[str], examples: Sequence[RAGExample] = ()) -> list[str]:
    """Merge feature store folders into the local cache; one summary line per folder,
    then the rejected rows. Rows of ``examples`` are also checked against them
    (:func:`core.pipeline.featurestore.import_store`).

    Raises:
        DataError: A folder that is not one.
    """
    lines = []
    with Store() as store:
        for folder in folders:
            rep = import_store(folder, store, examples)
            lines.append(
                f"{folder}: {rep.imported} imported, {rep.present} already in the cache, "
                f"{len(rep.rejected)} rejected"
            )
            lines += [f"REJECTED {r}" for r in rep.rejected[:REPORT_LINES]]
            if len(rep.rejected) > REPORT_LINES:
                lines.append(f"REJECTED ... and {len(rep.rejected) - REPORT_LINES} more")
    return lines


def progress(msg: str, frac: float) -> None:
    print(f"[{frac:4.0%}] {msg}", file=sys.stderr, flush=True)


def load(args: argparse.Namespace) -> LoadedModel:
    return load_model(args.model, device=args.device, progress=progress)


def pick_example(args: argparse.Namespace, *, need_response: bool) -> RAGExample:
    if args.dataset is None and args.question is None and not args.passage:
        args.dataset = DEMO
    if args.dataset is not None:
        _, examples = resolve_dataset(args.dataset)
        if not examples:
            raise DataError("the dataset has no examples", source=args.dataset)
        if args.id is None:
            ex = examples[0]
        else:
            found = [e for e in examples if e.id == args.id]
            if not found:
                ids = ", ".join(e.id for e in examples[:8])
                raise DataError(
                    f"no example with id {args.id!r}; ids start {ids}",
                    source=args.dataset,
                    field="id",
                )
            ex = found[0]
        response = getattr(args, "response", None)
        return ex.with_response(response) if response else ex
    if not args.passage:
        raise DataError("give --passage at least once (or --dataset)", field="passage")
    response = getattr(args, "response", None)
    if need_response and not response:
        raise DataError("give --response to analyse (or use --dataset)", field="response")
    return RAGExample(
        id="cli",
        task=args.task,
        question=args.question,
        passages=tuple(args.passage),
        response=response or "(to be generated)",
    )


def tqdm_progress(desc: str) -> Callable[[int, int], None]:
    from tqdm import tqdm

    bar: list[Any] = []

    def update(done: int, total: int) -> None:
        if not bar:
            bar.append(tqdm(total=total, desc=desc, unit="ex", file=sys.stderr))
        bar[0].n = done
        bar[0].refresh()
        if done == total:
            bar[0].close()

    return update


def eval_splits(
    args: argparse.Namespace,
) -> tuple[str, str | None, dict[str, list[RAGExample]]]:
    return make_splits(args.dataset, args.test_dataset, limit=args.limit, seed=args.seed)


def split_examples(args: argparse.Namespace) -> list[Any]:
    """The examples of ``--split`` (``all``: every split) of ``--dataset``.

    Raises:
        DataError: That split is empty.
    """
    _, _, splits = eval_splits(args)
    parts = ("train", "validation", "test") if args.split == "all" else (args.split,)
    examples = [e for part in parts for e in splits[part]]
    if not examples:
        raise DataError(f"the {args.split} split of {args.dataset} is empty; try --split all")
    return examples


def emit(obj: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj, indent=2, ensure_ascii=False))
        return
    for k, v in obj.items():
        if isinstance(v, list):
            print(f"{k}:")
            for item in v:
                print(
                    "  "
                    + (
                        "  ".join(f"{a}={b!r}" for a, b in item.items())
                        if isinstance(item, dict)
                        else str(item)
                    )
                )
        elif isinstance(v, dict):
            print(f"{k}:")
            for a, b in v.items():
                print(f"  {a}: {b}")
        else:
            print(f"{k}: {v}")


_NAMED = re.compile(r"(?P<spec>.*?)(\[:\d+\])?")


def _names_a_path(name: str) -> bool:
    return (
        not name
        or name.startswith(("/", "\\", ".", "~"))
        or "\\" in name
        or Path(name).expanduser().exists()
    )


def _a_dataset_name(part: str) -> bool:
    """One part of a dataset spec (``builtin[:180]``, ``shared:NAME``) that names no path."""
    name = _NAMED.fullmatch(part.strip())["spec"]  # type: ignore[index]  # always matches
    known = name in (DEMO, DEMO_FULL, BUILTIN, BUILTIN_ANSWERS) or name.startswith(
        (SHARED_PREFIX, STORED_PREFIX)
    )
    return known or not (_names_a_path(name) or "/" in name)


def recipe_dataset(
    recorded: object, given: str | None, folder: Path, option: str = "--dataset"
) -> str | None:
    """The dataset an artifact's training recipe names, when it is one ragscope knows by
    name (``demo``, ``builtin``, ``shared:``/``stored:`` names, a stored dataset); else
    ``given`` (the user's ``option``). A recipe naming a file or folder is never opened on
    the artifact's word: ``cfg.json`` is anyone's to edit.

    Raises:
        DataError: The recipe names a path (or is not a string) and nothing was given.
    """
    if recorded is None:
        return given
    if isinstance(recorded, str) and all(map(_a_dataset_name, recorded.split(","))):
        return recorded
    if given is not None:
        return given
    raise DataError(
        f"the artifact's training recipe names {str(recorded)[:200]!r}, a file or folder "
        "(or no dataset name), which ragscope does not open on an artifact's word; give "
        f"{option} to choose the data yourself",
        source=str(folder),
    )


def recipe_model(recorded: object, folder: Path) -> str:
    """The model an artifact's training recipe names, when it is not a file or folder on
    this machine (``embedded``, ``tiny``, ``random:...``, ``ollama:...``, a hub id).

    Raises:
        DataError: The recipe names a path (or is not a string).
    """
    if isinstance(recorded, str) and not (_names_a_path(recorded) or recorded.endswith(".gguf")):
        return recorded
    raise DataError(
        f"the artifact's training recipe names the model {str(recorded)[:200]!r}, a file or "
        "folder, which ragscope does not open on an artifact's word; rebuild it yourself "
        "with `ragscope train --model PATH` and the recipe's other options",
        source=str(folder),
    )
