"""The built-in labelled corpus: determinism, the shipped file, balance, splits, exact spans."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import core.data.catalog as catalog
from core.base.errors import DataError
from core.base.examples import RAGExample
from core.data import load_builtin, load_dataset, save_jsonl
from tools.corpus import (
    CORPUS_FILE,
    HALLUCINATION_TYPES,
    MAX_CHARS,
    SPLITS,
    TASK_ORDER,
    TYPE_SLUGS,
    build_corpus,
    builtin_dir,
    template_ids,
    template_of,
)
from tools.corpus.__main__ import main
from tools.corpus.compose import MONTHS, WEEKDAYS, occurs

SHIPPED = builtin_dir() / CORPUS_FILE
_DATE_WORD = re.compile(r"\d|" + "|".join(MONTHS + WEEKDAYS))


@pytest.fixture(scope="module")
def corpus() -> list[RAGExample]:
    return build_corpus(0)


@pytest.fixture(scope="module")
def pairs(corpus: list[RAGExample]) -> list[tuple[RAGExample, RAGExample]]:
    """(faithful, hallucinated) per hallucinated example, matched by group."""
    faithful = {e.provenance.group: e for e in corpus if e.label is False}
    return [(faithful[e.provenance.group], e) for e in corpus if e.label]


def _dicts(exs: list[RAGExample]) -> list[dict]:
    out = []
    for e in exs:
        d = e.to_dict()
        d.get("provenance", {}).pop("source", None)  # the loader records file:line
        out.append(d)
    return out


def _context(e: RAGExample) -> str:
    return "\n".join((*e.passages, e.question or ""))


def _replaced(f: str, h: str, start: int, end: int) -> str | None:
    """The faithful text that ``h[start:end]`` replaced, or None when the rest differs."""
    pre, post = h[:start], h[end:]
    if len(f) < len(pre) + len(post) or not (f.startswith(pre) and f.endswith(post)):
        return None
    return f[len(pre) : len(f) - len(post)]


def _is_insertion(f: str, h: str, start: int, end: int) -> bool:
    """Whether removing the span (plus its separator and closing mark) gives back ``f``."""
    for a in range(start, max(start - 3, 0) - 1, -1):
        for b in range(end, min(end + 2, len(h)) + 1):
            lead, trail = h[a:start], h[end:b]
            if lead.strip(" ,;:-\u2014") or trail.strip(" .,;"):
                continue
            if h[:a] + h[b:] == f:
                return True
    return False


# --------------------------------------------------------------------------- determinism


def test_same_seed_gives_the_same_corpus(corpus: list[RAGExample]) -> None:
    again = build_corpus(0)
    assert [e.to_dict() for e in again] == [e.to_dict() for e in corpus]


def test_another_seed_gives_another_corpus() -> None:
    a, b = build_corpus(0, n_docs_per_task=24), build_corpus(1, n_docs_per_task=24)
    assert len(a) == len(b) == 2 * 24 * len(TASK_ORDER)
    assert [e.id for e in a] == [e.id for e in b]  # same structure ...
    same = sum(x.response == y.response for x, y in zip(a, b, strict=True))
    assert same < len(a) // 10  # ... different texts


def test_shipped_file_is_a_fresh_seed_0_build(corpus: list[RAGExample]) -> None:
    assert SHIPPED.is_file(), f"{SHIPPED} is missing; run `python -m tools.corpus`"
    shipped = list(load_dataset(SHIPPED, fmt="ragscope").examples)
    assert _dicts(shipped) == _dicts(corpus), "assets/builtin/corpus.jsonl was edited by hand"
    meta = json.loads((SHIPPED.parent / "corpus.meta.json").read_text(encoding="utf-8"))
    assert meta["sha256"] == hashlib.sha256(SHIPPED.read_bytes()).hexdigest()
    assert meta["seed"] == 0 and meta["counts"]["examples"] == len(corpus)


def test_cli_rebuilds_byte_identical_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--out", str(tmp_path), "--seed", "0"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["examples"] >= 1500
    assert (tmp_path / CORPUS_FILE).read_bytes() == SHIPPED.read_bytes()


def test_bad_docs_per_task_is_refused() -> None:
    with pytest.raises(ValueError, match="n_docs_per_task"):
        build_corpus(0, n_docs_per_task=0)


# --------------------------------------------------------------------------- size, balance


def test_size_and_label_balance(corpus: list[RAGExample]) -> None:
    assert len(corpus) >= 1500
    share = sum(e.label is True for e in corpus) / len(corpus)
    assert 0.45 <= share <= 0.55
    assert all(e.label is not None for e in corpus)


def test_tasks_and_types_are_balanced(corpus: list[RAGExample]) -> None:
    by_task = Counter(e.task for e in corpus)
    assert set(by_task) == set(TASK_ORDER)
    for n in by_task.values():
        assert abs(n / len(corpus) - 1 / 3) < 0.05
    for task in TASK_ORDER:
        types = Counter(e.spans[0].type for e in corpus if e.task == task and e.label)
        assert set(types) == set(HALLUCINATION_TYPES)
        mean = sum(types.values()) / len(types)
        assert max(types.values()) <= 1.25 * mean and min(types.values()) >= 0.75 * mean


def test_every_task_has_at_least_20_templates(corpus: list[RAGExample]) -> None:
    used = defaultdict(set)
    for e in corpus:
        used[e.task].add(template_of(e))
    for task in TASK_ORDER:
        assert len(template_ids(task)) >= 20
        assert used[task] == set(template_ids(task))  # every template is used


def test_template_of_rejects_foreign_examples() -> None:
    ex = RAGExample(id="x", question="q?", passages=("p",), response="r")
    with pytest.raises(DataError, match="not a built-in"):
        template_of(ex)


def test_length_budget(corpus: list[RAGExample]) -> None:
    for e in corpus:
        assert sum(map(len, e.passages)) + len(e.question or "") + len(e.response) <= MAX_CHARS


def test_task_shapes(corpus: list[RAGExample]) -> None:
    for e in corpus:
        if e.task == "qa":
            assert e.question and 1 <= len(e.passages) <= 3
        else:
            assert e.question is None and len(e.passages) == 1
        if e.task == "data2txt":
            assert isinstance(json.loads(e.passages[0]), dict)
        if e.task == "summary":
            n = len(re.findall(r"[.!?](?:\s|$)", e.passages[0]))
            assert 4 <= n <= 8, e.id


# --------------------------------------------------------------------------- groups, splits


def test_groups_ids_and_provenance(corpus: list[RAGExample]) -> None:
    assert len({e.id for e in corpus}) == len(corpus)
    groups: dict[str, list[RAGExample]] = defaultdict(list)
    for e in corpus:
        p = e.provenance
        assert p.dataset == "builtin" and p.group and p.split in SPLITS
        groups[p.group].append(e)
        if e.label:
            slug = TYPE_SLUGS[e.spans[0].type]
            assert e.id == f"{p.group}-{slug}" and p.generator == f"template+{slug}"
        else:
            assert e.id == f"{p.group}-faithful" and p.generator == "template" and not e.spans
    for members in groups.values():
        assert sum(e.label is False for e in members) == 1 and len(members) >= 2
        assert len({(e.passages, e.question, e.task) for e in members}) == 1
        assert len({e.provenance.split for e in members}) == 1, "a source document crosses splits"


@pytest.mark.parametrize("task", [None, *TASK_ORDER])
def test_split_fractions(corpus: list[RAGExample], task: str | None) -> None:
    exs = [e for e in corpus if task is None or e.task == task]
    counts = Counter(e.provenance.split for e in exs)
    for split, target in zip(SPLITS, (0.70, 0.15, 0.15), strict=True):
        assert abs(counts[split] / len(exs) - target) <= 0.05, (split, counts)


# --------------------------------------------------------------------------- spans


def test_one_exact_span_per_hallucination(pairs: list[tuple[RAGExample, RAGExample]]) -> None:
    for f, h in pairs:
        assert len(h.spans) == 1
        s = h.spans[0]
        text = h.response[s.start : s.end]
        assert s.type in HALLUCINATION_TYPES and s.note
        assert text == text.strip() and text, h.id
        assert h.response != f.response
        if s.type in ("unsupported added detail", "subtle baseless claim"):
            assert _is_insertion(f.response, h.response, s.start, s.end), h.id
        else:
            old = _replaced(f.response, h.response, s.start, s.end)
            assert old is not None and old != text, h.id


def test_span_text_fits_its_type(pairs: list[tuple[RAGExample, RAGExample]]) -> None:
    for f, h in pairs:
        s = h.spans[0]
        text, ctx = h.response[s.start : s.end], _context(h)
        assert not occurs(text, ctx), f"{h.id}: {text!r} is in the source"
        if s.type in ("unsupported added detail", "subtle baseless claim"):
            assert len(text.split()) >= 2, h.id
            continue
        old = _replaced(f.response, h.response, s.start, s.end)
        assert old is not None
        if s.type == "numeric change":
            assert re.search(r"\d", text) and re.search(r"\d", old), h.id
            assert re.sub(r"\D", "", text) != re.sub(r"\D", "", old), h.id
        elif s.type == "date change":
            assert _DATE_WORD.search(text) and _DATE_WORD.search(old), h.id
        elif s.type == "entity swap":
            assert occurs(old, ctx), f"{h.id}: the swapped-out entity {old!r} is not in the source"
            assert set(text.lower().split()) - set(old.lower().split()), h.id
        elif s.type == "contradiction/negation":
            assert text.lower() != old.lower()


def test_faithful_values_are_in_the_source(pairs: list[tuple[RAGExample, RAGExample]]) -> None:
    """The value a numeric/date/entity edit replaced is grounded (date styles may differ)."""
    for f, h in pairs:
        s = h.spans[0]
        if s.type in ("numeric change", "entity swap"):
            old = _replaced(f.response, h.response, s.start, s.end)
            assert old is not None
            assert occurs(old, _context(h)) or occurs(old.replace(",", ""), _context(h)), h.id


# --------------------------------------------------------------------------- files


def test_round_trip_through_ragscope_jsonl(tmp_path: Path, corpus: list[RAGExample]) -> None:
    path = save_jsonl(corpus, tmp_path / "c.jsonl")
    report = load_dataset(path, fmt="ragscope")
    assert not report.errors and report.n_read == len(corpus)
    assert _dicts(list(report.examples)) == _dicts(corpus)


def test_load_builtin_by_split(corpus: list[RAGExample]) -> None:
    test = load_builtin("test")
    assert test and all(e.provenance.split == "test" for e in test)
    assert len(test) == sum(e.provenance.split == "test" for e in corpus)
    with pytest.raises(DataError, match="unknown split"):
        load_builtin("dev")


def test_load_builtin_missing_file_names_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog, "builtin_dir", lambda: tmp_path)
    with pytest.raises(DataError) as err:
        load_builtin()
    assert "python -m tools.corpus" in str(err.value) and str(tmp_path) in str(err.value)
