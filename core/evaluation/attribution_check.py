"""Is the attention-based context attribution faithful? A ContextCite-style ablation check.

For each answer, up to :data:`MAX_SPANS` of its sentences (those of at least
:data:`MIN_SPAN_TOKENS` tokens, chosen with a seed per answer) are the spans. For each
span, three passage sentences (:func:`~core.pipeline.word_spans.passage_sentences`):

- **top**: the sentence with the largest share of the span's passage attention
  (:class:`~core.signals.passage_attention.ContextReading`, head group
  :data:`GROUP`);
- **random**: a sentence other than *top* of about the same length (within
  :data:`LENGTH_SLACK` of its tokens, at least :data:`MIN_SLACK_TOKENS`; the nearest
  length when none is), drawn with the answer's seed;
- **text**: the sentence the product's evidence alignment picks from the text alone
  (:func:`~core.pipeline.evidence.find_all`, attention left out), when it is a whole
  passage sentence;
- **both**: the same alignment re-ranked by the span's attention shares
  (``how="attention+text"``), when it is a whole passage sentence.

Each is *removed*: its tokens are cut out of the prompt the model read (the rest, the
answer's tokens included, unchanged) and the answer is scored again. The *drop* is the
span's log-probability (nats, summed over its tokens) with the full prompt minus without
the sentence. Attribution is faithful when removing *top* lowers the span's
log-probability more than removing *random*: the run reports the mean of
``drop(top) - drop(random)`` and the share of spans where ``drop(top) > drop(random)``
(0.5 = no better than chance), each with a 95% interval of a bootstrap that resamples
whole sources (:func:`core.learning.metrics.group_resamples`), and the same for *text*.

The same comparison runs for each other head group of
:data:`~core.signals.passage_attention.GROUPS` (early, middle and late layers' heads, and
the model's copying heads, :func:`~core.signals.copying_heads.copying_scores`): its own
most attended sentence against its own random sentence of about the same length (the
*all* group's random one when both groups pick the same top), so a researcher sees which
heads' reading of the passages the model's output actually depends on.

Cost per answer: one traced pass, one plain pass, and one pass per distinct removed
sentence (at most ``12 * MAX_SPANS``; most groups agree on a span's top sentence).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.base.errors import DataError
from core.base.examples import RAGExample, example_hash, source_key
from core.base.safeio import parse_json, read_bounded
from core.engine.layout import Layout, render
from core.engine.model import LoadedModel
from core.engine.trace import hooked_logits, trace
from core.evaluation.cv_run import read_run, stamped_run
from core.evaluation.evaluate import save_run
from core.learning.metrics import group_resamples
from core.pipeline.evidence import find_all
from core.pipeline.span_judge import answer_sentences
from core.pipeline.word_spans import passage_sentences
from core.signals.copying_heads import copying_scores
from core.signals.passage_attention import (
    GROUP_LABELS,
    GROUPS,
    ContextReading,
    read_context,
    reading_needs,
)

KIND = "attribution"
GROUP = "all"
"""The head group whose attention chooses *top*."""
FORMAT = 3
"""Progress lines of this format hold every head group's picks, over passage sentences
that keep "4.5" whole (format 2: the earlier splitter; format 1: *all* only)."""
MAX_SPANS = 3
MIN_SPAN_TOKENS = 3
LENGTH_SLACK = 0.25
MIN_SLACK_TOKENS = 2
MIN_SPANS = 30
"""Fewest spans for the run's numbers to read as estimates."""
PROGRESS_LIMIT = 256 * 1024 * 1024
"""Largest progress file read back (a few hundred bytes per answer)."""


@dataclass(frozen=True, kw_only=True)
class GroupPick:
    """One head group's most attended sentence for a span, its random counterpart of
    about the same length, and the span's drop (nats) when each is removed."""

    group: str
    top_unit: int
    top_share: float
    random_unit: int
    drop_top: float
    drop_random: float


@dataclass(frozen=True, kw_only=True)
class AblationRow:
    """One answer span and the drops of its three removed sentences (nats).

    ``text_unit`` and ``drop_text`` (``both_unit`` and ``drop_both``: the alignment
    re-ranked by the span's attention, ``how="attention+text"``) are ``None`` when the
    alignment found no whole passage sentence (no evidence, or evidence in a stretch that is not a sentence).
    """

    example_id: str
    source: str
    start: int
    end: int
    n_tokens: int
    top_unit: int
    top_share: float
    random_unit: int
    text_unit: int | None
    both_unit: int | None
    logprob: float
    drop_top: float
    drop_random: float
    drop_text: float | None
    drop_both: float | None
    by_group: tuple[GroupPick, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["by_group"] = [asdict(g) for g in self.by_group]
        return d


def _seed(example: RAGExample, seed: int) -> int:
    h = hashlib.sha256(f"{seed}|{example.id}".encode()).digest()
    return int.from_bytes(h[:8], "little")


def answer_logprobs(
    model: LoadedModel, layout: Layout, cut: tuple[int, int] | None = None
) -> np.ndarray:
    """``[resp]`` each answer token's log-probability (nats) from one plain pass over the
    layout's tokens, positions ``cut = [a, b)`` of the prompt removed first."""
    import torch

    ids = np.asarray(layout.token_ids, dtype=np.int64)
    g = np.asarray(layout.generation_positions, dtype=np.int64)
    if cut is not None:
        a, b = cut
        if not 0 <= a < b <= int(layout.response.start):
            raise ValueError(f"only prompt tokens can be removed, not [{a}, {b})")
        ids = np.concatenate([ids[:a], ids[b:]])
        g = g - (b - a)
    logits = hooked_logits(model, torch.as_tensor(ids)[None], [])[0]
    logp = torch.log_softmax(logits[torch.as_tensor(g)].double(), dim=-1)
    resp = torch.as_tensor(np.asarray(layout.response_ids, dtype=np.int64))
    return logp.gather(1, resp.unsqueeze(1)).squeeze(1).numpy()


def _random_unit(reading: ContextReading, top: int, rng: np.random.Generator) -> int | None:
    lengths = np.asarray([b - a for a, b in map(reading.unit_positions, range(len(reading.units)))])
    others = np.asarray([k for k in range(len(lengths)) if k != top])
    if not others.size:
        return None
    diff = np.abs(lengths[others] - lengths[top])
    slack = max(MIN_SLACK_TOKENS, LENGTH_SLACK * lengths[top])
    near = others[diff <= slack]
    pool = near if near.size else others[diff == diff.min()]
    return int(rng.choice(pool))


@dataclass(frozen=True, kw_only=True)
class SpanCheck:
    """One span's ablation: the drops (nats) when its most attended passage sentence, or a
    random one of about the same length, is removed from the prompt."""

    top_unit: int
    random_unit: int
    logprob: float
    drop_top: float
    drop_random: float

    @property
    def faithful(self) -> bool:
        """Whether removing the most attended sentence hurt the span more."""
        return self.drop_top > self.drop_random


def check_span(
    model: LoadedModel,
    reading: ContextReading,
    tokens: tuple[int, int],
    *,
    group: str = GROUP,
    seed: int = 0,
) -> SpanCheck | None:
    """The ablation check of one span ``[a, b)`` of answer tokens, its top sentence by
    ``group``'s attention (``None`` when the passages have under two sentences or the span
    attends to none).

    Raises:
        ModelError: A pass failed.
    """
    a, b = tokens
    if not 0 <= a < b <= reading.n_tokens:
        raise ValueError(f"answer tokens [{a}, {b}) are outside the answer's {reading.n_tokens}")
    shares = reading.unit_shares(group, slice(a, b))
    if len(shares) < 2 or not shares.any():
        return None
    top = int(np.argmax(shares))
    rng = np.random.default_rng(seed)
    other = _random_unit(reading, top, rng)
    if other is None:
        return None
    layout = reading.layout
    base = answer_logprobs(model, layout)
    lp = float(base[a:b].sum())
    drops = [
        lp - float(answer_logprobs(model, layout, reading.unit_positions(u))[a:b].sum())
        for u in (top, other)
    ]
    return SpanCheck(
        top_unit=top, random_unit=other, logprob=lp, drop_top=drops[0], drop_random=drops[1]
    )


def _text_units(
    example: RAGExample,
    reading: ContextReading,
    spans: Sequence[tuple[int, int]],
    attention: Sequence[Sequence[float]] | None = None,
) -> list[int | None]:
    index = {u: k for k, u in enumerate(reading.units)}
    out: list[int | None] = []
    found = find_all(reading.layout.passage_texts, example.response, spans, attention=attention)
    for f in found:
        ev = f.evidence
        out.append(None if ev is None else index.get((ev.passage, ev.start, ev.end)))
    return out


def ablation_rows(
    model: LoadedModel, example: RAGExample, *, seed: int = 0, max_spans: int = MAX_SPANS
) -> list[AblationRow]:
    """The ablation rows of one answer (empty when it has under two passage sentences or
    no sentence of at least :data:`MIN_SPAN_TOKENS` tokens).

    Raises:
        DataError: The example cannot be laid out.
        ModelError: A pass failed.
    """
    layout = render(example, model)
    units = passage_sentences(layout.passage_texts)
    if len(units) < 2:
        return []
    spans = []
    for s, e in answer_sentences(example.response):
        a, b = layout.chars_to_tokens(s, e)
        if b - a >= MIN_SPAN_TOKENS:
            spans.append((s, e, a, b))
    if not spans:
        return []
    rng = np.random.default_rng(_seed(example, seed))
    if len(spans) > max_spans:
        spans = [spans[i] for i in sorted(rng.choice(len(spans), max_spans, replace=False))]
    copying = copying_scores(model).top_heads()
    reading = read_context(
        trace(model, layout, reading_needs(model.info.n_layers)), units, copying=copying
    )
    base = answer_logprobs(model, layout)
    removed: dict[int, np.ndarray] = {}

    def drop(unit: int, a: int, b: int) -> float:
        if unit not in removed:
            removed[unit] = answer_logprobs(model, layout, reading.unit_positions(unit))
        return float(base[a:b].sum() - removed[unit][a:b].sum())

    chars = [(s, e) for s, e, _, _ in spans]
    shares = [reading.unit_shares(GROUP, slice(a, b)) for _, _, a, b in spans]
    texts = _text_units(example, reading, chars)
    boths = _text_units(example, reading, chars, [list(x) for x in shares])
    rows = []
    group = source_key(example)
    for k, ((s, e, a, b), text, both, share) in enumerate(
        zip(spans, texts, boths, shares, strict=True)
    ):
        top = int(np.argmax(share))
        other = _random_unit(reading, top, rng)
        if other is None:
            continue
        picks = []
        for g in reading.groups:
            g_share = reading.unit_shares(g, slice(a, b)) if g != GROUP else share
            if g == GROUP or not g_share.any():
                continue
            g_top = int(np.argmax(g_share))
            g_rng = np.random.default_rng([_seed(example, seed), k, GROUPS.index(g)])
            g_other = other if g_top == top else _random_unit(reading, g_top, g_rng)
            if g_other is None:
                continue
            picks.append(
                GroupPick(
                    group=g,
                    top_unit=g_top,
                    top_share=float(g_share[g_top]),
                    random_unit=g_other,
                    drop_top=drop(g_top, a, b),
                    drop_random=drop(g_other, a, b),
                )
            )
        rows.append(
            AblationRow(
                example_id=example.id,
                source=group,
                start=s,
                end=e,
                n_tokens=b - a,
                top_unit=top,
                top_share=float(share[top]),
                random_unit=other,
                text_unit=text,
                both_unit=both,
                logprob=float(base[a:b].sum()),
                drop_top=drop(top, a, b),
                drop_random=drop(other, a, b),
                drop_text=None if text is None else drop(text, a, b),
                drop_both=None if both is None else drop(both, a, b),
                by_group=tuple(picks),
            )
        )
    return rows


def _mean_ci(values: np.ndarray, groups: np.ndarray, n_boot: int, seed: int) -> list[float] | None:
    if values.size < 2 or n_boot <= 0:
        return None
    means = [
        float(values[idx].mean())
        for idx in group_resamples(values, groups, n_boot, seed, both_classes=False)
    ]
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def _compare(rows: Sequence[AblationRow], field: str, n_boot: int, seed: int) -> dict[str, Any]:
    keep = [r for r in rows if getattr(r, field) is not None]
    return _paired(
        [getattr(r, field) for r in keep],
        [r.drop_random for r in keep],
        [r.source for r in keep],
        n_boot,
        seed,
    )


def _by_group(rows: Sequence[AblationRow], n_boot: int, seed: int) -> dict[str, Any]:
    """:func:`_paired` per head group: *all* from the rows' own picks, each other group
    from its :class:`GroupPick` (spans where that group attends to no sentence left out)."""
    out = {GROUP: _compare(rows, "drop_top", n_boot, seed)}
    for g in GROUPS:
        if g == GROUP:
            continue
        picks = [(p, r.source) for r in rows for p in r.by_group if p.group == g]
        if picks:
            out[g] = _paired(
                [p.drop_top for p, _ in picks],
                [p.drop_random for p, _ in picks],
                [src for _, src in picks],
                n_boot,
                seed,
            )
    return out


def _paired(
    ours_: Sequence[float], rand_: Sequence[float], sources: Sequence[str], n_boot: int, seed: int
) -> dict[str, Any]:
    if not ours_:
        return {"n": 0}
    ours = np.asarray(ours_, dtype=np.float64)
    rand = np.asarray(rand_, dtype=np.float64)
    groups = np.asarray(sources)
    diff = ours - rand
    wins = (ours > rand).astype(np.float64)
    return {
        "n": len(ours),
        "n_sources": len(set(groups.tolist())),
        "mean_drop": float(ours.mean()),
        "mean_drop_random": float(rand.mean()),
        "mean_difference": float(diff.mean()),
        "mean_difference_ci": _mean_ci(diff, groups, n_boot, seed),
        "win_rate": float(wins.mean()),
        "win_rate_ci": _mean_ci(wins, groups, n_boot, seed),
    }


def attribution_report(
    rows: Sequence[AblationRow], *, n_boot: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """The check's numbers over ``rows`` (see the module docstring), JSON-ready."""
    return {
        "n_spans": len(rows),
        "n_answers": len({r.example_id for r in rows}),
        "attention": _compare(rows, "drop_top", n_boot, seed),
        "text": _compare(rows, "drop_text", n_boot, seed),
        "both": _compare(rows, "drop_both", n_boot, seed),
        "mean_top_share": float(np.mean([r.top_share for r in rows])) if rows else None,
        "group": GROUP,
        "by_group": _by_group(rows, n_boot, seed),
        "settings": {
            "max_spans": MAX_SPANS,
            "min_span_tokens": MIN_SPAN_TOKENS,
            "length_slack": LENGTH_SLACK,
            "min_slack_tokens": MIN_SLACK_TOKENS,
        },
        "n_boot": n_boot,
    }


def check_rows(
    model: LoadedModel,
    examples: Iterable[RAGExample],
    *,
    seed: int = 0,
    progress: str | Path | None = None,
) -> Iterator[tuple[RAGExample, list[AblationRow], bool, str | None]]:
    """``(example, rows, computed, error)`` for each example. With a ``progress`` file,
    answers it holds (same content, model and seed) are read back, and each computed one
    is added to it, so a stopped run resumes where it was. An answer that cannot be laid
    out (e.g. longer than the model's context) gets no rows and its error, and is not
    recorded (a later run tries it again)."""
    done = read_progress(progress) if progress is not None else {}
    for ex in examples:
        key = progress_key(ex, model.info.key, seed)
        if key in done:
            yield ex, done[key], False, None
            continue
        try:
            rows = ablation_rows(model, ex, seed=seed)
        except DataError as e:
            yield ex, [], True, str(e)
            continue
        if progress is not None:
            append_progress(progress, key, rows)
        yield ex, rows, True, None


def row_from_json(d: Mapping[str, Any]) -> AblationRow:
    """An :class:`AblationRow` back from :meth:`AblationRow.to_json` (strict types).

    Raises:
        ValueError: A field is missing or of the wrong type.
    """
    ints = ("start", "end", "n_tokens", "top_unit", "random_unit")
    floats = ("top_share", "logprob", "drop_top", "drop_random")
    try:
        out: dict[str, Any] = {"example_id": str(d["example_id"]), "source": str(d["source"])}
        for k in ints:
            v = d[k]
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{k} is not an integer")
            out[k] = v
        for k in floats:
            v = d[k]
            if not isinstance(v, int | float) or isinstance(v, bool) or not np.isfinite(v):
                raise ValueError(f"{k} is not a finite number")
            out[k] = float(v)
        for unit, drop in (("text_unit", "drop_text"), ("both_unit", "drop_both")):
            tu, dt = d.get(unit), d.get(drop)
            if (tu is None) != (dt is None):
                raise ValueError(f"{unit} and {drop} are both given or both null")
            if tu is not None and (not isinstance(tu, int) or isinstance(tu, bool)):
                raise ValueError(f"{unit} is not an integer")
            if dt is not None and (
                not isinstance(dt, int | float) or isinstance(dt, bool) or not np.isfinite(dt)
            ):
                raise ValueError(f"{drop} is not a finite number")
            out[unit] = tu
            out[drop] = None if dt is None else float(dt)
        picks = d.get("by_group", [])
        if not isinstance(picks, list) or len(picks) > len(GROUPS):
            raise ValueError(f"by_group is not a list of at most {len(GROUPS)} picks")
        out["by_group"] = tuple(_pick_from_json(x) for x in picks)
    except KeyError as e:
        raise ValueError(f"missing field {e.args[0]}") from e
    return AblationRow(**out)


def _pick_from_json(d: object) -> GroupPick:
    if not isinstance(d, dict) or d.get("group") not in GROUPS:
        raise ValueError(f"a by_group pick is not an object naming one of {list(GROUPS)}")
    out: dict[str, Any] = {"group": d["group"]}
    for k in ("top_unit", "random_unit"):
        v = d[k]
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"by_group {k} is not an integer")
        out[k] = v
    for k in ("top_share", "drop_top", "drop_random"):
        v = d[k]
        if not isinstance(v, int | float) or isinstance(v, bool) or not np.isfinite(v):
            raise ValueError(f"by_group {k} is not a finite number")
        out[k] = float(v)
    return GroupPick(**out)


def progress_key(example: RAGExample, model: str, seed: int) -> str:
    """What a progress line is valid for: the answer's content, the model and the seed."""
    payload = f"{example_hash(example)}|{model}|{seed}|format{FORMAT}"
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def read_progress(path: str | Path) -> dict[str, list[AblationRow]]:
    """Progress key -> rows of a progress file :func:`append_progress` wrote (empty when the
    file does not exist).

    Raises:
        DataError: The file is not a progress file (the line and the fix named).
    """
    p = Path(path)
    if not p.exists():
        return {}
    data = read_bounded(p, PROGRESS_LIMIT, what="attribution progress file")
    out: dict[str, list[AblationRow]] = {}
    fix = "delete the file to start over (only the answers it holds are lost)"
    for i, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        d = parse_json(raw, source=str(p), line=i)
        try:
            if not isinstance(d, dict) or not isinstance(d.get("key"), str):
                raise ValueError("not an object with a key")
            rows = d.get("rows")
            if not isinstance(rows, list):
                raise ValueError("rows is not a list")
            out[d["key"]] = [row_from_json(r if isinstance(r, dict) else {}) for r in rows]
        except ValueError as e:
            raise DataError(
                f"not an attribution progress line ({e}); {fix}", source=f"{p}:{i}"
            ) from e
    return out


def append_progress(path: str | Path, key: str, rows: Sequence[AblationRow]) -> None:
    """Add one answer's rows (possibly none) to a progress file, one JSON line."""
    import json

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"key": key, "rows": [r.to_json() for r in rows]}) + "\n")


def latest_run(folder: str | Path) -> dict[str, Any] | None:
    """The newest attribution run saved in ``folder`` (``None`` when it holds none).

    Raises:
        DataError: The newest run file is not a readable run.
    """
    p = Path(folder)
    if not p.is_dir():
        return None
    files = sorted(f for f in p.glob("*-attribution-*.json") if f.is_file())
    if not files:
        return None
    run = read_run(files[-1], "attribution run")
    if run.get("kind") != KIND:
        raise DataError(f"not an attribution run (kind {run.get('kind')!r})", source=str(files[-1]))
    return run


def attribution_run(report: Mapping[str, Any], dataset: str, model: str) -> dict[str, Any]:
    """``report`` as a run to save: with its kind, name, dataset, model and time."""
    return stamped_run(KIND, dataset, report, model=model)


def _fmt(v: Any, ci: Any = None, pct: bool = False) -> str:
    if v is None:
        return "-"
    f = (lambda x: f"{x:.1%}") if pct else (lambda x: f"{x:+.3f}")
    return f(v) + (f" [{f(ci[0])}, {f(ci[1])}]" if ci else "")


def too_few(run: Mapping[str, Any]) -> str | None:
    """A warning when the run rests on fewer than :data:`MIN_SPANS` spans."""
    n = int(run.get("n_spans") or 0)
    if n >= MIN_SPANS:
        return None
    return (
        f"This rests on {n} span{'' if n == 1 else 's'}: an anecdote, not an estimate "
        f"({MIN_SPANS - n} more needed; run it on more answers)."
    )


def attribution_markdown(run: Mapping[str, Any]) -> str:
    """The run as a short markdown report."""
    lines = [
        f"# Context attribution check: {run.get('dataset')}",
        "",
        f"Model {run.get('model')}; {run.get('n_spans')} answer sentences of "
        f"{run.get('n_answers')} answers; head group `{run.get('group')}`. "
        "Drop: the sentence's log-probability (nats) with the full prompt minus with one "
        "passage sentence removed. Win rate: the share of spans whose drop is larger than "
        "with a random passage sentence of about the same length removed (0.5 is chance). "
        "Intervals: 95%, bootstrap over sources.",
        "",
        "| removed sentence | spans | mean drop | random's mean drop | difference | win rate |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, label in (
        ("attention", "most attended (attention)"),
        ("text", "evidence alignment (text)"),
        ("both", "alignment re-ranked by attention"),
    ):
        r = dict(run.get(key) or {})
        if not r.get("n"):
            lines.append(f"| {label} | 0 | - | - | - | - |")
            continue
        lines.append(
            f"| {label} | {r['n']} | {_fmt(r['mean_drop'])} | {_fmt(r['mean_drop_random'])} | "
            f"{_fmt(r['mean_difference'], r.get('mean_difference_ci'))} | "
            f"{_fmt(r['win_rate'], r.get('win_rate_ci'), pct=True)} |"
        )
    by_group = dict(run.get("by_group") or {})
    if by_group:
        lines += [
            "",
            "By head group: each group's own most attended sentence against its own random "
            "sentence of about the same length.",
            "",
            "| head group | spans | mean drop | random's mean drop | difference | win rate |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for g in GROUPS:
            r = dict(by_group.get(g) or {})
            if r.get("n"):
                lines.append(
                    f"| {GROUP_LABELS[g]} | {r['n']} | {_fmt(r['mean_drop'])} | "
                    f"{_fmt(r['mean_drop_random'])} | "
                    f"{_fmt(r['mean_difference'], r.get('mean_difference_ci'))} | "
                    f"{_fmt(r['win_rate'], r.get('win_rate_ci'), pct=True)} |"
                )
    warn = too_few(run)
    if warn:
        lines += ["", f"**{warn}**"]
    lines += ["", "Command: `ragscope evaluate --attribution DATASET` (docs/attribution.md)."]
    return "\n".join(lines)


def save_attribution_run(run: Mapping[str, Any], folder: str | Path) -> tuple[Path, Path]:
    """The run's JSON and markdown in ``folder``."""
    return save_run(str(run.get("name", KIND)), run, attribution_markdown(run), folder)
