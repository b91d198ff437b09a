"""``judge``: the detector set's verdict on every answer of a file or dataset.

Each answer is judged by :func:`core.pipeline.judge.judge_many` (features from the local feature
cache where it has them, the rest traced and stored at once) and written as
:meth:`core.pipeline.judge.AnswerVerdict.to_record`: JSONL is appended and flushed answer by
answer, CSV and Parquet (one row per answer, :func:`core.pipeline.judge.verdict_rows`) are
written at the end, ``--html`` adds a self-contained report. Re-running the same
command reads every feature from the cache, and with a JSONL ``--out`` skips the
answers it already holds. An answer that cannot be judged (or a malformed record of
the input file) is named on stderr and skipped; the run fails only when nothing could
be judged.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from core.base.errors import DataError
from core.base.examples import RAGExample
from core.base.safeio import replace_file, replacing
from core.base.words import counted, plural
from core.cli.common import (
    REPORT_LINES,
    Subparsers,
    add_engine_args,
    add_model_args,
    extract_on_ray,
    load,
)
from core.data import load_dataset, named_examples, resolve_datasets, stratified_head
from core.learning.contract import CALLS, Detector, Features
from core.learning.metrics import evidence_warning, is_binary, response_metrics
from core.pipeline.evidence import NO_SUPPORT
from core.pipeline.extract import FeatureCache, plain_detectors
from core.pipeline.judge import (
    POOLED,
    ROW_COLUMNS,
    JudgeFailure,
    check_judge_as,
    judge_many,
    judged_as_words,
    lettuce_spans,
    verdict_rows,
)
from core.pipeline.sets import DetectorSet, load_set, resolve_set
from core.review.export import safe_csv
from core.storage import Store

FORMATS = (".jsonl", ".csv", ".parquet")
"""The ``--out`` formats, by suffix."""


class _CountingCache(FeatureCache):
    """The feature cache, noting which answers had features computed (stored) this run."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.computed: set[str] = set()

    def put(self, model_key: str, example: RAGExample, detector: Detector, feats: Features) -> None:
        self.computed.add(example.id)
        super().put(model_key, example, detector, feats)


def _add_judge(sub: Subparsers) -> None:
    p = sub.add_parser(
        "judge",
        help="the detector set's verdict on every answer of a file or dataset (labels "
        "optional): JSONL, CSV or Parquet, resumable",
    )
    p.add_argument(
        "answers",
        metavar="FILE|DATASET",
        help="the answers: a file/folder, demo, builtin, shared:NAME or a stored name; "
        "several comma-separated",
    )
    p.add_argument(
        "--set",
        default=None,
        metavar="NAME",
        help="the detector set (default: RAGSCOPE_DETECTORS_DIR, RAGSCOPE_DETECTOR_SET, "
        "else the default set; the set trained here when that has none for the model)",
    )
    p.add_argument(
        "--detectors",
        default=None,
        metavar="A,B",
        help="only these detectors of the set (comma-separated); without the ensemble the "
        "overall verdict is their vote",
    )
    p.add_argument(
        "--out",
        required=True,
        help="verdicts.jsonl (appended answer by answer; answers it holds are skipped on a "
        "re-run), .csv or .parquet (one row per answer, written at the end)",
    )
    p.add_argument("--html", default=None, help="also write a self-contained HTML report here")
    p.add_argument(
        "--spans",
        default=None,
        metavar="FILE.jsonl",
        help="also write each answer's spans in the schema other span detectors use "
        '(one line per answer: {"id", "spans": [{"start", "end", "text", "confidence"}]}; '
        "docs/judge.md)",
    )
    p.add_argument(
        "--judge-as",
        default=None,
        metavar="DATASET",
        help="judge every answer as if it came from this training dataset of the set (its "
        f"detectors' calibration and thresholds for it, or its expert for it), or "
        f"{POOLED!r} for all the training data; default: each answer as its own dataset's",
    )
    p.add_argument(
        "--limit", type=int, default=None, help="about this many answers (whole sources)"
    )
    add_model_args(p)
    add_engine_args(p)
    p.set_defaults(func=cmd_judge)


def _out_format(out: str) -> str:
    suffix = Path(out).suffix.lower()
    if suffix not in FORMATS:
        raise DataError(
            f"--out {out!r}: write verdicts to a {', '.join(FORMATS)} file", field="out"
        )
    return suffix


def load_answers(spec: str) -> tuple[list[str], list[RAGExample], list[tuple[str, str]]]:
    """The answers of ``spec`` (resolved like ``extract --dataset``), with the records of
    an input file that could not be read as ``(where, reason)``.

    Raises:
        DataError: The spec names nothing.
    """
    path = Path(spec)
    if "," in spec or not path.exists():
        names, examples = resolve_datasets(spec, on_error="skip")
        return names, examples, []
    name = path.stem if path.is_file() else path.name
    report = load_dataset(path, on_error="skip")
    bad = [("record", str(e)) for e in report.errors]  # the message names file and line
    return [name], named_examples(report.examples, name), bad


def choose_set(args: argparse.Namespace, model_key: str) -> DetectorSet:
    """The set ``--set`` (or the environment) names, narrowed to ``--detectors``.

    Raises:
        DataError: No such set, an unknown detector, or no detector for the model.
    """
    dset = load_set(model_key, args.set)
    if dset.error:
        if args.set is not None:
            raise DataError(dset.error, field="set")
        print(f"ragscope judge: the {dset.name} set is used: {dset.error}", file=sys.stderr)
    for problem in dset.expert_problems:
        print(
            f"ragscope judge: an expert of the {dset.name} set is not used: {problem}",
            file=sys.stderr,
        )
    if args.detectors is not None:
        names = [n.strip() for n in args.detectors.split(",") if n.strip()]
        if not names:
            raise DataError("--detectors names no detector", field="detectors")
        dset = dset.subset(names)
    if not dset.detectors:
        why = "; ".join(f"{b.name}: {b.reason}" for b in dset.broken)
        raise DataError(
            f"the {dset.name} detector set ({dset.folder}) has no detector for {model_key}"
            + (f" that loads ({why})" if why else "")
            + "; train some with `ragscope train`, or choose another with --set",
            field="set",
        )
    return dset


RECORD_OPENING = b'{"id": '
"""How every verdict line ``judge`` writes opens (``json.dumps`` of ``to_record``)."""


def _held_records(out: Path, dset: DetectorSet, judge_as: str | None) -> list[dict[str, Any]]:
    """The verdicts a JSONL ``--out`` already holds. Every whole line must be a verdict of
    ``dset``; an unterminated last line is one a stopped run cut short (it opens like a
    verdict, after at least one whole verdict) or a whole verdict without its newline.
    Only then is the file rewritten (beside it, moved over it) without the cut line or
    with the newline, so the next answer starts on a line of its own; anything else is
    refused before a byte of it changes.

    Raises:
        DataError: The file holds something else than this set's verdicts.
    """
    if not out.is_file():
        return []
    raw = out.read_bytes()
    whole, _, tail = raw.rpartition(b"\n")
    if not _:
        whole, tail = b"", raw
    held = [
        _held(line, n, out, dset, judge_as)
        for n, line in enumerate(whole.decode("utf-8", errors="replace").split("\n"), 1)
        if line.strip()
    ]
    if not tail.strip():
        return held
    keep = whole + b"\n" if whole else b""
    try:
        last = json.loads(tail)
    except (json.JSONDecodeError, UnicodeDecodeError):
        last = None
    if last is not None:
        held.append(_held(tail.decode("utf-8"), len(held) + 1, out, dset, judge_as))
        keep = raw + b"\n"
    elif not (held and tail.startswith(RECORD_OPENING)):
        raise DataError(
            f"its last line ({len(whole.splitlines()) + 1}) is not a verdict; give another "
            "--out, or remove that line (nothing was written)",
            source=str(out),
        )
    replace_file(out, keep)
    return held


def _held(line: str, n: int, out: Path, dset: DetectorSet, judge_as: str | None) -> dict[str, Any]:
    """Line ``n`` of a JSONL ``--out``, checked to be a verdict of ``dset``.

    Raises:
        DataError: It is not (the line named, nothing written).
    """
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(
            f"line {n} is not a verdict ({e.msg}); give another --out, or remove it "
            "(nothing was written)",
            source=str(out),
        ) from None
    if not (isinstance(rec, dict) and isinstance(rec.get("id"), str) and _judged_by(rec, dset)):
        raise DataError(
            f"line {n} is not a verdict of the {dset.name} set's "
            f"{', '.join(dset.names)}; give another --out to judge with them (nothing was "
            "written)",
            source=str(out),
        )
    if rec.get("judged_as") != judge_as:
        raise DataError(
            f"line {n} was {_how(rec.get('judged_as'))}, and this run is {_how(judge_as)}; "
            "give another --out (nothing was written)",
            source=str(out),
        )
    return rec


def _how(judge_as: Any) -> str:
    """How answers were judged, in words (``judge_as`` as a record holds it)."""
    if judge_as is None:
        return "judged as its own dataset's"
    return judged_as_words(str(judge_as)).removeprefix("; ")


def _judged_by(rec: dict[str, Any], dset: DetectorSet) -> bool:
    """Whether a held record is a verdict of ``dset`` (or of its expert, deferred to)
    with the detectors it judges with."""
    names = {dset.name: list(dset.names)}
    names.update({e.name: list(e.names) for e in dset.experts.values()})
    by = rec.get("set")
    return (
        isinstance(by, str)
        and list(rec.get("detectors", {})) == names.get(by)
        and (by == dset.name or rec.get("deferred_from") == dset.name)
    )


def _ray_fill(
    args: argparse.Namespace, model: Any, examples: Sequence[RAGExample], dset: DetectorSet
) -> None:
    """``--engine ray``: the set's features into the local cache on Ray (each plain
    detector with its fitted feature options), before judging reads them from there."""
    flat = plain_detectors(dset.fitted)
    options = [
        f"{d.name}.{k}={json.dumps(v)}"
        for d in flat
        for k, v in d.config.to_dict().items()
        if v != type(d.config)().to_dict().get(k)
    ]
    ray_args = argparse.Namespace(**{**vars(args), "set": options, "on_error": "skip"})
    with Store() as store:
        counts, failures = extract_on_ray(
            ray_args, model, examples, [d.name for d in flat], flat, store, None
        )
    print(
        f"features (ray): {counts['computed']} computed, {counts['stored']} already stored, "
        f"{counts['failed']} failed",
        file=sys.stderr,
    )


def balanced_accuracy(records: Iterable[Mapping[str, Any]]) -> tuple[float | None, np.ndarray]:
    """Balanced accuracy of the overall verdict on the labelled records
    (:func:`core.learning.metrics.response_metrics`, as every report computes it; ``None`` when
    they lack one of the two classes), and their gold labels."""
    pairs = [
        (int(bool(r["labels"]["hallucinated"])), float(bool(r["hallucinated"])))
        for r in records
        if (r.get("labels") or {}).get("hallucinated") is not None
    ]
    y = np.asarray([p[0] for p in pairs], dtype=np.int64)
    if not is_binary(y):
        return None, y
    called = np.asarray([p[1] for p in pairs])
    return response_metrics(y, called, 0.5, n_boot=0)["balanced_accuracy"], y


def _write_table(records: Sequence[Mapping[str, Any]], out: Path, fmt: str) -> None:
    """CSV (formula-safe) or Parquet, written beside ``out`` and moved over it."""
    frame = verdict_rows(records)
    if fmt == ".csv":
        replace_file(out, safe_csv(frame))
    else:
        with replacing(out, "wb") as f:
            frame.to_parquet(f, index=False)


def _marked(text: str, spans: Sequence[Mapping[str, Any]]) -> str:
    """``text`` escaped, its spans in ``<mark>``, shaded by their score (darker: more
    suspect), with their type, reason and evidence as the title."""
    parts, at = [], 0
    for s in sorted(spans, key=lambda s: s["start"]):
        start, end = int(s["start"]), int(s["end"])
        if start < at or end > len(text):
            continue
        score = min(max(float(s["score"]), 0.0), 1.0)
        ev = s.get("evidence") or {}
        title = html.escape(
            f"score {score:.3f} ({s.get('type') or 'flagged'}): {s.get('reason') or ''}"
            + (f" | passage {int(ev['passage']) + 1}: {ev['text']}" if ev.get("text") else "")
        )
        shade = f"background:rgba(214,48,49,{0.18 + 0.6 * score:.2f})"
        parts += [html.escape(text[at:start]), f'<mark style="{shade}" title="{title}">']
        parts += [html.escape(text[start:end]), "</mark>"]
        at = end
    parts.append(html.escape(text[at:]))
    return "".join(parts)


REPORT_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:24px auto;padding:0 16px;"
    "color:#222;line-height:1.45}table{border-collapse:collapse;font-size:.9em;margin:8px 0}"
    "td,th{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}"
    ".h{color:#b03a2e;font-weight:600}.f{color:#1e7b34}mark{background:#f7c6c6}"
    ".ans{border:1px solid #e3e3e3;border-radius:6px;padding:8px 12px;margin:6px 0 18px;"
    "white-space:pre-wrap}.meta{color:#666;font-size:.9em}"
)


def verdicts_html(
    records: Sequence[Mapping[str, Any]],
    answers: Mapping[str, str],
    *,
    title: str,
    summary: Sequence[str],
) -> str:
    """A self-contained HTML report of judged answers: every text escaped, no script.

    Args:
        records: :meth:`AnswerVerdict.to_record` records.
        answers: Answer text by id (the spans are marked in it).
        title: The report's title.
        summary: Lines shown under the title.
    """
    e = html.escape
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        HTML_MARK,
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">",
        f"<title>{e(title)}</title><style>{REPORT_STYLE}</style></head><body>",
        f"<h1>{e(title)}</h1><p class='meta'>{e(stamp)}</p>",
        *(f"<p>{e(line)}</p>" for line in summary),
    ]
    for r in records:
        flagged = bool(r["hallucinated"])
        verdict = "Hallucinated" if flagged else "Faithful"
        sign = "≥" if flagged else "<"
        silent = [n for n, d in r["detectors"].items() if d.get("no_signal")]
        n = r["n_detectors"] - len(silent)
        counted = f"{r['n_flagged']} of {n} {plural(n, 'detector')} flag{'s' if n == 1 else ''} it"
        if silent:
            counted += f" ({', '.join(silent)}: no signal here, left out)"
        head = f"{r['judge']} p = {r['probability']:.3f} {sign} {r['threshold']:.3f}; {counted}"
        label = (r.get("labels") or {}).get("hallucinated")
        gold = "" if label is None else f" (label: {'hallucinated' if label else 'faithful'})"
        by = f" · set {r['set_id']}" if r.get("set_id") else ""
        out.append(
            f"<h2>{e(str(r['id']))}</h2><p><span class='{'h' if flagged else 'f'}'>"
            f"{verdict}</span>: {e(head)}{e(gold)}<span class='meta'>{e(by)}</span></p>"
        )
        rows = "".join(
            f"<tr><td>{e(name)}</td><td>{d['probability']:.3f}</td>"
            f"<td>{'' if d['threshold'] is None else format(d['threshold'], '.3f')}</td>"
            f"<td>{e(_call(d))}</td>"
            f"<td>{e(d['calibrated_for'] or 'pooled')}</td></tr>"
            for name, d in r["detectors"].items()
        )
        out.append(
            "<table><tr><th>detector</th><th>probability</th><th>threshold</th>"
            f"<th>verdict</th><th>calibration</th></tr>{rows}</table>"
        )
        text = answers.get(str(r["id"]))
        if text is not None:
            out.append(f"<div class='ans'>{_marked(text, r.get('spans', []))}</div>")
        out.append(_spans_html(r))
    out.append("</body></html>")
    return "\n".join(out)


def _call(d: Mapping[str, Any]) -> str:
    """A detector's call in a record (:attr:`core.learning.contract.Verdict.call`, which
    records hold; a record written before they did: from its flag), with why there is no
    signal when there is none."""
    call = d.get("call")
    if call not in CALLS:
        flag = d.get("hallucinated")
        call = "no threshold" if flag is None else "flagged" if flag else "not flagged"
    return f"{call}: {d['no_signal']}" if call == "no signal" and d.get("no_signal") else call


def _spans_html(r: Mapping[str, Any]) -> str:
    """Where and why, as the Playground shows it: a row per span with its type, reason
    and the passage text it departs from (or that none supports it); with no span, the
    set's note why (e.g. it calls the answer hallucinated but cannot say where)."""
    e = html.escape
    spans = r.get("spans") or []
    if not spans:
        note = r.get("span_note") or "the set flags no span"
        return f"<p class='meta'><b>Where and why:</b> {e(str(note)[:600])}.</p>"
    rows = []
    for s in spans:
        ev = s.get("evidence") or {}
        departs = (
            f"passage {int(ev['passage']) + 1}: {ev.get('text', '')}"
            if ev.get("text") is not None and "passage" in ev
            else NO_SUPPORT
        )
        rows.append(
            f"<tr><td>{e(str(s.get('text', '')))}</td><td>{e(str(s.get('type') or ''))}</td>"
            f"<td>{e(str(s.get('reason') or ''))}</td><td>{e(departs)}</td>"
            f"<td>{float(s['score']):.3f}</td></tr>"
        )
    rule = f"<p class='meta'>{e(str(r['span_rule']))}</p>" if r.get("span_rule") else ""
    return (
        "<p><b>Where and why</b> (the set's spans)</p><table><tr><th>span</th><th>type</th>"
        f"<th>reason</th><th>departs from</th><th>score</th></tr>{''.join(rows)}</table>{rule}"
    )


def _summary_lines(
    *,
    judged: int,
    flagged: int,
    failed: int,
    held: int,
    from_cache: int,
    seconds: float,
    records: Sequence[Mapping[str, Any]],
    out: str,
) -> list[str]:
    rate = f"; {judged / seconds * 60:.1f} answers/minute" if seconds > 0 and judged else ""
    lines = [
        f"{judged} judged, {flagged} flagged, {failed} failed"
        + (f", {held} already in {out} (skipped)" if held else "")
        + f"; {from_cache} of {judged} read every feature from the cache{rate}"
    ]
    ba, y = balanced_accuracy(records)
    if y.size:
        lines.append(
            f"balanced accuracy of the overall verdict: {ba:.3f} on {y.size} labelled answers"
            if ba is not None
            else f"balanced accuracy: undefined on {y.size} labelled answers (one class only)"
        )
        warn = evidence_warning(y, "The labelled answers")
        if warn:
            lines.append(f"Too few answers: {warn}")
    return lines


HTML_MARK = '<meta name="generator" content="ragscope judge">'
"""Marks an HTML report ``judge --html`` wrote (and may replace)."""
OWN_PEEK = 4096
"""Bytes of an existing output read to tell whether ``judge`` wrote it."""


def _ours(path: Path, option: str) -> bool:
    """Whether ``path`` holds what ``judge`` writes for ``option`` (so replacing it loses
    nothing a user wrote): an HTML report with :data:`HTML_MARK`, a spans file whose
    first line is ``{"id", "spans"}``, a CSV whose header starts with the verdict
    columns, a Parquet file with them; an empty file is anyone's."""
    with path.open("rb") as f:
        head = f.read(OWN_PEEK)
    if not head.strip():
        return True
    if option == "--html":
        return HTML_MARK.encode() in head
    if option == "--spans":
        first = head.split(b"\n", 1)[0]
        try:
            rec = json.loads(first)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return False
        return isinstance(rec, dict) and set(rec) == {"id", "spans"}
    if path.suffix.lower() == ".csv":
        return head.lstrip(b"\xef\xbb\xbf").startswith(",".join(ROW_COLUMNS[:2]).encode())
    if path.suffix.lower() == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(path).names
        except (OSError, ValueError, pa.ArrowException):
            return False
        return names[: len(ROW_COLUMNS)] == list(ROW_COLUMNS)
    return True  # a JSONL --out is resumed, and checked line by line as it is read


def _check_out(path: str | None, option: str, answers: str) -> None:
    """Refuse, before any judging, an output path that is a folder, the answers' own file,
    or an existing file that ``judge`` did not write (replacing it would destroy it)."""
    if path is None:
        return
    p = Path(path)
    if p.is_symlink():  # even a dangling one: writing would create or change its target
        raise DataError(f"{option} {path!r} is a symbolic link: name a new file", field=option)
    if p.is_dir():
        raise DataError(f"{option} {path!r} is a folder: name a file to write", field=option)
    if not p.exists():
        return
    if Path(answers).exists() and p.resolve() == Path(answers).resolve():
        raise DataError(
            f"{option} {path!r} is the answers' own file: name another file to write",
            field=option,
        )
    if not p.is_file():
        raise DataError(f"{option} {path!r} is not a regular file: name a new file", field=option)
    if not _ours(p, option):
        raise DataError(
            f"{option} {path!r} exists and is not a file ragscope judge wrote; name a new "
            "file, or move this one away first (nothing was written)",
            field=option,
        )


def _write_spans(records: Sequence[Mapping[str, Any]], out: Path) -> None:
    """Each answer's spans in the span-detector schema, written beside ``out`` and moved
    over it."""
    with replacing(out) as f:
        for r in records:
            f.write(json.dumps({"id": r["id"], "spans": lettuce_spans(r)}, ensure_ascii=False))
            f.write("\n")


def cmd_judge(args: argparse.Namespace) -> int:
    """Judge every answer; print a summary; exit 1 when none could be judged."""
    fmt = _out_format(args.out)
    for path, option in ((args.out, "--out"), (args.html, "--html"), (args.spans, "--spans")):
        _check_out(path, option, args.answers)
    if args.set is not None and (why := resolve_set(args.set)[2]):
        raise DataError(why, field="set")
    sets, examples, bad = load_answers(args.answers)
    if args.limit:
        examples = stratified_head(examples, args.limit)
    if not examples and not bad:
        raise DataError("no answers to judge", source=args.answers)
    model = load(args)
    dset = choose_set(args, model.info.key)
    if args.judge_as is not None:
        check_judge_as(dset, args.judge_as)
    out = Path(args.out)
    ids = {e.id for e in examples}
    previous = (
        [r for r in _held_records(out, dset, args.judge_as) if r["id"] in ids]
        if fmt == ".jsonl"
        else []
    )
    done = {r["id"] for r in previous}
    todo = [e for e in examples if e.id not in done]
    if done:
        print(f"{counted(len(done), 'answer')} already in {out}: skipped", file=sys.stderr)
    if args.engine == "ray" and todo:
        _ray_fill(args, model, todo, dset)
    for where, why in bad:
        print(f"FAILED {where} {why}", file=sys.stderr)
    records: list[dict[str, Any]] = []
    failures = [*bad]
    t0 = time.perf_counter()
    sink = out.open("a", encoding="utf-8") if fmt == ".jsonl" else None
    try:
        with Store() as store:
            cache = _CountingCache(store)
            stream = judge_many(
                model, todo, dset, cache=cache, batch_size=args.batch_size, judge_as=args.judge_as
            )
            with tqdm(total=len(todo), desc="judge", unit="answer", file=sys.stderr) as bar:
                for got in stream:
                    if isinstance(got, JudgeFailure):
                        failures.append((got.example_id, str(got.error)))
                        bar.write(f"FAILED {got.example_id}: {got.error}", file=sys.stderr)
                    else:
                        rec = got.to_record()
                        records.append(rec)
                        if sink is not None:
                            sink.write(json.dumps(rec, ensure_ascii=False) + "\n")
                            sink.flush()
                    bar.update(1)
    except KeyboardInterrupt:
        kept = f"{len(records)} verdicts written to {out}" if sink else "no table written"
        print(
            f"ragscope judge: stopped after {counted(len(records), 'answer')}; {kept}; "
            "the features "
            "traced are cached: re-run the same command to resume",
            file=sys.stderr,
        )
        return 130
    finally:  # a stopped run keeps every verdict written so far
        if sink is not None:
            sink.close()
    seconds = time.perf_counter() - t0
    everything = [*previous, *records]
    if fmt != ".jsonl" and records:
        _write_table(records, out, fmt)
    judged = len(records)
    lines = _summary_lines(
        judged=judged,
        flagged=sum(bool(r["hallucinated"]) for r in records),
        failed=len(failures),
        held=len(done),
        from_cache=judged - len(cache.computed & {r["id"] for r in records}),
        seconds=seconds,
        records=everything,
        out=args.out,
    )
    experts = "".join(
        f"; answers of {ds} (or another split of it) by its expert, the {e.name} set"
        for ds, e in dset.experts.items()
    )
    head = (
        f"{counted(len(examples), 'answer')} of {', '.join(sets)}, judged by the "
        f"{dset.name} set "
        f"({', '.join(dset.names)}) on {model.info.display_name}{experts}"
        f"{judged_as_words(args.judge_as)}"
    )
    if args.html and everything:
        answers = {e.id: e.response for e in examples}
        page = verdicts_html(everything, answers, title="ragscope judge", summary=[head, *lines])
        replace_file(args.html, page)
    if args.spans and everything:
        _write_spans(everything, Path(args.spans))
    print(head)
    print("\n".join(lines))
    if failures and not everything:
        shown = "; ".join(f"{w}: {r}" for w, r in failures[:REPORT_LINES])
        raise DataError(f"no answer could be judged: {shown}")
    return 0


_PARSERS = {"judge": _add_judge}
COMMANDS = tuple(_PARSERS)


def add_parser(sub: Subparsers, command: str) -> None:
    """Register ``command`` (one of ``COMMANDS``) and its options on ``sub``."""
    _PARSERS[command](sub)
