"""Dataset names are names, never paths or aliases: ``stored:NAME`` reads the stored
dataset only, whatever the name looks like (a server file's path, ``demo``); a name
with a control character is refused when it would be stored; a training job reads no
path a visitor named."""

from __future__ import annotations

from pathlib import Path

import pytest

import core.data.catalog as catalog
from core.base.errors import DataError
from core.base.examples import RAGExample
from core.data import is_named_spec, make_splits, resolve_dataset, stored_spec
from core.learning.artifact import describe_json
from core.services.jobs import TrainSpec
from core.storage import Store

MARKER = "TOP-SECRET-FIRST-LINE"


def _examples(n: int) -> list[RAGExample]:
    return [
        RAGExample(
            id=f"s{i}",
            question=f"question {i}?",
            passages=(f"passage {i}.",),
            response=f"answer {i}.",
            label=bool(i % 2),
        )
        for i in range(n)
    ]


@pytest.fixture
def server_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A server file (a CSV whose first line is a marker) and a stored dataset named
    after its path; the database in ``RAGSCOPE_DB``."""
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "db.sqlite3"))
    secret = tmp_path / "srv" / "x.csv"
    secret.parent.mkdir()
    rows = "".join(f"q{i},p{i},r{i}\n" for i in range(9))
    secret.write_text(f"{MARKER},passages,response\n{rows}")
    with Store() as s:
        s.import_dataset(str(secret), _examples(3), source="upload", fmt="ragscope")
        s.import_dataset("demo", _examples(5), source="upload", fmt="ragscope")
    return secret


def test_a_stored_name_that_is_a_path_reads_the_stored_rows(
    server_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[object] = []
    real = catalog.load_dataset

    def spy(path, *a, **kw):
        opened.append(path)
        return real(path, *a, **kw)

    monkeypatch.setattr(catalog, "load_dataset", spy)
    name, examples = resolve_dataset(stored_spec(str(server_file)))
    assert name == str(server_file) and [e.id for e in examples] == ["s0", "s1", "s2"]
    # An alias's name is a name too: the stored "demo", not the 12 built-in examples.
    name, examples = resolve_dataset(stored_spec("demo"))
    assert name == "demo" and len(examples) == 5
    # What the Train form's estimate and the job's worker read (make_splits).
    _, _, splits = make_splits(stored_spec(str(server_file)))
    assert sorted(e.id for part in splits.values() for e in part) == ["s0", "s1", "s2"]
    # A prefix of a stored dataset; a stored name that itself ends in [:N] is that name.
    name, examples = resolve_dataset(stored_spec("demo[:2]"))
    assert name == "demo" and [e.id for e in examples] == ["s0", "s1"]
    with Store() as s:
        s.import_dataset("demo[:2]", _examples(4), source=None, fmt=None)
    assert len(resolve_dataset(stored_spec("demo[:2]"))[1]) == 4
    assert opened == []  # no file was opened, the server file least of all
    with pytest.raises(DataError, match="no stored dataset named") as e:
        resolve_dataset(stored_spec(str(server_file) + ".other"))
    assert MARKER not in str(e.value)


def test_a_job_reads_a_dataset_by_name_only(server_file: Path) -> None:
    ok = TrainSpec.of(model="tiny", detectors=("nll",), dataset=stored_spec(str(server_file)))
    assert ok.argv("/out")[ok.argv("/out").index("--dataset") + 1] == f"stored:{server_file}"
    for spec in ("demo", "builtin", "builtin[:40]", "shared:ragtruth_qa_dev", "stored:x"):
        assert is_named_spec(spec), spec
    for path in (str(server_file), "../x.csv", "assets/examples/demo.jsonl"):
        assert not is_named_spec(path)
        with pytest.raises(DataError, match="reads a dataset by name"):
            TrainSpec.of(model="tiny", detectors=("nll",), dataset=path)


@pytest.mark.parametrize("bad", ["a\x00b", "a\x1bb", "a\u202eb", "a\rb", "x" * 201, " "])
def test_a_dataset_name_with_a_control_character_is_not_stored(tmp_path: Path, bad: str) -> None:
    with Store(tmp_path / "db.sqlite3") as s:
        s.import_dataset("kept", _examples(2), source=None, fmt=None)
        with pytest.raises(DataError, match="U\\+|at most 200|non-empty") as e:
            s.import_dataset(bad, _examples(2), source=None, fmt=None, replace=True)
        assert e.value.field == "name"
        assert [d.name for d in s.list_datasets()] == ["kept"]  # nothing stored is lost


@pytest.mark.parametrize("bad", ["a\x00b", "a\x1bb", "a\u202eb", "a\nb", "a\u2028b"])
def test_an_example_id_with_a_control_character_is_refused_like_a_name(bad: str) -> None:
    with pytest.raises(DataError, match=r"holds the control character U\+") as e:
        RAGExample(id=bad, question="q?", passages=("p.",), response="r.")
    assert e.value.field == "id" and "position 1" in str(e.value)


def test_an_error_about_a_huge_number_stays_short() -> None:
    assert describe_json(10**1000) == "a number of about 1001 digits"
    assert describe_json(2.5) == "the number 2.5"
