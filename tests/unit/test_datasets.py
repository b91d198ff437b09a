"""Dataset loaders: every format, malformed input, skip reports and the real shared files."""

from __future__ import annotations

import collections
import json
import os
import re
from pathlib import Path

import pytest

from core.base.errors import DataError
from core.base.examples import TASKS, RAGExample
from core.data import (
    ColumnMapping,
    LoadReport,
    builtin_examples,
    demo_full_examples,
    detect_format,
    load_dataset,
    resolve_dataset,
    save_jsonl,
    shared_data_dir,
    split_passages,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PAIR = FIXTURES / "ragtruth_pair"

# -- helpers: small records in each format, with our own text ----------------------

QUESTION = "Which river flows through Harlow Vale?"
PASSAGES_RT = (
    "passage 1:The river Senn flows through Harlow Vale from north to south.\n\n"
    "passage 2:Harlow Vale is known for its apple orchards.\n\n"
)
PROMPT_RT = f"Answer briefly:\n{QUESTION}\nUse these passages:\n{PASSAGES_RT}Answer:"


def rt_record(
    output: str = "The Senn flows through Harlow Vale.", hall: list | None = None
) -> dict:
    return {
        "input": PROMPT_RT,
        "output": output,
        "hall_info": hall or [],
        "split": "test",
        "model": "gen-x",
        "context": {"question": QUESTION, "passages": PASSAGES_RT},
    }


def span(text: str, frag: str, **meta) -> dict:
    i = text.index(frag)
    return {"start": i, "end": i + len(frag), "text": frag, "meta": meta}


def write_lines(path: Path, lines: list) -> Path:
    path.write_text(
        "".join(
            (x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)) + "\n" for x in lines
        ),
        encoding="utf-8",
    )
    return path


def interp_record(
    rid: str = "fin_1", response: str = "Revenue rose by 12 percent in 2020.", **kw
) -> dict:
    docs = ["revenue grew 12 % in 2020 .", "costs fell slightly ."]
    prompt_docs = ["Revenue grew 12% in 2020.", "Costs fell slightly."]
    q = "how much did revenue grow in 2020?"
    parts = [
        "Answer the question from the context.\n",
        "\nContext:",
        *prompt_docs,
        "\nQuestion:",
        q,
        "\nAnswer:",
    ]
    prompt, spans, pos = "", [], 0
    for p in parts:
        spans.append([pos, pos + len(p) - 1])  # inclusive ends, as in InterpDetect
        prompt += p
        pos += len(p)
    frag = "12 percent"
    i = response.find(frag)
    rec = {
        "id": rid,
        "question": q,
        "documents": docs,
        "prompt": prompt,
        "prompt_spans": spans,
        "response": response,
        "response_spans": [[0, len(response) - 1]],
        "labels": [{"start": i, "end": i + len(frag), "confidence": 0.61, "text": frag}]
        if i >= 0
        else [],
        "labels_llama": 1,
        "labels_gpt": 1,
    }
    rec.update(kw)
    return rec


# -- ragtruth_jsonl ----------------------------------------------------------------


def test_split_passages() -> None:
    assert split_passages(PASSAGES_RT) == [
        "The river Senn flows through Harlow Vale from north to south.",
        "Harlow Vale is known for its apple orchards.",
    ]
    assert split_passages("Plain text\n\n") == ["Plain text"]
    # Out-of-sequence or mid-line markers are text, not boundaries.
    assert split_passages("passage 1:A says passage 3: B\n\npassage 2:C") == [
        "A says passage 3: B",
        "C",
    ]


def test_ragtruth_jsonl(tmp_path: Path) -> None:
    out = "The Senn flows through Harlow Vale, past a castle."
    f = write_lines(
        tmp_path / "rt.jsonl",
        [
            rt_record(),
            "",
            rt_record(
                out,
                [span(out, "past a castle", label_type="Evident Baseless Info", exp="no castle")],
            ),
        ],
    )
    assert detect_format(f) == "ragtruth_jsonl"
    rep = load_dataset(f)
    assert rep.fmt == "ragtruth_jsonl" and rep.n_read == 2 and not rep.errors
    a, b = rep.examples
    assert a.prompt == PROMPT_RT and a.question == QUESTION and a.task == "qa"
    assert a.passages == tuple(split_passages(PASSAGES_RT))
    assert a.label is False and b.label is True
    (s,) = b.spans
    assert (b.response[s.start : s.end], s.type, s.note) == (
        "past a castle",
        "Evident Baseless Info",
        "no castle",
    )
    assert a.id.startswith("rt-00001-") and b.id.startswith("rt-00003-")
    assert b.provenance.source == f"{f}:3" and b.provenance.generator == "gen-x"
    assert b.provenance.dataset == "rt"
    assert load_dataset(f, dataset="mine").examples[0].id.startswith("mine-00001-")
    assert load_dataset(f).examples[0].id == a.id  # stable


def test_ragtruth_truncated_prompt_keeps_what_the_model_saw(tmp_path: Path) -> None:
    body = "The Senn is a long river. " * 10
    rec = {
        "input": f"Answer:\n{QUESTION}\nContent:{body[:150]}",
        "output": "It is long.",
        "hall_info": [],
        "model": "m",
        "context": {"question": QUESTION, "passages": body + "\n\n"},
    }
    rep = load_dataset(write_lines(tmp_path / "cut.jsonl", [rec]))
    (ex,) = rep.examples
    assert ex.passages == (body[:150].rstrip(),)
    assert (
        len(rep.warnings) == 1
        and "cut short" in rep.warnings[0]
        and "cut.jsonl:1" in rep.warnings[0]
    )


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ('{"input": ', r"bad.jsonl:3:\d+: invalid JSON"),
        (
            {k: v for k, v in rt_record().items() if k != "output"},
            r"bad.jsonl:3: field 'output': missing",
        ),
        (
            rt_record("Short.", [{"start": 2, "end": 60, "text": None, "meta": {}}]),
            r"bad.jsonl:3: field 'hall_info': span 0 \[2, 60\) runs past the response",
        ),
        (
            rt_record("Short answer.", [{"start": 0, "end": 5, "text": "Long", "meta": {}}]),
            r"bad.jsonl:3: field 'hall_info': span 0 \[0, 5\) text 'Long' does not match",
        ),
        (
            rt_record("Short.", [{"start": 3, "end": 3, "meta": {}}]),
            r"bad.jsonl:3: field 'hall_info': span 0: span \[3, 3\) is empty",
        ),
        (
            {
                **rt_record(),
                "context": {"question": QUESTION, "passages": "passage 1:Not in prompt."},
            },
            r"bad.jsonl:3: field 'context.passages': passage 1 .* does not occur in the prompt",
        ),
        ('["a list"]', r"bad.jsonl:3: expected a JSON object"),
    ],
)
def test_ragtruth_malformed(tmp_path: Path, line, pattern: str) -> None:
    f = write_lines(tmp_path / "bad.jsonl", [rt_record(), "   ", line, rt_record("Fine.")])
    with pytest.raises(DataError, match=pattern):
        load_dataset(f, fmt="ragtruth_jsonl")
    rep = load_dataset(f, fmt="ragtruth_jsonl", on_error="skip")
    assert rep.n_read == 3 and len(rep.examples) == 2 and len(rep.errors) == 1
    assert rep.errors[0].source in (f"{f}:3", f"{f}:3:11")  # JSON syntax: with its column


def test_skip_report(tmp_path: Path) -> None:
    f = write_lines(
        tmp_path / "mixed.jsonl",
        [rt_record(), "{oops", rt_record("Ok."), {"input": "x"}, rt_record("Also ok.")],
    )
    rep = load_dataset(f, fmt="ragtruth_jsonl", on_error="skip")
    assert isinstance(rep, LoadReport)
    assert (rep.n_read, len(rep.examples), len(rep.errors)) == (5, 3, 2)
    frame = rep.to_frame()
    assert list(frame.columns) == ["source", "field", "reason"]
    assert list(frame["source"]) == [f"{f}:2:2", f"{f}:4"]  # JSON syntax: with its column
    assert frame["field"].iloc[1] == "output"
    text = rep.summary()
    assert "3 of 5 records loaded" in text and "2 skipped" in text and f"{f}:2" in text
    assert load_dataset(f, fmt="ragtruth_jsonl", on_error="skip", limit=2).n_read == 2


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        load_dataset(tmp_path / "nope.jsonl")
    f = write_lines(tmp_path / "x.jsonl", [rt_record()])
    with pytest.raises(DataError, match="unknown format"):
        load_dataset(f, fmt="parquet")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_error"):
        load_dataset(f, on_error="ignore")  # type: ignore[arg-type]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match="empty"):
        detect_format(empty)
    assert load_dataset(empty, fmt="ragscope").n_read == 0


# -- ragtruth_pair -----------------------------------------------------------------


def test_ragtruth_pair_fixture() -> None:
    assert detect_format(PAIR) == "ragtruth_pair"
    assert detect_format(PAIR / "response.jsonl") == "ragtruth_pair"
    rep = load_dataset(PAIR)
    assert not rep.errors and rep.n_read == 6
    by_id = {e.id: e for e in rep.examples}
    assert collections.Counter(e.task for e in rep.examples) == {
        "qa": 2,
        "summary": 2,
        "data2txt": 2,
    }
    assert {i: e.label for i, e in by_id.items()} == {
        "r1": False,
        "r2": True,
        "r3": False,
        "r4": True,
        "r5": True,
        "r6": False,
    }
    qa = by_id["r2"]
    assert len(qa.passages) == 2 and qa.question and qa.question in qa.prompt
    (s,) = qa.spans
    assert qa.response[s.start : s.end] == "was painted red in 1990"
    assert s.type == "Evident Baseless Info" and s.note
    for e in rep.examples:
        assert e.prompt is not None and all(p in e.prompt for p in e.passages)
        assert (
            e.provenance.dataset == "ragtruth_pair" and e.provenance.generator == "handmade-model"
        )
    # Data2txt: the record rendered with ensure_ascii=False, and a compact one found by decoding.
    assert json.loads(by_id["r5"].passages[0])["categories"] == ["bookshop", "café"]
    assert by_id["r6"].passages[0].startswith('{"name":"Brackenfold')
    assert by_id["r3"].question is None


def copy_pair(tmp_path: Path, edit_sources=None, edit_responses=None) -> Path:
    d = tmp_path / "pair"
    d.mkdir(parents=True)
    for name, edit in (("source_info.jsonl", edit_sources), ("response.jsonl", edit_responses)):
        rows = [json.loads(x) for x in (PAIR / name).read_text(encoding="utf-8").splitlines()]
        if edit:
            rows = edit(rows)
        write_lines(d / name, rows)
    return d


def test_ragtruth_pair_errors(tmp_path: Path) -> None:
    def hide_record(rows):
        rows[2]["prompt"] = "Describe the business.\nDescription:"
        return rows

    d = copy_pair(tmp_path, edit_sources=hide_record)
    with pytest.raises(
        DataError, match=r"response.jsonl:5: field 'source_id': .*source_info.jsonl:3"
    ):
        load_dataset(d)
    rep = load_dataset(d, on_error="skip")
    assert len(rep.examples) == 5 and "structured data is not in the prompt" in str(rep.errors[0])

    def orphan(rows):
        rows[0]["source_id"] = "missing"
        return rows

    d2 = copy_pair(tmp_path / "b", edit_responses=orphan)
    with pytest.raises(
        DataError, match=r"response.jsonl:1: field 'source_id': source_id 'missing'"
    ):
        load_dataset(d2)

    def bad_task(rows):
        rows[1]["task_type"] = "Chat"
        return rows

    d3 = copy_pair(tmp_path / "c", edit_sources=bad_task)
    with pytest.raises(DataError, match=r"unknown task_type 'Chat'"):
        load_dataset(d3)
    (d3 / "source_info.jsonl").unlink()
    with pytest.raises(DataError, match="source_info.jsonl is missing"):
        load_dataset(d3, fmt="ragtruth_pair")


# -- interpdetect ------------------------------------------------------------------


def test_interpdetect_uses_prompt_passages(tmp_path: Path) -> None:
    f = write_lines(tmp_path / "fin.jsonl", [interp_record()])
    assert detect_format(f) == "interpdetect"
    (ex,) = load_dataset(f).examples
    assert ex.passages == ("Revenue grew 12% in 2020.", "Costs fell slightly.")
    assert ex.prompt is not None and ex.prompt.endswith("\nAnswer:")
    assert ex.label is True and ex.response[ex.spans[0].start : ex.spans[0].end] == "12 percent"
    assert "0.610" in (ex.spans[0].note or "")
    assert ex.provenance.generator == "Qwen3-0.6B"


def test_interpdetect_label_rules_and_ids(tmp_path: Path) -> None:
    recs = [
        interp_record("a", labels_gpt=0),  # judged faithful: spans dropped
        interp_record("b", labels_gpt=None, labels_llama=0, labels=[]),
        interp_record("c", labels_gpt=None, labels_llama=None),  # falls back to bool(labels)
        interp_record("a", response="Revenue rose by 12 percent, a record."),  # a resample
    ]
    rep = load_dataset(write_lines(tmp_path / "fin.jsonl", recs), fmt="interpdetect")
    a, b, c, a2 = rep.examples
    assert a.label is False and a.spans == ()
    assert b.label is False and c.label is True and c.spans
    assert a2.id == "a-r2"
    assert any("spans dropped" in w for w in rep.warnings)
    assert any("'a-r2'" in w for w in rep.warnings)


def test_interpdetect_exact_duplicate_and_bad_span(tmp_path: Path) -> None:
    f = write_lines(tmp_path / "dup.jsonl", [interp_record("a"), interp_record("a")])
    with pytest.raises(
        DataError, match=r"dup.jsonl:2: field 'id': duplicate id 'a' \(first at .*dup.jsonl:1\)"
    ):
        load_dataset(f, fmt="interpdetect")
    bad = interp_record()
    bad["labels"][0]["text"] = "13 percent"
    with pytest.raises(DataError, match=r"field 'labels': span 0 .* does not match"):
        load_dataset(write_lines(tmp_path / "bad.jsonl", [bad]), fmt="interpdetect")


def test_interpdetect_falls_back_without_layout(tmp_path: Path) -> None:
    rec = interp_record(prompt_spans=[[0, 5]])
    rep = load_dataset(write_lines(tmp_path / "fin.jsonl", [rec]), fmt="interpdetect")
    (ex,) = rep.examples
    assert ex.prompt is None and ex.passages == tuple(rec["documents"])
    assert "without the verbatim prompt" in rep.warnings[0]


# -- generic -----------------------------------------------------------------------


def test_generic_jsonl_default_mapping(tmp_path: Path) -> None:
    f = write_lines(
        tmp_path / "g.jsonl",
        [{"id": "x1", "question": "Q?", "passages": ["P one.", "P two."], "response": "R."}],
    )
    assert detect_format(f) == "generic"
    (ex,) = load_dataset(f).examples
    assert ex.passages == ("P one.", "P two.") and ex.label is None and ex.task == "qa"


def test_generic_csv_with_mapping(tmp_path: Path) -> None:
    f = tmp_path / "g.csv"
    f.write_text(
        "key,q,ctx,answer,halluc,marks,kind\n"
        'a,Where is Tolm?,Tolm is a port. || It lies in the south.,"Tolm is a port\nin the north.",1,"[[15, 27]]",QA\n'
        "b,,Some notice text.,A summary.,no,,summary\n",
        encoding="utf-8",
    )
    m = ColumnMapping(
        id="key",
        question="q",
        passages="ctx",
        response="answer",
        label="halluc",
        spans="marks",
        task="kind",
        passage_sep="||",
    )
    assert detect_format(f) == "generic"
    rep = load_dataset(f, mapping=m)
    a, b = rep.examples
    assert a.passages == ("Tolm is a port.", "It lies in the south.")
    assert a.response[a.spans[0].start : a.spans[0].end] == "in the north"
    assert a.label is True and a.task == "qa" and a.provenance.source == f"{f}:2"
    assert b.task == "summary" and b.question is None and b.label is False
    assert b.provenance.source == f"{f}:4"  # the quoted newline made row a two lines long


def test_generic_missing_column(tmp_path: Path) -> None:
    f = tmp_path / "g.csv"
    f.write_text("text,answer\nhello,world\n", encoding="utf-8")
    with pytest.raises(
        DataError,
        match=r"g.csv:1: field 'id': column\(s\) 'id', 'question', 'passages', 'response' not in the file; available columns: 'text', 'answer'",
    ):
        load_dataset(f)
    j = write_lines(tmp_path / "g.jsonl", [{"doc": "x", "answer": "y"}])
    with pytest.raises(
        DataError,
        match=r"g.jsonl:1: field 'passages': column 'passages' is missing; available: 'doc'",
    ):
        load_dataset(j, fmt="generic", mapping=ColumnMapping(response="answer", id=None))


def test_generic_generated_ids_and_json_list_cell(tmp_path: Path) -> None:
    f = tmp_path / "g.csv"
    f.write_text('ctx,answer\n"[""P1."", ""P2.""]",Yes.\n', encoding="utf-8")
    m = ColumnMapping(
        id=None, question=None, passages="ctx", response="answer", default_task="other"
    )
    (ex,) = load_dataset(f, mapping=m, dataset="mine").examples
    assert ex.id == "mine-00002" and ex.passages == ("P1.", "P2.") and ex.task == "other"


# -- ragscope ----------------------------------------------------------------------


def test_ragscope_round_trip_and_duplicate(tmp_path: Path) -> None:
    exs = builtin_examples()
    f = save_jsonl(exs, tmp_path / "out" / "demo.jsonl")
    assert detect_format(f) == "ragscope"
    assert list(load_dataset(f).examples) == exs
    lines = f.read_text(encoding="utf-8").splitlines()
    write_lines(f, [*lines[:3], lines[0]])
    with pytest.raises(DataError, match=rf"demo.jsonl:4: field 'id': duplicate id '{exs[0].id}'"):
        load_dataset(f)
    with pytest.raises(DataError, match="duplicate id"):
        save_jsonl([exs[0], exs[0]], tmp_path / "dup.jsonl")


def test_ragscope_bad_record_located_here(tmp_path: Path) -> None:
    d = builtin_examples()[0].to_dict()
    d["spans"] = [{"start": 0, "end": 10_000}]
    f = write_lines(tmp_path / "r.jsonl", [d])
    with pytest.raises(DataError, match=r"r.jsonl:1: field 'spans': span \[0, 10000\) runs past"):
        load_dataset(f, fmt="ragscope")


# -- built-in examples and shared data ----------------------------------------------


def test_builtin_examples() -> None:
    exs = builtin_examples()
    assert len(exs) == 12 and len({e.id for e in exs}) == 12
    assert collections.Counter(e.task for e in exs) == {"qa": 8, "summary": 2, "data2txt": 2}
    assert sum(e.label for e in exs) == 6 and all(e.label is not None for e in exs)
    types = {"Evident Conflict", "Subtle Conflict", "Evident Baseless Info", "Subtle Baseless Info"}
    for e in exs:
        assert e.id.startswith("demo-") and e.provenance.dataset == "ragscope-demo"
        assert e.task in TASKS and bool(e.spans) == e.label
        for s in e.spans:
            assert s.type in types and s.note
        if e.task == "data2txt":
            assert isinstance(json.loads(e.passages[0]), dict)


def test_the_full_demo_is_72_hand_checked_answers_with_their_evidence() -> None:
    """The full demo (issue 55.1): the quick 12 first, 60 more; every hallucinated answer
    has typed spans whose notes give the evidence, and a quoted passage text is really in
    a passage of its example."""
    exs = demo_full_examples()
    assert exs[:12] == builtin_examples()
    assert len(exs) == 72 and len({e.id for e in exs}) == 72
    assert resolve_dataset("demo-full") == ("demo-full", exs)
    assert resolve_dataset("demo-full[:12]")[1] == builtin_examples()
    tasks = collections.Counter(e.task for e in exs)
    assert tasks["qa"] >= 30 and tasks["summary"] >= 18 and tasks["data2txt"] >= 18
    labels = collections.Counter(e.label for e in exs)
    assert labels[True] == labels[False] == 36
    types = {"Evident Conflict", "Subtle Conflict", "Evident Baseless Info", "Subtle Baseless Info"}
    seen = collections.Counter()
    for e in exs:
        assert e.provenance.dataset == "ragscope-demo" and e.provenance.generator == "hand-written"
        assert bool(e.spans) == e.label and e.task in TASKS
        assert (e.question is not None) == (e.task == "qa")
        for sp in e.spans:
            text = e.response[sp.start : sp.end]
            assert text == text.strip() and len(text) >= 3, (e.id, text)
            assert sp.type in types and sp.note, e.id
            seen[sp.type] += 1
            for quoted in re.findall(r'"([^"]{6,})"', sp.note):
                assert any(quoted in p for p in e.passages), (e.id, quoted)
        if e.task == "data2txt":
            assert isinstance(json.loads(e.passages[0]), dict)
    assert min(seen[t] for t in types) >= 6, seen


def test_shared_data_dir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSCOPE_SHARED_DATA", str(tmp_path))
    assert shared_data_dir() == tmp_path
    monkeypatch.setenv("RAGSCOPE_SHARED_DATA", str(tmp_path / "absent"))
    assert shared_data_dir() is None


SHARED = [
    ("ragtruth_qa_dev.jsonl", "ragtruth_jsonl", 420, 77),
    ("dolly_ac_dev.jsonl", "ragtruth_jsonl", 138, 80),
    ("finqa_qwen3_interpdetect.jsonl", "interpdetect", 256, None),
]


@pytest.mark.parametrize(("name", "fmt", "n", "n_halluc"), SHARED)
def test_shared_files_load_fully(name: str, fmt: str, n: int, n_halluc: int | None) -> None:
    root = shared_data_dir()
    if root is None or not (root / name).is_file():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{name} is missing from ../shared/data (or RAGSCOPE_SHARED_DATA) in CI")
        pytest.skip(f"{name} not found: ../shared/data is absent (set RAGSCOPE_SHARED_DATA)")
    path = root / name
    assert detect_format(path) == fmt
    rep = load_dataset(path, on_error="raise")
    assert rep.n_read == n and len(rep.examples) == n and not rep.errors
    if n_halluc is not None:
        assert sum(bool(e.label) for e in rep.examples) == n_halluc
    for e in rep.examples:
        assert isinstance(e, RAGExample) and e.prompt is not None


def test_builtin_answers_are_the_embedded_models_own_unlabelled_answers() -> None:
    from core.data import BUILTIN_ANSWERS, load_builtin, resolve_dataset

    name, answers = resolve_dataset(BUILTIN_ANSWERS)
    assert name == BUILTIN_ANSWERS and len(answers) >= 100
    prompts = {e.provenance.group: e for e in load_builtin("test")}
    for a in answers:
        assert a.label is None and not a.spans and a.response.strip()
        assert a.provenance.generator == "SmolLM2-135M-Instruct"
        src = prompts[a.provenance.group]  # one answer per test-split source, same prompt
        assert (a.question, a.passages) == (src.question, src.passages)
    assert len({a.provenance.group for a in answers}) == len(answers)


def test_prefix_spec_keeps_whole_sources_and_the_name() -> None:
    from core.base.examples import source_key
    from core.data import load_builtin, resolve_dataset, resolve_datasets

    full = load_builtin()
    name, head = resolve_dataset("builtin[:7]")
    assert name == "builtin"
    # 7 answers end inside a source: its other answers come along, nothing else.
    keys = {source_key(e) for e in full[:7]}
    assert [e.id for e in head] == [e.id for e in full if source_key(e) in keys][: len(head)]
    assert {source_key(e) for e in head} == keys and len(head) >= 7
    assert len(head) == sum(source_key(e) in keys for e in full)
    # The prefix of a prefix, a prefix past the end, and combined specs.
    assert [e.id for e in resolve_dataset("builtin[:40][:7]")[1]] == [e.id for e in head]
    assert len(resolve_dataset("demo[:100000]")[1]) == len(resolve_dataset("demo")[1])
    names, both = resolve_datasets("builtin[:4],demo[:2]")
    assert names == ["builtin", "demo"] and len(both) >= 6
    with pytest.raises(DataError, match=r"at least one example"):
        resolve_dataset("builtin[:0]")
    with pytest.raises(DataError, match="no such file"):
        resolve_dataset("nothing-here[:3]")
