"""Loaders never crash and say exactly where: one fixture per hostile case, then a
Hypothesis fuzz whose only allowed outcomes are examples or a DataError."""

from __future__ import annotations

import csv
import io
import json
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.base.errors import MAX_MESSAGE, DataError
from core.base.examples import RAGExample
from core.cli import main
from core.data import FORMATS, ColumnMapping, load_dataset

GOOD = {"id": "a", "task": "qa", "question": "q?", "passages": ["p one"], "response": "r one"}


def _rec(i: int, **over) -> str:
    return json.dumps({**GOOD, "id": f"r{i}", "spans": [], **over})


def _jsonl(tmp_path: Path, lines: list[str | bytes], name: str = "d.jsonl") -> Path:
    p = tmp_path / name
    p.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return p


@pytest.fixture(autouse=True)
def _isolated_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "db.sqlite3"))


# --------------------------------------------------------------------------- JSONL


def test_an_integer_over_the_digit_limit_is_located(tmp_path: Path) -> None:
    p = _jsonl(tmp_path, [_rec(1), _rec(2), '{"id": ' + "7" * 5000 + "}", _rec(4)])
    with pytest.raises(DataError, match=rf"{p}:3: unreadable JSON value .*digits"):
        load_dataset(p, fmt="ragscope")
    rep = load_dataset(p, fmt="ragscope", on_error="skip")
    assert [e.id for e in rep.examples] == ["r1", "r2", "r4"] and len(rep.errors) == 1


def test_deep_nesting_is_a_data_error_not_a_recursion_error(tmp_path: Path) -> None:
    deep = '{"id": "x", "passages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    p = _jsonl(tmp_path, [_rec(1), deep])
    rep = load_dataset(p, fmt="ragscope", on_error="skip")
    assert [e.id for e in rep.examples] == ["r1"]
    assert rep.errors[0].source == f"{p}:2" and "nested too deeply" in str(rep.errors[0])


def test_lone_surrogates_are_refused_at_construction(tmp_path: Path) -> None:
    p = _jsonl(tmp_path, [_rec(1), _rec(2, response="r \ud800 two"), _rec(3)])
    rep = load_dataset(p, fmt="ragscope", on_error="skip")
    assert [e.id for e in rep.examples] == ["r1", "r3"]
    err = rep.errors[0]
    assert (
        err.source == f"{p}:2" and err.field == "response" and "lone UTF-16 surrogate" in str(err)
    )
    with pytest.raises(DataError, match="lone UTF-16 surrogate") as e:
        RAGExample(id="x", question="q", passages=("p\udcff",), response="r")
    assert e.value.field == "passages"
    with pytest.raises(DataError, match="lone UTF-16 surrogate"):
        RAGExample.from_dict({**GOOD, "provenance": {"generator": "\ud83d"}})


def test_a_utf8_bom_on_jsonl_is_accepted(tmp_path: Path) -> None:
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + (_rec(1) + "\n" + _rec(2) + "\n").encode())
    for fmt in ("auto", "ragscope"):
        rep = load_dataset(p, fmt=fmt)
        assert [e.id for e in rep.examples] == ["r1", "r2"] and rep.fmt == "ragscope"


def test_non_utf8_bytes_are_reported_at_their_real_line(tmp_path: Path) -> None:
    # 20 KB of good lines first: a decoder reading 8 KB chunks would blame an earlier line.
    good = [_rec(i, response="x" * 900) for i in range(1, 21)]
    bad = _rec(21).encode().replace(b"r one", b"r \xff one")
    p = _jsonl(tmp_path, [*good, bad, _rec(22)])
    with pytest.raises(DataError) as e:
        load_dataset(p, fmt="ragscope")
    col = bad.index(b"\xff") + 1
    assert e.value.source == f"{p}:21:{col}" and "not UTF-8" in str(e.value)
    rep = load_dataset(p, fmt="ragscope", on_error="skip")
    assert len(rep.examples) == 21 and rep.examples[-1].id == "r22"


def test_truncated_json_has_its_real_column(tmp_path: Path) -> None:
    line = _rec(2)[:40]
    p = _jsonl(tmp_path, [_rec(1), line])
    with pytest.raises(DataError) as e:
        load_dataset(p, fmt="ragscope")
    try:
        json.loads(line)
    except json.JSONDecodeError as j:
        want = f"{p}:2:{j.colno}"
    assert e.value.source == want and "invalid JSON" in str(e.value)


def test_an_overlong_line_is_an_error_and_the_next_line_loads(tmp_path: Path, monkeypatch) -> None:
    import core.data.records as records

    monkeypatch.setattr(records, "MAX_RECORD_BYTES", 1000)
    p = _jsonl(tmp_path, [_rec(1), _rec(2, response="y" * 5000), _rec(3)])
    rep = load_dataset(p, fmt="ragscope", on_error="skip")
    assert [e.id for e in rep.examples] == ["r1", "r3"]
    assert rep.errors[0].source == f"{p}:2" and "over" in str(rep.errors[0])


# --------------------------------------------------------------------------- CSV


def _csv(tmp_path: Path, text: str, name: str = "d.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


HEADER = "id,question,passages,response\n"


def test_csv_fields_over_the_csv_modules_limit_load(tmp_path: Path, monkeypatch) -> None:
    long = "w " * 100_000  # 200 KB, over csv's default 128 KiB field limit
    p = _csv(tmp_path, HEADER + f'1,q,"{long}",r\n2,q,p,r\n')
    rep = load_dataset(p)
    assert [len(e.passages[0]) for e in rep.examples] == [len(long.strip()), 1]
    import core.data.records as records

    monkeypatch.setattr(records, "MAX_CSV_FIELD", 50_000)
    with pytest.raises(DataError, match=rf"{p}:2: .*never closes \(or is over"):
        load_dataset(p)


def test_an_unclosed_csv_quote_is_an_error_where_it_opens(tmp_path: Path) -> None:
    p = _csv(tmp_path, HEADER + '1,q,p,r\n2,q,"p, r\n3,q,p,r\n4,q,p,r\n')
    with pytest.raises(DataError, match=rf"{p}:3: a quoted field opens here and never closes"):
        load_dataset(p)
    rep = load_dataset(p, on_error="skip")
    assert [e.id for e in rep.examples] == ["1"] and len(rep.errors) == 1  # not swallowed


def test_a_stray_quote_is_an_error_at_its_row_and_the_rest_loads(tmp_path: Path) -> None:
    p = _csv(tmp_path, HEADER + '1,q,p,r\n2,q,"p"x,r\n3,q,p,r\n')
    rep = load_dataset(p, on_error="skip")
    assert [e.id for e in rep.examples] == ["1", "3"]
    assert rep.errors[0].source == f"{p}:3" and "malformed CSV" in str(rep.errors[0])


def test_non_utf8_csv_line_is_located_and_skipped(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_bytes((HEADER + "1,q,p,r\n").encode() + b"2,q,p\xe9,r\n" + b"3,q,p,r\n")
    rep = load_dataset(p, on_error="skip")
    assert [e.id for e in rep.examples] == ["1", "3"]
    assert rep.errors[0].source == f"{p}:3:6" and "not UTF-8" in str(rep.errors[0])


def test_duplicate_and_extra_csv_columns_are_warned_and_named(tmp_path: Path) -> None:
    p = _csv(
        tmp_path,
        "id,question,passages,response,response,notes\n1,q,p,first,second,n\n2,q,p,r,s,n,EXTRA\n",
    )
    rep = load_dataset(p)
    assert [e.response for e in rep.examples] == ["second", "s"]
    text = "\n".join(rep.warnings)
    assert "'response' appear more than once" in text and "'notes'" in text
    assert f"{p}:3: 1 cell(s) beyond the header" in text


def test_a_csv_bom_and_blank_lines_are_fine(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_bytes(b"\xef\xbb\xbf" + (HEADER + "1,q,p,r\n\n2,q,p,r\n").encode())
    assert [e.id for e in load_dataset(p).examples] == ["1", "2"]


# --------------------------------------------------------------------------- message sizes

WIDE = 300_000  # keys or columns: the unbounded messages ran to megabytes


def test_a_record_with_many_keys_gets_a_short_message(tmp_path: Path) -> None:
    p = _jsonl(tmp_path, [json.dumps({f"k{i}": 0 for i in range(WIDE)})])
    rep = load_dataset(p, on_error="skip")
    msg = str(rep.errors[0])
    assert len(msg) < 500, len(msg)
    assert "column 'response' is missing" in msg and "'k9' and 299,990 more" in msg
    assert msg.endswith("pass a ColumnMapping that names the right columns")  # the fix stays


def test_a_csv_header_with_many_columns_gets_short_messages(tmp_path: Path) -> None:
    cols = ",".join(f"c{i}" for i in range(WIDE))
    with pytest.raises(DataError) as e:
        load_dataset(_csv(tmp_path, cols + "\n"))
    assert len(str(e.value)) < 800 and "'c9' and 299,990 more" in str(e.value)
    # Read, but each unread (and each repeated) column warned about in one short line.
    p = _csv(tmp_path, HEADER.strip() + "," + cols + "," + cols + ",x\n1,q,p,r\n", "w.csv")
    rep = load_dataset(p)
    assert [e.id for e in rep.examples] == ["1"]
    assert max(map(len, rep.warnings)) < 800, [len(w) for w in rep.warnings]
    assert any("and 299,990 more appear more than once" in w for w in rep.warnings)


def test_a_long_value_is_quoted_short(tmp_path: Path) -> None:
    p = _jsonl(tmp_path, [_rec(1, task="t" * 1_000_000, label="L" * 1_000_000)])
    with pytest.raises(DataError) as e:
        load_dataset(p, fmt="ragscope")
    assert len(str(e.value)) < 500 and "(1,000,000 characters)" in str(e.value)


def test_every_data_error_message_is_bounded() -> None:
    e = DataError("start " + "x" * 10_000_000 + " the fix", source="s" * 100_000, field="f" * 1000)
    assert len(str(e)) <= MAX_MESSAGE + 100 and len(e.reason) <= MAX_MESSAGE + 100
    assert str(e).startswith("sss") and str(e).endswith("x the fix")
    assert "characters cut" in str(e) and "start" in e.reason


# --------------------------------------------------------------------------- the CLI


def test_validate_prints_each_error_once_and_options_go_anywhere(tmp_path: Path, capsys) -> None:
    p = _jsonl(tmp_path, [_rec(1), "{broken", _rec(3), _rec(4, passages=[])])
    for argv in (
        ["datasets", "validate", str(p), "--format", "ragscope"],
        ["datasets", "validate", "--format", "ragscope", str(p)],
    ):
        assert main(argv) == 1
        out = capsys.readouterr().out
        assert out.count(f"{p}:2:2") == 1, out
        assert out.count(f"{p}:4") == 1, out
        assert "2 of 4 records loaded" in out


def test_import_is_all_or_nothing_unless_skip_bad(tmp_path: Path, capsys) -> None:
    from core.storage import Store

    p = _jsonl(tmp_path, [_rec(1), "{broken", _rec(3)])
    assert main(["datasets", "import", str(p), "--name", "x", "--format", "ragscope"]) == 2
    assert "x" not in {d.name for d in Store().list_datasets()}
    assert main(["datasets", "import", "--skip-bad", str(p), "--name", "x"]) == 0
    assert [e.id for e in Store().load_examples("x")] == ["r1", "r3"]


# --------------------------------------------------------------------------- fuzz

KEYS = [
    "id", "task", "question", "passages", "response", "spans", "label", "prompt",
    "provenance", "input", "output", "hall_info", "model", "context", "documents",
    "prompt_spans", "labels", "labels_gpt", "start", "end", "text", "type", "ragscope",
    "source_id", "task_type", "source_info",
]  # fmt: skip

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
json_tree = st.recursive(
    json_leaf,
    lambda kids: (
        st.lists(kids, max_size=5)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), kids, max_size=6)
    ),
    max_leaves=30,
)

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _only_examples_or_data_error(path: Path, **kw) -> None:
    for fmt in FORMATS:
        if fmt == "ragtruth_pair":
            continue
        for on_error in ("raise", "skip"):
            try:
                rep = load_dataset(path, fmt=fmt, on_error=on_error, **kw)
            except DataError:
                continue
            assert all(isinstance(e, RAGExample) for e in rep.examples)
            assert all(isinstance(e, DataError) for e in rep.errors)
            for e in rep.examples:  # what loads can be stored and shown
                e.to_json().encode("utf-8")


@FUZZ
@given(data=st.binary(max_size=600))
def test_fuzz_random_bytes(tmp_path: Path, data: bytes) -> None:
    for name in ("f.jsonl", "f.csv"):
        p = tmp_path / name
        p.write_bytes(data)
        _only_examples_or_data_error(p)


@FUZZ
@given(records=st.lists(json_tree, min_size=1, max_size=4))
def test_fuzz_random_json_trees(tmp_path: Path, records: list) -> None:
    p = tmp_path / "f.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    _only_examples_or_data_error(p)
    # ...and as records the converters go deep into
    full = [{**GOOD, **r} if isinstance(r, dict) else r for r in records]
    p.write_text("\n".join(json.dumps(r) for r in full) + "\n")
    _only_examples_or_data_error(p)


cell = st.text(alphabet=string.printable + 'éß\u2028\ufeff"', max_size=30)


@FUZZ
@given(
    header=st.lists(
        st.sampled_from(["id", "question", "passages", "response", "label", "spans", "x"]) | cell,
        min_size=1,
        max_size=7,
    ),
    rows=st.lists(st.lists(cell, max_size=8), max_size=6),
    raw_tail=st.text(max_size=40),
)
def test_fuzz_random_csv(tmp_path: Path, header: list, rows: list, raw_tail: str) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    p = tmp_path / "f.csv"
    p.write_text(buf.getvalue() + raw_tail, encoding="utf-8", errors="surrogatepass")
    _only_examples_or_data_error(p)
    _only_examples_or_data_error(p, mapping=ColumnMapping(label="label", spans="spans"))
