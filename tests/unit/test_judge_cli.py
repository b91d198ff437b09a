"""``ragscope judge``: the set's verdict on every answer of a file or dataset, the same
numbers as core.pipeline.judge.judge(), JSONL/CSV/Parquet one schema, formula-safe CSV, failures
named and skipped, resumable through the feature cache and the JSONL it wrote."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import core.base.paths
import core.cli.judging
import core.pipeline.extract
import core.services.bench as bench
from core.cli import main
from core.data import builtin_examples, resolve_datasets, save_jsonl
from core.detectors import make_detector
from core.evaluation.recipe import trained_on_record
from core.pipeline.extract import extract_features
from core.pipeline.judge import judge, verdict_rows
from core.pipeline.sets import EXPERTS_FILE, load_set
from core.services.bench import bench_judge

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DEMO_DATASET = "ragscope-demo"  # the demo answers' dataset, as their records name it
MODEL = ["--model", "tiny", "--device", "cpu"]


@pytest.fixture(scope="module")
def tiny_set_dir(tiny_model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nll, context_gain and cortex (3 epochs) fitted on the demo answers, saved."""
    out = tmp_path_factory.mktemp("judge-set")
    examples = builtin_examples()
    dets = [make_detector("nll"), make_detector("context_gain"), make_detector("cortex", epochs=3)]
    feats = extract_features(tiny_model, examples, dets).features
    for d in dets:
        d.fit(list(feats[d.name]), examples).save(out / d.name)
    return out


@pytest.fixture
def env(tiny_set_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny set as the detectors, a fresh feature cache; returns the tmp folder."""
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(tiny_set_dir))
    monkeypatch.setenv("RAGSCOPE_TRAINED_DIR", str(tmp_path / "trained"))
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "cache.sqlite3"))
    return tmp_path


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The answers each traced feature pass of judge_many computed, as they happen."""
    seen: list[int] = []
    real = core.pipeline.extract.run_examples

    def counting(model, examples, detectors):  # type: ignore[no-untyped-def]
        seen.append(len(examples))
        return real(model, examples, detectors)

    monkeypatch.setattr(core.pipeline.extract, "run_examples", counting)
    return seen


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_judge_writes_the_records_judge_gives_in_every_format_and_resumes(
    env: Path, tiny_model, passes: list[int], capsys
) -> None:
    out = env / "v.jsonl"
    report = env / "r.html"
    assert main(["judge", "demo", *MODEL, "--out", str(out), "--html", str(report)]) == 0
    text = capsys.readouterr().out
    assert "12 judged," in text and "0 failed" in text and "0 of 12 read every feature" in text
    assert "on 12 labelled answers" in text and "Too few answers: The labelled answers" in text
    assert sum(passes) == 12
    records = _jsonl(out)
    examples = builtin_examples()
    assert [r["id"] for r in records] == [e.id for e in examples]
    records_as_written = [dict(r) for r in records]
    dset = load_set(tiny_model.info.key)
    for ex, rec in zip(examples, records, strict=True):
        one = judge(tiny_model, ex, dset).to_record()
        # the same schema and the same numbers as judge() (the timing aside)
        assert rec.pop("seconds") > 0 and one.pop("seconds") > 0
        assert rec == one
    assert sum(r["hallucinated"] for r in records) == int(text.split(" judged, ")[1].split()[0])
    page = report.read_text(encoding="utf-8")
    assert page.count("<h2>") == 12 and "<script" not in page and examples[0].id in page

    # a second run: every answer already in the JSONL is skipped, nothing traced
    passes.clear()
    assert main(["judge", "demo", *MODEL, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "12 answers already in" in captured.err and "0 judged" in captured.out
    assert _jsonl(out) == records_as_written and passes == []

    # CSV and Parquet: one row per answer, every feature read from the cache
    for suffix in ("csv", "parquet"):
        path = env / f"v.{suffix}"
        assert main(["judge", "demo", *MODEL, "--out", str(path)]) == 0
        assert "12 of 12 read every feature from the cache" in capsys.readouterr().out
        frame = pd.read_csv(path) if suffix == "csv" else pd.read_parquet(path)
        want = verdict_rows(records)
        assert list(frame.columns) == list(want.columns)
        assert "cortex.probability" in frame.columns and "label" in frame.columns
        assert list(frame["id"]) == [r["id"] for r in records]
        for col in ("probability", "nll.probability", "cortex.threshold", "n_flagged"):
            assert list(frame[col]) == pytest.approx(list(want[col]))
        assert [json.loads(s) for s in frame["spans"]] == [r["spans"] for r in records]
    assert passes == []


def test_judge_writes_spans_in_the_span_detector_schema_and_refuses_folders_first(
    env: Path, passes: list[int], capsys
) -> None:
    out, spans = env / "v.jsonl", env / "spans.jsonl"
    assert main(["judge", "demo", *MODEL, "--out", str(out), "--spans", str(spans)]) == 0
    records = _jsonl(out)
    lettuce = _jsonl(spans)
    assert [x["id"] for x in lettuce] == [r["id"] for r in records]
    for x, r in zip(lettuce, records, strict=True):
        assert x["spans"] == [
            {"start": s["start"], "end": s["end"], "text": s["text"], "confidence": s["score"]}
            for s in r["spans"]
        ]
        assert r["span_judge"] in ("nll", "context_gain", "cortex") and r["span_rule"]
        assert r["spans"] or r["span_note"]  # where, or why not
    capsys.readouterr()
    passes.clear()
    folder = env / "a-folder.jsonl"
    folder.mkdir()
    for option in ("--out", "--html", "--spans"):
        args = ["judge", "demo", *MODEL, "--out", str(env / "w.jsonl"), option, str(folder)]
        assert main(args) != 0
        assert f"{option} {str(folder)!r} is a folder" in capsys.readouterr().err
    assert passes == []  # refused before any judging


def test_judge_never_replaces_a_file_it_did_not_write(env: Path, passes: list[int], capsys) -> None:
    out, spans, report, table = env / "v.jsonl", env / "s.jsonl", env / "r.html", env / "t.csv"
    answers = env / "mine.jsonl"
    answers.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {
                    "id": "x1",
                    "question": "Who built it?",
                    "passages": ["Ada built it in 1820."],
                    "response": "Ada built it.",
                }
            ]
        ),
        encoding="utf-8",
    )
    theirs = {
        report: "<html><body>my own notes</body></html>",
        spans: '{"my": "annotations"}\n',
        table: "name,score\nmine,1\n",
    }
    for path, text in theirs.items():
        path.write_text(text, encoding="utf-8")
    capsys.readouterr()
    passes.clear()
    for option, path in (("--html", report), ("--spans", spans), ("--out", table)):
        args = ["judge", str(answers), *MODEL, "--out", str(out), option, str(path)]
        if option == "--out":
            args = ["judge", str(answers), *MODEL, "--out", str(path)]
        assert main(args) != 0
        assert "is not a file ragscope judge wrote" in capsys.readouterr().err
    args = ["judge", str(answers), *MODEL, "--out", str(out), "--spans", str(answers)]
    assert main(args) != 0
    assert "is the answers' own file" in capsys.readouterr().err
    assert passes == [] and not out.exists()  # refused before any judging
    for path, text in theirs.items():
        assert path.read_text(encoding="utf-8") == text  # untouched

    # What judge wrote itself it replaces on the next run.
    for path in theirs:
        path.unlink()
    args = ["judge", str(answers), *MODEL, "--out", str(out), "--html", str(report)]
    assert main([*args, "--spans", str(spans)]) == 0
    assert main([*args, "--spans", str(spans)]) == 0
    assert main(["judge", str(answers), *MODEL, "--out", str(table)]) == 0
    assert main(["judge", str(answers), *MODEL, "--out", str(table)]) == 0
    assert _jsonl(spans)[0]["id"] == "x1" and "x1" in report.read_text(encoding="utf-8")


def test_a_jsonl_out_is_resumed_only_when_every_line_is_a_verdict(
    env: Path, passes: list[int], capsys
) -> None:
    """Nothing of an --out that is not wholly this set's verdicts changes, not even a last
    line without its newline; a symlink (even dangling) or a folder is refused before
    any judging."""
    answers = env / "two.jsonl"
    save_jsonl(builtin_examples()[:2], answers)
    out = env / "v.jsonl"
    target = env / "elsewhere.txt"
    link = env / "link.jsonl"
    link.symlink_to(target)
    folder = env / "folder.jsonl"
    folder.mkdir()
    cases = {
        env / "one-line.jsonl": "my notes, no newline",
        env / "notes.jsonl": '{"id": "mine", "text": "kept"}',
    }
    for path, text in cases.items():
        path.write_text(text, encoding="utf-8")
    capsys.readouterr()
    passes.clear()
    for path in (*cases, link, folder):
        assert main(["judge", str(answers), *MODEL, "--out", str(path)]) != 0
    err = capsys.readouterr().err
    assert err.count("is not a verdict") == 2 and "nothing was written" in err
    assert "is a symbolic link" in err and "is a folder" in err
    assert passes == [] and not target.exists()
    for path, text in cases.items():
        assert path.read_text(encoding="utf-8") == text
    # a whole verdict that lost only its newline is kept, and the next starts a new line
    assert main(["judge", str(answers), *MODEL, "--out", str(out), "--limit", "1"]) == 0
    first = out.read_text(encoding="utf-8")
    out.write_text(first.rstrip("\n"), encoding="utf-8")
    assert main(["judge", str(answers), *MODEL, "--out", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and lines[0] == first.rstrip("\n")
    assert "1 answer already in" in capsys.readouterr().err
    # a verdict then something else, unterminated: refused, the file as it was
    broken = first + "not a verdict"
    out.write_text(broken, encoding="utf-8")
    assert main(["judge", str(answers), *MODEL, "--out", str(out)]) != 0
    assert "its last line (2) is not a verdict" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == broken
    assert sorted(p.name for p in env.iterdir() if p.name.endswith(".partial")) == []


def test_hostile_answers_are_neutralised_and_failures_named_and_skipped(env: Path, capsys) -> None:
    exs = builtin_examples()
    hostile = dataclasses.replace(
        exs[0],
        id='=HYPERLINK("http://x")',
        response="=1+1 <script>alert(1)</script> The lighthouse is 34 metres tall.",
        spans=(),
        label=None,
    )
    too_long = dataclasses.replace(
        exs[1], id="far-too-long", response="word " * 5000, spans=(), label=None
    )
    data = env / "mine.jsonl"
    save_jsonl([hostile, too_long, exs[2]], data)
    with data.open("a", encoding="utf-8") as f:
        f.write("{this is not json\n")
    out = env / "v.csv"
    html = env / "r.html"
    assert main(["judge", str(data), *MODEL, "--out", str(out), "--html", str(html)]) == 0
    captured = capsys.readouterr()
    assert "FAILED far-too-long:" in captured.err and "more than the model" in captured.err
    assert f"FAILED record {data}:4:" in captured.err and "invalid JSON" in captured.err
    assert "2 judged," in captured.out and "2 failed" in captured.out
    frame = pd.read_csv(out, dtype=str)
    assert list(frame["id"]) == ['\'=HYPERLINK("http://x")', exs[2].id]
    assert not any(str(c).startswith(("=", "+", "-", "@")) for c in frame.to_numpy().ravel())
    page = html.read_text(encoding="utf-8")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page

    # nothing judged: non-zero, with the reasons
    only = env / "only-bad.jsonl"
    save_jsonl([too_long], only)
    assert main(["judge", str(only), *MODEL, "--out", str(env / "none.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "no answer could be judged" in err and "far-too-long" in err


def test_a_stopped_jsonl_run_resumes_after_its_last_whole_line(
    env: Path, passes: list[int], capsys
) -> None:
    data = env / "five.jsonl"
    save_jsonl(builtin_examples()[:5], data)
    out = env / "v.jsonl"
    assert main(["judge", str(data), *MODEL, "--out", str(out)]) == 0
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    # as if stopped while writing the fourth verdict
    out.write_text("".join(lines[:3]) + lines[3][:40], encoding="utf-8")
    passes.clear()
    capsys.readouterr()
    assert main(["judge", str(data), *MODEL, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "3 answers already in" in captured.err and "2 judged" in captured.out
    assert "2 of 2 read every feature from the cache" in captured.out and passes == []
    again = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    before = [json.loads(line) for line in lines]
    for r in (*again, *before):
        r.pop("seconds")
    assert again == before  # the cut line judged anew, from the cache, the same


def test_detector_subsets_and_sets_are_checked(env: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "nll.jsonl"
    argv = ["judge", "demo[:3]", *MODEL, "--out", str(out), "--detectors", "nll"]
    assert main(argv) == 0
    recs = _jsonl(out)
    assert [list(r["detectors"]) for r in recs] == [["nll"]] * len(recs)
    assert all(r["judge"] == "vote" and r["n_detectors"] == 1 for r in recs)
    # another subset into the same JSONL is refused, not mixed in
    argv = ["judge", "demo[:3]", *MODEL, "--out", str(out), "--detectors", "nll,cortex"]
    assert main(argv) == 2
    assert "not a verdict of the custom set's nll, cortex" in capsys.readouterr().err
    argv = ["judge", "demo", *MODEL, "--out", str(tmp_path / "x.jsonl"), "--detectors", "nll,zzz"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no zzz" in err and "context_gain, cortex, nll" in err
    assert (
        main(["judge", "demo", *MODEL, "--out", str(tmp_path / "y.jsonl"), "--set", "no-such"]) == 2
    )
    err = capsys.readouterr().err
    assert "no detector set 'no-such'" in err and "the shipped sets are" in err and "default" in err
    assert main(["judge", "demo", *MODEL, "--out", str(tmp_path / "v.txt")]) == 2
    assert ".jsonl, .csv, .parquet" in capsys.readouterr().err


def test_bench_judge_times_the_set_against_plain_forwards(
    env: Path, tiny_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each answer's plain forward is timed just before that answer is judged (timed in
    separate blocks, a noisy machine moved the ratio by a third between runs)."""
    calls: list[str] = []
    real_judge, real_sync = bench.judge_many, bench._sync

    def judged(model, examples, *a, **kw):  # noqa: ANN001, ANN202
        examples = list(examples)
        calls.append("judge " + ",".join(e.id for e in examples))
        return real_judge(model, examples, *a, **kw)

    def synced(model) -> None:  # noqa: ANN001 (after each plain forward)
        calls.append("plain")
        real_sync(model)

    monkeypatch.setattr(bench, "judge_many", judged)
    monkeypatch.setattr(bench, "_sync", synced)
    (rep,) = bench_judge(tiny_model, 2, (None,), dataset="demo")
    a, b = calls[3::2]  # the two answers, each judged on its own
    assert calls == ["plain", a, "plain", a, "plain", b] and a != b and "," not in a + b
    assert rep.set_name == "custom" and rep.detectors == ("context_gain", "cortex", "nll")
    assert rep.n_answers == 2 and rep.judge_s > 0 and rep.plain_s > 0
    assert rep.ratio == rep.judge_s / rep.plain_s
    assert rep.answers_per_min == pytest.approx(120 / rep.judge_s)
    assert "answers/min" in rep.to_lines()[0] and "x one plain forward" in rep.to_lines()[0]


def test_engine_ray_fills_the_cache_then_judges_from_it(
    env: Path, passes: list[int], capsys
) -> None:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        out = env / "ray.jsonl"
        argv = ["judge", "demo[:3]", *MODEL, "--out", str(out), "--engine", "ray"]
        assert main([*argv, "--actors", "1"]) == 0
    finally:
        ray.shutdown()
    captured = capsys.readouterr()
    n = len(_jsonl(out))
    assert f"features (ray): {n} computed" in captured.err
    # the fitted detectors' feature options reached the actors: every feature was cached
    assert f"{n} of {n} read every feature from the cache" in captured.out and passes == []


def test_ctrl_c_keeps_the_verdicts_written_and_says_how_to_resume(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    real = core.cli.judging.judge_many

    def stopped_after_two(*a, **k):  # type: ignore[no-untyped-def]
        for n, got in enumerate(real(*a, **k)):
            if n == 2:
                raise KeyboardInterrupt
            yield got

    monkeypatch.setattr(core.cli.judging, "judge_many", stopped_after_two)
    out = env / "v.jsonl"
    assert main(["judge", "demo", *MODEL, "--out", str(out)]) == 130
    assert "stopped after 2 answers; 2 verdicts written" in capsys.readouterr().err
    assert len(_jsonl(out)) == 2
    monkeypatch.setattr(core.cli.judging, "judge_many", real)
    assert main(["judge", "demo", *MODEL, "--out", str(out)]) == 0
    assert "2 answers already in" in capsys.readouterr().err and len(_jsonl(out)) == 12


@pytest.fixture
def with_expert(tiny_model, tiny_set_dir: Path, env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny set as a custom set naming an expert for the demo answers (a shipped set
    trained on 8 of them alone); returns the custom set's folder."""
    shipped = env / "detector-sets"
    examples = resolve_datasets("demo")[1]  # of their own dataset, as every path reads them
    ds = examples[0].provenance.dataset
    assert ds == DEMO_DATASET
    dets = [make_detector("nll"), make_detector("context_gain"), make_detector("cortex", epochs=3)]
    feats = extract_features(tiny_model, examples, dets).features
    fitted = examples[:8]
    record = trained_on_record(None, dataset=ds, parts={ds: fitted}, fitted=fitted)
    for d in dets:
        d.fit(list(feats[d.name])[:8], fitted).save(
            shipped / "demo-only" / d.name, extra={"trained_on": record}
        )
    monkeypatch.setattr(core.base.paths, "detector_sets_dir", lambda: shipped)
    own = env / "custom"
    shutil.copytree(tiny_set_dir, own)
    (own / EXPERTS_FILE).write_text('{"experts": ["demo-only"]}', encoding="utf-8")
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(own))
    return own


def test_judge_as_judges_every_answer_as_one_training_dataset_and_says_so(
    tiny_model, with_expert: Path, env: Path, capsys
) -> None:
    """``--judge-as pooled`` keeps the demo answers from the demo expert (the asked set
    judges them by its pooled calibration); ``--judge-as demo`` sends them to it; a name
    the set keeps nothing for is refused with the choices; a JSONL judged one way is
    never resumed another."""
    examples = resolve_datasets("demo")[1][:3]
    pooled = env / "pooled.jsonl"
    assert main(["judge", "demo[:3]", *MODEL, "--out", str(pooled), "--judge-as", "pooled"]) == 0
    assert "judged by all the training data" in capsys.readouterr().out
    recs = _jsonl(pooled)
    assert [(r["set"], r["deferred_from"], r["judged_as"]) for r in recs] == [
        ("custom", None, "pooled")
    ] * 3
    asked = load_set(tiny_model.info.key)
    for r, ex in zip(recs, examples, strict=True):
        want = judge(tiny_model, dataclasses.replace(ex, provenance=dataclasses.replace(
            ex.provenance, dataset="elsewhere")), asked)  # fmt: skip
        assert r["probability"] == pytest.approx(want.probability, abs=1e-6)
    as_demo = env / "as-demo.csv"
    as_own = ["--judge-as", DEMO_DATASET]
    assert main(["judge", "demo[:3]", *MODEL, "--out", str(as_demo), *as_own]) == 0
    table = pd.read_csv(as_demo)
    assert list(table["set"]) == ["demo-only"] * 3
    assert list(table["judged_as"]) == [DEMO_DATASET] * 3
    # Nothing of its own for that name: refused before a pass, naming what it can judge as.
    bad = env / "bad.jsonl"
    assert main(["judge", "demo[:3]", *MODEL, "--out", str(bad), "--judge-as", "ragtruth"]) == 2
    err = capsys.readouterr().err
    assert "keeps no calibration or expert of its own for 'ragtruth'" in err
    assert f"{DEMO_DATASET}, pooled" in err and not bad.exists()
    # The pooled verdicts are not resumed as the answers' own (nor the other way).
    before = pooled.read_bytes()
    assert main(["judge", "demo[:3]", *MODEL, "--out", str(pooled)]) == 2
    assert "was judged by all the training data" in capsys.readouterr().err
    assert pooled.read_bytes() == before


def test_a_set_defers_the_answers_of_its_experts_dataset_and_resumes_their_verdicts(
    tiny_model, with_expert: Path, env: Path, capsys
) -> None:
    """A set naming an expert (a shipped set trained on the demo answers alone): every
    demo answer is judged by the expert, the records say so, and a rerun resumes them."""
    examples = resolve_datasets("demo")[1]
    own = with_expert
    out = env / "v.jsonl"
    argv = ["judge", "demo[:4]", *MODEL, "--out", str(out)]
    assert main(argv) == 0
    head = capsys.readouterr().out
    assert (
        f"answers of {DEMO_DATASET} (or another split of it) by its expert, the demo-only set"
        in head
    )
    recs = _jsonl(out)
    assert [(r["set"], r["deferred_from"]) for r in recs] == [("demo-only", "custom")] * 4
    expert = load_set(tiny_model.info.key, "demo-only")
    for r, ex in zip(recs, examples[:4], strict=True):
        want = judge(tiny_model, ex, expert)
        assert r["probability"] == pytest.approx(want.probability, abs=1e-6)
    assert main(argv) == 0
    assert "4 answers already in" in capsys.readouterr().err
    assert _jsonl(out) == recs
    # evaluate --as-trained judges them by the same expert: each answer's probability.
    runs = env / "runs"
    save_jsonl(examples, env / "answers.jsonl")  # `--dataset demo` names them ragscope-demo
    ev = [
        *("evaluate", *MODEL, "--dataset", str(env / "answers.jsonl")),
        *("--artifacts", str(own), "--as-trained"),
    ]
    ev += ["--detectors", "nll,cortex", "--out", str(runs), "--bootstrap", "0", "--name", "e"]
    assert main(ev) == 0
    assert (
        f"12 of 12 answers ({DEMO_DATASET} or another split of it) judged by the demo-only set"
        in (capsys.readouterr().err)
    )
    run = json.loads((runs / "e.json").read_text())
    by_id = {e.id: e for e in examples}
    for r in run["results"]:
        for i, score in zip(run["test_ids"], r["scores"], strict=True):
            want = judge(tiny_model, by_id[i], expert).verdicts[r["detector"]]
            assert score == pytest.approx(want.score, abs=1e-6), (r["detector"], i)


def test_the_html_report_shows_what_the_playground_shows() -> None:
    """Issue 67: each span's type, reason and evidence inline (not only on hover), the
    set's note when a flagged answer has no span, and detectors without signal named and
    left out of the counts; every text escaped."""
    from core.cli.judging import verdicts_html

    det = {"probability": 0.9, "threshold": 0.5, "hallucinated": True, "calibrated_for": None}
    silent = {
        "probability": 0.5,
        "threshold": 0.5,
        "hallucinated": None,
        "call": "no signal",
        "calibrated_for": "mine",
        "no_signal": "no signal on mine: its calibration there is flat",
    }
    spans = [
        {
            "start": 30,
            "end": 37,
            "text": "a flood",
            "score": 0.81,
            "type": "contradicted",
            "reason": 'the passage says "fire"; the answer says "flood" <b>',
            "evidence": {"passage": 1, "start": 0, "end": 40, "text": "It closed after a fire."},
        }
    ]
    base = {"judge": "ensemble", "probability": 0.8, "threshold": 0.4, "hallucinated": True}
    records = [
        {**base, "id": "a", "n_flagged": 1, "n_detectors": 2, "spans": spans,
         "detectors": {"nll": det, "spad": silent}, "set_id": "default+mine-1@abcd"},
        {**base, "id": "b", "n_flagged": 1, "n_detectors": 1, "spans": [],
         "detectors": {"nll": det},
         "span_note": "no token reaches the span threshold 0.500 (highest 0.400): the set "
         "calls the answer hallucinated but cannot say where"},
    ]  # fmt: skip
    answers = {"a": "The works closed in 1911 after a flood destroyed it.", "b": "Text."}
    page = verdicts_html(records, answers, title="t", summary=[])
    assert "contradicted" in page and "passage 2: It closed after a fire." in page
    assert "the passage says &quot;fire&quot;; the answer says &quot;flood&quot; &lt;b&gt;" in page
    assert "cannot say where" in page and "<b>Where and why:</b>" in page
    assert "no signal: no signal on mine" in page
    assert "1 of 1 detector flags it (spad: no signal here, left out)" in page
    assert "set default+mine-1@abcd" in page and "<script" not in page
