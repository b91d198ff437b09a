"""The ``ragscope`` command line.

Subcommands: ``info``, ``prepare``, ``generate``, ``trace``, ``datasets
validate|import|list``, ``aarf``, ``bench``. Each has ``--help``. Errors ragscope raises
on purpose print one line naming the fix and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.aarf import aarf_generate
from core.bench import run_bench
from core.contract import artifact_info, compare_artifacts
from core.datasets import DEMO, load_dataset, resolve_dataset, save_jsonl
from core.detectors import (
    detector_class,
    load_shipped,
    make_detector,
    seal_artifact,
    shipped_artifacts,
)
from core.detectors.spad import split_errors
from core.errors import DataError, RagscopeError
from core.evaluate import evaluate, token_threshold
from core.examples import Provenance, RAGExample, source_key
from core.extract import FeatureCache, extract_features
from core.generate import AnswerStream, GenerationConfig, generate
from core.layout import render
from core.llm import CONFIG_HELP, LLMEndpoint
from core.llmserve import ENV_API_KEY, ServeLimits, make_server
from core.mitigate import mitigate_batch
from core.model import embedded_cache_path, embedded_gguf_path, load_model, prepare_embedded
from core.paths import cache_dir, repo_root, runs_dir, shipped_dir, shipped_sae_dir
from core.sae import (
    DEFAULT_SOURCES,
    SaeSettings,
    evaluate_sae,
    load_sae,
    sae_corpus,
    train_and_save,
)
from core.shapviz import shap_values
from core.smoothing import P_STAY_TOKEN
from core.spad import SPLIT_TOLERANCE
from core.splits import data_hash, make_splits
from core.storage import Store
from core.trace import Needs, response_needs, token_surprisal, trace


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="embedded",
        help="embedded (SmolLM2-135M-Instruct, default), tiny (random, for tests), "
        "or a Hugging Face id / local folder",
    )
    p.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda")


def _add_split_args(p: argparse.ArgumentParser, *, split_help: str | None = None) -> None:
    """Model, dataset and the evaluation split options (``_eval_splits``), plus --no-cache;
    with ``split_help``, also ``--split`` (one split or all, default test)."""
    _add_model_args(p)
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


def _add_example_args(p: argparse.ArgumentParser, *, need_response: bool) -> None:
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


def _progress(msg: str, frac: float) -> None:
    print(f"[{frac:4.0%}] {msg}", file=sys.stderr, flush=True)


def _load(args: argparse.Namespace):  # noqa: ANN202 - LoadedModel, imported lazily

    return load_model(args.model, device=args.device, progress=_progress)


def _pick_example(args: argparse.Namespace, *, need_response: bool):  # noqa: ANN202

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


# ----------------------------------------------------------------------------- commands


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
        model = _load(args)
        out["model"] = model.info.to_dict() | {
            "load_seconds": round(model.load_seconds, 2),
            "source": model.source,
        }
    _emit(out, args.json)
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    import time

    t0 = time.perf_counter()
    already = (embedded_cache_path() / "model.safetensors").is_file() and not args.force
    path = prepare_embedded(_progress, force=args.force)
    state = "already cached" if already else f"dequantized in {time.perf_counter() - t0:.1f} s"
    print(f"embedded model ready at {path} ({state})")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:

    ex = _pick_example(args, need_response=False)
    model = _load(args)
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


def cmd_trace(args: argparse.Namespace) -> int:
    import numpy as np

    ex = _pick_example(args, need_response=True)
    model = _load(args)
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
    _emit(out, args.json)
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:

    if args.action == "list":
        with Store() as store:
            rows = store.list_datasets()
        if not rows:
            print("no stored datasets; add one with `ragscope datasets import PATH --name NAME`")
        for r in rows:
            print(f"{r.name}\t{r.n_examples} examples\t{r.format}\t{r.source}")
        return 0
    if args.action == "validate":
        report = load_dataset(args.path, fmt=args.format, on_error="skip")
        print(report.summary(max_errors=args.max_errors, max_warnings=args.max_errors))
        return 1 if report.errors else 0
    report = load_dataset(args.path, fmt=args.format, on_error="skip" if args.skip_bad else "raise")
    print(report.summary())

    name = args.name or Path(args.path).stem
    with Store() as store:
        n = store.import_dataset(
            name,
            list(report.examples),
            source=str(args.path),
            fmt=report.fmt,
            replace=args.replace,
        )
    print(
        f"imported {n} examples as {name!r}"
        + (f" (skipped {len(report.errors)} bad)" if report.errors else "")
    )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:

    rep = run_bench(
        args.model,
        n_tokens=args.tokens,
        repeats=args.repeats,
        cold=not args.no_cold,
        device=args.device,
        extraction=args.extraction,
        features=tuple(n for n in args.features.split(",") if n),
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    if args.json:
        print(json.dumps(rep.to_dict(), indent=2))
    else:
        print(rep.to_text())
    return 0


def _tqdm_progress(desc: str):  # noqa: ANN202
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


def _eval_splits(args: argparse.Namespace):  # noqa: ANN202

    return make_splits(args.dataset, args.test_dataset, limit=args.limit, seed=args.seed)


def _split_examples(args: argparse.Namespace) -> list[Any]:
    """The examples of ``--split`` (``all``: every split) of ``--dataset``.

    Raises:
        DataError: That split is empty.
    """

    _, _, splits = _eval_splits(args)
    parts = ("train", "validation", "test") if args.split == "all" else (args.split,)
    examples = [e for part in parts for e in splits[part]]
    if not examples:
        raise DataError(f"the {args.split} split of {args.dataset} is empty; try --split all")
    return examples


def _detector_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """``--set NAME.OPTION=VALUE`` flags -> ``{name: {option: value}}`` (values read as JSON
    when they parse, else as strings: ``scorer=logistic``, ``pool=sum``, ``topk_frac=0.2``)."""

    out: dict[str, dict[str, Any]] = {}
    for item in getattr(args, "set", None) or []:
        key, eq, raw = item.partition("=")
        name, dot, option = key.partition(".")
        if not (eq and dot and name and option):
            raise DataError(
                f"--set {item!r}: write DETECTOR.OPTION=VALUE, e.g. redeep_token.scorer=logistic"
            )
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(name, {})[option] = value
    return out


def cmd_evaluate(args: argparse.Namespace) -> int:

    names = [d for d in args.detectors.split(",") if d]
    train_name, test_name, splits = _eval_splits(args)
    model = _load(args)
    artifacts = {}
    if args.artifacts:
        artifacts = {n: Path(args.artifacts) / n for n in names}
    with Store() as store:
        run = evaluate(
            model,
            names,
            train=[] if artifacts else splits["train"],
            validation=splits["validation"],
            test=splits["test"],
            train_dataset=train_name,
            test_dataset=test_name,
            artifacts=artifacts,
            cache=None if args.no_cache else FeatureCache(store),
            progress=_tqdm_progress("features"),
            n_boot=args.bootstrap,
            name=args.name,
            configs=_detector_options(args),
            smooth=args.smooth,
        )
    j, m = run.save(args.out or runs_dir())
    print(run.to_markdown())
    print(f"\nsaved {j} and {m}")
    return 0


def cmd_spad_check(args: argparse.Namespace) -> int:
    """Max ``|sum of the seven SPAD sources - P_final|`` over a dataset's answer tokens."""
    import numpy as np

    _, _, splits = _eval_splits(args)
    examples = [e for part in ("train", "validation", "test") for e in splits[part]]
    model = _load(args)
    det = make_detector("spad")
    with Store() as store:
        ext = extract_features(
            model,
            examples,
            [det],
            cache=None if args.no_cache else FeatureCache(store),
            progress=_tqdm_progress("spad"),
        )
    feats = ext.features["spad"]
    err = split_errors(feats)
    n_tok = sum(len(f.tokens) for f in feats)
    worst = int(err.argmax()) if len(err) else -1
    print(f"{len(feats)} answers, {n_tok} answer tokens, model {model.info.display_name}")
    print(f"max |Query+RAG+Past+Self+FFN+LN+Init - P_final| = {err.max(initial=0.0):.3e}")
    if worst >= 0:
        print(f"  worst answer {feats[worst].example_id!r}; median {np.median(err):.3e}")
    ok = bool(err.max(initial=0.0) <= SPLIT_TOLERANCE)
    print(f"{'within' if ok else 'OVER'} the tolerance {SPLIT_TOLERANCE:g}")
    return 0 if ok else 1


def cmd_mitigate(args: argparse.Namespace) -> int:
    """Regenerate a split's answers with a mitigation method; flagged rates before/after."""
    import dataclasses

    examples = _split_examples(args)
    model = _load(args)
    shipped = shipped_artifacts(model.info.key)
    names = args.detectors.split(",") if args.detectors else sorted(shipped)
    missing = [n for n in names if n not in shipped]
    if missing:
        raise DataError(
            f"no shipped {', '.join(missing)} for {model.info.display_name}; train them with "
            f"`ragscope train --detectors {','.join(missing)}`"
        )
    dets = [load_shipped(n, model.info.key) for n in names]
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
        progress=_tqdm_progress(args.method),
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
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(dataclasses.asdict(report), indent=1, default=str) + "\n")
        print(f"saved {out}")
    return 0


def cmd_token_thresholds(args: argparse.Namespace) -> int:
    """Record each artifact's token threshold (best token F1 on its own validation split).

    The split comes from the artifact's training recipe (so the answers are ones it
    did not learn from); artifacts without a recipe use ``--dataset``. The threshold
    goes into the artifact's ``cfg.json`` as ``token_threshold`` (with where it came
    from); detectors that score no tokens are listed and left alone.
    """

    folder = Path(args.folder) if args.folder else None
    model = _load(args)
    found = shipped_artifacts(model.info.key, folder=folder)
    names = [d for d in args.detectors.split(",") if d] if args.detectors else sorted(found)
    missing = [n for n in names if n not in found]
    if missing:
        raise DataError(f"no artifact for {', '.join(missing)}", source=str(folder or "assets"))
    rows = []
    with Store() as store:
        for n in names:
            path = Path(found[n])
            recipe = (artifact_info(path).get("trained_on") or {}).get("recipe") or {}
            spec = recipe.get("dataset") or args.dataset
            if spec is None:
                raise DataError(
                    "the artifact records no training recipe: give --dataset", source=str(path)
                )
            limit = recipe.get("limit") if recipe else args.limit
            seed = recipe.get("seed", args.seed) if recipe else args.seed
            name, _, splits = make_splits(spec, limit=limit, seed=seed)
            val = splits["validation"]
            det = detector_class(n).load(path, model_key=model.info.key)
            ext = extract_features(model, val, [det], cache=FeatureCache(store), on_error="skip")
            verdicts = [det.predict(f) for f in ext.features[n]]
            t = token_threshold(list(ext.examples), verdicts)
            if t is None:
                rows.append((n, "-", "scores no tokens (or one class only)"))
                continue
            cfg_path = path / "cfg.json"
            cfg = json.loads(cfg_path.read_text())
            cfg["token_threshold"] = t
            cfg["token_threshold_from"] = {
                "dataset": name,
                "split": "validation",
                "n": len(ext.examples),
                "data_hash": data_hash(list(ext.examples)),
                "criterion": "token F1",
            }
            cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
            rows.append((n, f"{t:.4f}", f"{name} validation, {len(ext.examples)} answers"))
    print("| detector | token threshold | from |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    return 0


def cmd_serve_llm(args: argparse.Namespace) -> int:
    """Serve the loaded model at ``http://HOST:PORT/v1`` until interrupted."""
    import os

    limits = ServeLimits(
        max_body_bytes=args.max_body_bytes,
        read_timeout=args.read_timeout,
        max_in_flight=args.max_in_flight,
        max_prompt_chars=args.max_prompt_chars,
    )
    api_key = args.api_key or os.environ.get(ENV_API_KEY) or None
    model = _load(args)
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


def _artifact_folders(paths: Sequence[str]) -> list[Path]:
    """Artifact folders named on the command line: a folder holding ``cfg.json`` is one;
    any other folder is searched one level down (default: the shipped folder)."""

    roots = [Path(p) for p in paths] or [shipped_dir()]
    out: list[Path] = []
    for r in roots:
        if (r / "cfg.json").is_file():
            out.append(r)
        elif r.is_dir():
            out += [s for s in sorted(r.iterdir()) if (s / "cfg.json").is_file()]
        else:
            raise DataError("no such artifact folder", source=str(r))
    if not out:
        raise DataError(
            "no detector artifacts here (folders holding cfg.json)",
            source=", ".join(map(str, roots)),
        )
    return out


def cmd_artifacts(args: argparse.Namespace) -> int:
    """Verify artifacts (hashes, allowlists, a full load) or record their file hashes."""

    failed = 0
    for folder in _artifact_folders(args.folders):
        try:
            if args.action == "seal":
                for f in seal_artifact(folder):
                    print(f"sealed {f}")
            else:
                name = str(artifact_info(folder).get("detector"))
                detector_class(name).load(folder, model_key=None)
                print(f"ok      {name:<14} {folder}")
        except RagscopeError as e:
            failed += 1
            print(f"refused {folder}: {e}", file=sys.stderr)
    return 1 if failed else 0


def cmd_shap(args: argparse.Namespace) -> int:
    """Global SHAP ranking of a fitted ``spad`` detector's 126 features on a dataset split."""

    examples = _split_examples(args)
    model = _load(args)
    if args.artifact:
        det = detector_class("spad").load(args.artifact, model_key=model.info.key)
    else:
        det = load_shipped("spad", model.info.key)
    with Store() as store:
        ext = extract_features(
            model,
            examples,
            [det],
            cache=None if args.no_cache else FeatureCache(store),
            progress=_tqdm_progress("spad"),
        )
    res = shap_values(det, ext.features["spad"])
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
    model = _load(args)
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
            progress=_tqdm_progress,
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
            progress=_tqdm_progress("evaluation"),
        )
        print(f"SAE {folder} (layer {sae.layer}, {sae.d_sae} features)")
    print(quality.to_text())
    if args.json:
        print(json.dumps(quality.to_dict(), indent=2))
    return 0


def _train_recipe(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    """The inputs that rebuild a training run, recorded in every artifact it saves."""
    recipe: dict[str, Any] = {
        "model": args.model,
        "dataset": args.dataset,
        "test_dataset": args.test_dataset,
        "detectors": names,
        "limit": args.limit,
        "seed": args.seed,
        "options": _detector_options(args),
    }
    cmd = ["ragscope train", f"--model {args.model}", f"--dataset {args.dataset}"]
    if args.test_dataset:
        cmd.append(f"--test-dataset {args.test_dataset}")
    if args.limit:
        cmd.append(f"--limit {args.limit}")
    cmd += [f"--seed {args.seed}", f"--detectors {','.join(names)}"]
    cmd += [f"--set {item}" for item in getattr(args, "set", None) or []]
    recipe["command"] = " ".join(cmd)
    return recipe


def _train(args: argparse.Namespace, names: list[str], out: str | Path, model: Any = None):  # noqa: ANN202

    train_name, test_name, splits = _eval_splits(args)
    model = model or _load(args)
    with Store() as store:
        return evaluate(
            model,
            names,
            train=splits["train"],
            validation=splits["validation"],
            test=splits["test"],
            train_dataset=train_name,
            test_dataset=test_name,
            cache=None if getattr(args, "no_cache", False) else FeatureCache(store),
            progress=_tqdm_progress("features"),
            n_boot=args.bootstrap,
            save_artifacts=out,
            recipe=_train_recipe(args, names),
            configs=_detector_options(args),
        )


def cmd_train(args: argparse.Namespace) -> int:
    if args.reproduce is not None:
        return _reproduce(args)

    names = [d for d in args.detectors.split(",") if d]
    run = _train(args, names, args.out or shipped_dir())
    print(run.to_markdown())
    for r in run.results:
        print(f"saved {r.detector} -> {r.artifact}")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    """Rebuild every artifact in ``args.reproduce`` from its recorded recipe and compare."""
    import tempfile

    folder = Path(args.reproduce) if args.reproduce else None
    found = shipped_artifacts(folder=folder)
    if not found:
        raise DataError(
            "no detector artifacts to reproduce here", source=str(folder or "assets/detectors")
        )
    groups: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for name, path in found.items():
        recipe = (artifact_info(path).get("trained_on") or {}).get("recipe")
        if not recipe:
            raise DataError(
                "the artifact records no training recipe (it predates `--reproduce`); "
                "retrain it with `ragscope train`",
                source=str(path),
            )
        key = json.dumps({k: v for k, v in recipe.items() if k not in ("detectors", "command")})
        groups.setdefault(key, (recipe, []))[1].append(name)
    failed = 0
    out_root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ragscope-repro-"))
    for recipe, names in groups.values():
        ns = argparse.Namespace(**vars(args))
        for k in ("model", "dataset", "test_dataset", "limit", "seed"):
            setattr(ns, k, recipe.get(k))
        opts = (recipe.get("options") or {}).items()
        ns.set = [f"{d}.{k}={json.dumps(v)}" for d, o in opts if d in names for k, v in o.items()]
        print(f"rebuilding {', '.join(names)}: {recipe.get('command', recipe)}", file=sys.stderr)
        _train(ns, names, out_root)
        for n in names:
            diffs = compare_artifacts(found[n], out_root / n)
            if diffs:
                failed += 1
                print(f"DIFFERS  {n}: {len(diffs)} difference(s)")
                for d in diffs[:10]:
                    print(f"    {d}")
            else:
                print(f"same     {n} ({found[n]} == {out_root / n})")
    print(f"{len(found) - failed}/{len(found)} artifacts reproduced; rebuilds in {out_root}")
    return 1 if failed else 0


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
    model = _load(args)
    cfg = GenerationConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed
    )
    root = str(repo_root()) + "/"
    update = _tqdm_progress("answers")
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
    print(f"{len(done)} answers in {out} ({len(todo)} generated now)")
    return 0


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


def cmd_aarf(args: argparse.Namespace) -> int:
    """Answer with AARF (ReDeEP's mitigation) and compare with the plain greedy answer."""

    ex = _pick_example(args, need_response=False)
    model = _load(args)
    name = "redeep_token"
    key = model.info.key
    if args.artifact:
        det = detector_class(name).load(args.artifact, model_key=key)
    else:
        det = load_shipped(name, key)
    res = aarf_generate(
        model,
        ex,
        det,
        tau=args.tau,
        alpha2=args.alpha2,
        beta2=args.beta2,
        max_new_tokens=args.max_new_tokens,
        heads=None if args.heads is None else _parse_heads(args.heads),
        layers=None if args.layers is None else _parse_ints(args.layers, "--layers"),
    )
    others = [load_shipped(n, key) for n in args.rescore.split(",") if n and n != name]
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
    _emit(out, args.json)
    return 0


def _emit(obj: dict[str, Any], as_json: bool) -> None:
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


# ----------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragscope",
        description="Inspect, from a language model's internals, where a RAG answer departs from its sources.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("info", help="versions, cache locations and (with --load) model facts")
    _add_model_args(p)
    p.add_argument("--load", action="store_true", help="load the model and print its facts")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("prepare", help="dequantize the embedded model once and cache it")
    p.add_argument("--force", action="store_true", help="rebuild the cache")
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("generate", help="let the model answer an example's question (streamed)")
    _add_model_args(p)
    _add_example_args(p, need_response=False)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("trace", help="run one traced forward pass and summarise it")
    _add_model_args(p)
    _add_example_args(p, need_response=True)
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

    p = sub.add_parser("datasets", help="validate, import or list datasets")
    dsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    formats = ["auto", "ragtruth_jsonl", "ragtruth_pair", "interpdetect", "generic", "ragscope"]
    for action, helptext in (
        ("validate", "read a dataset and list every bad record (nothing is stored)"),
        ("import", "store a dataset (all or nothing; --skip-bad keeps the good records)"),
    ):
        d = dsub.add_parser(action, help=helptext)
        d.add_argument("path", help="file or folder")
        d.add_argument("--format", default="auto", choices=formats)
        if action == "import":
            d.add_argument("--name", help="name to store the dataset under (default: file stem)")
            d.add_argument(
                "--skip-bad", action="store_true", help="skip bad records and report them"
            )
            d.add_argument("--replace", action="store_true", help="replace a stored dataset")
        else:
            d.add_argument("--max-errors", type=int, default=20, help="errors to print")
        d.set_defaults(func=cmd_datasets)
    d = dsub.add_parser("list", help="the stored datasets")
    d.set_defaults(func=cmd_datasets)

    for cmd, helptext in (
        (
            "evaluate",
            "fit on the train split (or load artifacts), threshold on validation, report on test",
        ),
        ("train", "train detectors and save their artifacts (reproduces assets/detectors)"),
    ):
        p = sub.add_parser(cmd, help=helptext)
        _add_model_args(p)
        p.add_argument(
            "--dataset", default="builtin", help="demo, builtin, a file/folder or a stored name"
        )
        p.add_argument(
            "--test-dataset", default=None, help="cross-dataset: test on all of this one"
        )
        p.add_argument(
            "--detectors", default="nll,context_gain,lexical", help="comma-separated names"
        )
        p.add_argument(
            "--limit", type=int, default=None, help="use about this many examples (whole sources)"
        )
        p.add_argument(
            "--seed", type=int, default=0, help="split seed (datasets without their own split)"
        )
        p.add_argument(
            "--bootstrap", type=int, default=1000, help="bootstrap resamples for the AUROC CI"
        )
        p.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="DETECTOR.OPTION=VALUE",
            help="a detector option (repeatable), e.g. redeep_token.scorer=logistic or "
            "redeep_chunk.pool=sum; options that only change learning reuse cached features",
        )
        if cmd == "evaluate":
            p.add_argument(
                "--artifacts",
                default=None,
                help="load detectors from this folder instead of training",
            )
            p.add_argument(
                "--no-cache", action="store_true", help="recompute features (ignore the cache)"
            )
            p.add_argument("--name", default=None, help="run name (default: time + datasets)")
            p.add_argument("--out", default=None, help="folder for the run's JSON and markdown")
            p.add_argument(
                "--smooth",
                type=float,
                default=None,
                metavar="P_STAY",
                help="also report token metrics after label-persistence smoothing of every "
                f"detector's token scores (CORTEX uses {P_STAY_TOKEN})",
            )
            p.set_defaults(func=cmd_evaluate)
        else:
            p.add_argument(
                "--out",
                default=None,
                help="artifact folder, one subfolder each (default: assets/detectors; "
                "with --reproduce: a temporary folder)",
            )
            p.add_argument(
                "--reproduce",
                nargs="?",
                const="",
                default=None,
                metavar="DIR",
                help="rebuild every artifact in DIR (default: the shipped ones) from the "
                "recipe it records, and check the rebuild matches; exit 1 if not",
            )
            p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "spad-check",
        help="check that the seven SPAD sources sum to each answer token's probability",
    )
    _add_split_args(p)
    p.set_defaults(func=cmd_spad_check)

    p = sub.add_parser(
        "shap", help="rank a fitted spad detector's 126 POS x source features by mean |SHAP|"
    )
    _add_split_args(p, split_help="which split to explain")
    p.add_argument(
        "--artifact",
        default=None,
        help="a spad artifact folder (default: the shipped assets/detectors/spad)",
    )
    p.add_argument("--top", type=int, default=10, help="how many features to list")
    p.set_defaults(func=cmd_shap)

    p = sub.add_parser(
        "mitigate",
        help="regenerate answers with a mitigation method and report each detector's "
        "flagged rate before and after",
    )
    _add_split_args(p, split_help="which split's answers to mitigate")
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

    p = sub.add_parser(
        "token-thresholds",
        help="record each detector artifact's token threshold (best token F1 on its "
        "validation split) for flagging spans",
    )
    _add_model_args(p)
    p.add_argument("--folder", default=None, help="artifact folder (default: the shipped one)")
    p.add_argument("--detectors", default=None, help="comma-separated (default: every one)")
    p.add_argument("--dataset", default=None, help="for artifacts without a training recipe")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_token_thresholds)

    p = sub.add_parser(
        "serve-llm",
        help="serve the model as a local OpenAI-compatible chat endpoint (for feature "
        "explanations offline)",
    )
    _add_model_args(p)
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
        "--max-in-flight", type=int, default=4, help="requests admitted at once (503 beyond)"
    )
    p.add_argument(
        "--max-prompt-chars",
        type=int,
        default=None,
        help="characters of messages accepted before tokenizing (default 16 per context token)",
    )
    p.set_defaults(func=cmd_serve_llm)

    p = sub.add_parser(
        "artifacts",
        help="verify detector artifacts (file hashes, exact type allowlists, a full load) or "
        "record the file hashes of ones you made with an older ragscope",
    )
    p.add_argument("action", choices=["verify", "seal"])
    p.add_argument(
        "folders", nargs="*", help="artifact folders, or folders of them (default: the shipped one)"
    )
    p.set_defaults(func=cmd_artifacts)

    p = sub.add_parser("sae", help="train or measure the residual-stream SAE (RAGLens)")
    p.add_argument("action", choices=("train", "eval"))
    _add_model_args(p)
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

    p = sub.add_parser(
        "answer", help="write the model's own (unlabelled) answers to a dataset's prompts"
    )
    _add_model_args(p)
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

    p = sub.add_parser(
        "aarf", help="answer with AARF (ReDeEP's mitigation) and compare with plain greedy"
    )
    _add_model_args(p)
    _add_example_args(p, need_response=False)
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

    p = sub.add_parser("bench", help="load times and trace overhead, as ratios measured in one run")
    _add_model_args(p)
    p.add_argument("--tokens", type=int, default=600, help="length of the RAG example")
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
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except RagscopeError as e:
        print(f"ragscope {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
