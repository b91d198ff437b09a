"""The ``ragscope`` command line, run in-process on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.cli import build_parser, main
from core.cli.dispatch import COMMANDS
from core.detectors import available_detectors
from core.evaluation.recipe import TrainRecipe


@pytest.fixture(autouse=True)
def _isolated_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "cli.sqlite3"))


def test_every_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("info", "prepare", "generate", "trace", "datasets", "bench", "aarf"):
        with pytest.raises(SystemExit) as exit_:
            main([cmd, "--help"])
        assert exit_.value.code == 0
        assert "usage: ragscope " + cmd in capsys.readouterr().out


def test_evaluate_and_train_help_end_with_examples_and_the_detector_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Their --help ends with worked examples and the detector names; the Ray options sit
    in a group of their own, after the options a first run needs."""
    for cmd in ("evaluate", "train"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = capsys.readouterr().out
        examples = out.index("examples:\n  ragscope " + cmd)
        assert out.index("feature extraction (") < examples
        assert out.index("\n  --dataset DATASET") < out.index("\n  --engine {local,ray}")
        assert ("detectors: " + ", ".join(available_detectors())) in out


def test_each_group_registers_exactly_its_commands() -> None:
    """The dispatcher's table names every command of every group once, and the parser
    offers those commands in that order (the order ``ragscope --help`` lists them)."""
    listed = [command for _, command in COMMANDS]
    assert len(listed) == len(set(listed))
    for group in {group for group, _ in COMMANDS}:
        assert {c for g, c in COMMANDS if g is group} == set(group.COMMANDS), group.__name__
    (sub,) = (a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == listed


def test_trace_demo_on_tiny_model(capsys: pytest.CaptureFixture[str], tiny_model) -> None:
    code = main(
        [
            "trace",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--dataset",
            "demo",
            "--hooks",
            "resid_post,pattern",
            "--layers",
            "0,1",
            "--json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["example"].startswith("demo-")
    kinds = [s["segment"] for s in out["segments"]]
    assert kinds[-1] == "response" and "question" in kinds and "passage 1" in kinds
    n_resp = out["segments"][-1]["tokens"]
    # response positions + generation positions overlap except for one
    assert out["kept_positions"] == n_resp + 1
    assert out["hooks"]["pattern@1"][0] == tiny_model.info.n_heads
    # each hook is kept where it was asked for: resid_post at the response only
    assert out["hooks"]["resid_post@0"] == [n_resp, tiny_model.info.d_model]
    assert out["surprisal_bits"]["max"] >= out["surprisal_bits"]["mean"] > 0


def test_trace_unknown_id_names_the_fix(capsys: pytest.CaptureFixture[str], tiny_model) -> None:
    code = main(["trace", "--model", "tiny", "--dataset", "demo", "--id", "nope"])
    assert code == 2
    err = capsys.readouterr().err
    assert "no example with id 'nope'" in err and "demo-01" in err


def test_trace_needs_a_response_for_a_written_example(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["trace", "--model", "tiny", "--question", "Q?", "--passage", "P."])
    assert code == 2
    assert "--response" in capsys.readouterr().err


def test_generate_streams_to_stdout(capsys: pytest.CaptureFixture[str], tiny_model) -> None:
    code = main(
        [
            "generate",
            "--model",
            "tiny",
            "--question",
            "Who?",
            "--passage",
            "Ada built it.",
            "--max-new-tokens",
            "4",
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    assert len(captured.out) > 1  # the streamed text (random model: any characters) + newline
    assert "4 tokens" in captured.err and "stop: max_tokens" in captured.err


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def _good(i: int) -> dict:
    return {"id": f"r{i}", "question": "Who?", "passages": ["Ada built it."], "response": "Ada."}


def test_validate_reports_bad_records_and_exits_1(tmp_path: Path, capsys) -> None:
    bad = {
        "id": "r2",
        "question": "Who?",
        "passages": ["x"],
        "response": "Ada.",
        "spans": [{"start": 0, "end": 99}],
    }
    path = _write(tmp_path / "d.jsonl", [_good(1), bad, _good(3)])
    assert main(["datasets", "validate", str(path), "--format", "ragscope"]) == 1
    out = capsys.readouterr().out
    assert "2 of 3 records loaded" in out
    assert f"{path}:2" in out and "spans" in out


def test_import_then_list_then_refuse_duplicate(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path / "d.jsonl", [_good(1), _good(2)])
    assert main(["datasets", "import", str(path), "--name", "mine", "--format", "ragscope"]) == 0
    assert "imported 2 examples as 'mine'" in capsys.readouterr().out
    assert main(["datasets", "list"]) == 0
    assert "mine\t2 examples" in capsys.readouterr().out
    # A second import under the same name is refused and loses nothing.
    path2 = _write(tmp_path / "e.jsonl", [_good(7)])
    assert main(["datasets", "import", str(path2), "--name", "mine", "--format", "ragscope"]) == 2
    assert "replace" in capsys.readouterr().err
    assert main(["datasets", "list"]) == 0
    assert "mine\t2 examples" in capsys.readouterr().out


def test_import_bad_file_without_skip_fails_and_stores_nothing(tmp_path: Path, capsys) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(_good(1)) + "\n{not json\n", encoding="utf-8")
    assert main(["datasets", "import", str(path), "--name", "x", "--format", "ragscope"]) == 2
    assert f"{path}:2" in capsys.readouterr().err
    main(["datasets", "list"])
    assert "no stored datasets" in capsys.readouterr().out


def test_import_skip_bad_with_no_good_record_stores_nothing(tmp_path: Path, capsys) -> None:
    kept = _write(tmp_path / "kept.jsonl", [_good(1), _good(2)])
    assert main(["datasets", "import", str(kept), "--name", "x", "--format", "ragscope"]) == 0
    capsys.readouterr()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{broken\n{"id": "r9"}\n', encoding="utf-8")
    for name in ("y", "x"):  # a new name, and one replaced: neither becomes empty
        argv = ["datasets", "import", "--skip-bad", "--replace", str(bad), "--name", name]
        assert main([*argv, "--format", "ragscope"]) == 2
        out, err = capsys.readouterr()
        assert f"{bad}:1:2" in out and f"{bad}:2" in out  # the bad records, listed
        assert f"{bad}: no record was good: all 2 records read were bad" in err
        assert "nothing was stored" in err and "imported" not in out
    # An explicit format on an empty file: no record, nothing stored either.
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    assert main(["datasets", "import", str(empty), "--name", "z", "--format", "ragscope"]) == 2
    assert "no record was read" in capsys.readouterr().err
    main(["datasets", "list"])
    assert capsys.readouterr().out == f"x\t2 examples\tragscope\t{kept}\n"


def test_parser_rejects_unknown_format() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["datasets", "validate", "x", "--format", "weird"])


def test_answer_writes_unlabelled_answers_and_resumes(tmp_path: Path, capsys, tiny_model) -> None:
    out = tmp_path / "answers.jsonl"
    argv = [
        "answer",
        "--model",
        "tiny",
        "--dataset",
        "demo",
        "--out",
        str(out),
        "--max-new-tokens",
        "6",
        "--temperature",
        "1.0",
        "--seed",
        "1",
    ]
    assert main([*argv, "--limit", "2"]) == 0
    first = capsys.readouterr().out
    assert "2 answers" in first and "(2 generated now)" in first
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["demo-01-lighthouse-answer", "demo-02-waggle-dance-answer"]
    assert all(r["label"] is None and r["spans"] == [] for r in rows)
    assert rows[0]["provenance"]["generator"].startswith("tiny-random-llama")
    assert not rows[0]["provenance"]["source"].startswith("/")
    assert main([*argv, "--limit", "3"]) == 0
    assert "3 answers" in (second := capsys.readouterr().out) and "(1 generated now)" in second
    assert [json.loads(line)["response"] for line in out.read_text().splitlines()][:2] == [
        r["response"] for r in rows
    ]


def _train_args(out: Path) -> list[str]:
    return [
        "train",
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--dataset",
        "builtin",
        "--limit",
        "48",
        "--bootstrap",
        "0",
        "--out",
        str(out),
    ]


def test_train_records_recipe_and_reproduce_checks_it(tmp_path: Path, capsys, tiny_model) -> None:
    shipped = tmp_path / "shipped"
    assert main(_train_args(shipped)) == 0
    capsys.readouterr()
    for name in ("nll", "context_gain", "lexical"):
        cfg = json.loads((shipped / name / "cfg.json").read_text())
        recipe = cfg["trained_on"]["recipe"]
        assert recipe["dataset"] == "builtin" and recipe["limit"] == 48
        assert recipe["model"] == "tiny" and "ragscope train" in recipe["command"]
        # What the command line gave, as the one recipe object records it.
        assert (
            recipe
            == TrainRecipe.from_args(build_parser().parse_args(_train_args(shipped))).to_dict()
        )

    rebuilt = tmp_path / "rebuilt"
    assert main(["train", "--reproduce", str(shipped), "--out", str(rebuilt)]) == 0
    out = capsys.readouterr().out
    assert "3/3 artifacts reproduced" in out
    assert (rebuilt / "lexical" / "weights.json").is_file()

    # A tampered weight is caught, named, and fails the command.
    w_path = shipped / "nll" / "weights.json"
    w = json.loads(w_path.read_text())
    w["response"]["intercept"] = float(w["response"]["intercept"]) + 0.5
    w_path.write_text(json.dumps(w))
    assert main(["train", "--reproduce", str(shipped), "--out", str(tmp_path / "again")]) == 1
    out = capsys.readouterr().out
    assert "DIFFERS  nll" in out and "weights.response.intercept" in out
    assert "2/3 artifacts reproduced" in out


def test_reproduce_names_a_missing_dev_set_and_rebuilds_the_rest(
    tmp_path: Path, capsys, tiny_model, monkeypatch
) -> None:
    shipped = tmp_path / "shipped"
    assert main(_train_args(shipped)) == 0
    capsys.readouterr()
    # One artifact says it was trained on a dev set this machine does not have.
    cfg_path = shipped / "nll" / "cfg.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["trained_on"]["recipe"]["dataset"] = "shared:ragtruth_qa_dev"
    cfg_path.write_text(json.dumps(cfg))
    # Another's recipe was edited into one ragscope never writes: named, not run.
    cfg_path = shipped / "lexical" / "cfg.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["trained_on"]["recipe"]["limit"] = "48; rm -rf /"
    cfg_path.write_text(json.dumps(cfg))
    monkeypatch.setenv("RAGSCOPE_SHARED_DATA", str(tmp_path / "no-shared-data"))
    assert main(["train", "--reproduce", str(shipped), "--out", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    assert "CANNOT   nll: shared:ragtruth_qa_dev: the development data folder is not here" in out
    assert "CANNOT   lexical: its recorded recipe: field 'limit': a training recipe's limit" in out
    assert "same     context_gain" in out
    assert "1/3 artifacts reproduced" in out


def test_reproduce_never_opens_a_path_an_artifact_names(tmp_path: Path, capsys, tiny_model) -> None:
    """A recipe is cfg.json, anyone's to edit: its datasets and model are names, never
    files or folders of this machine opened on the artifact's word."""
    shipped = tmp_path / "shipped"
    assert main(_train_args(shipped)) == 0
    capsys.readouterr()
    secret = tmp_path / "secret.jsonl"
    secret.write_text("not for the artifact to choose\n")
    edits = {
        "nll": {"dataset": str(secret)},
        "context_gain": {"dataset": f"builtin,{secret}[:3]"},
        "lexical": {"model": str(tmp_path)},
    }
    for name, edit in edits.items():
        cfg_path = shipped / name / "cfg.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["trained_on"]["recipe"].update(edit)
        cfg_path.write_text(json.dumps(cfg))
    assert main(["train", "--reproduce", str(shipped), "--out", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    for name in edits:
        assert f"CANNOT   {name}: " in out and "does not open on an artifact's word" in out
    assert "0/3 artifacts reproduced" in out and not (tmp_path / "r").exists()


def test_train_records_token_thresholds_and_the_command_recomputes_them(
    tmp_path: Path, capsys, tiny_model
) -> None:
    from core.detectors import detector_class
    from core.learning.contract import flag_threshold

    shipped = tmp_path / "shipped"
    assert main(_train_args(shipped)) == 0
    capsys.readouterr()
    cfg_path = shipped / "nll" / "cfg.json"
    cfg = json.loads(cfg_path.read_text())
    trained = cfg["token_threshold"]
    assert 0.0 <= trained <= 1.0
    det = detector_class("nll").load(shipped / "nll")
    assert det.token_threshold_ == trained and flag_threshold(det) == trained
    # the command recomputes it on the artifact's own validation split: the same value
    del cfg["token_threshold"]
    cfg_path.write_text(json.dumps(cfg))
    assert detector_class("nll").load(shipped / "nll").token_threshold_ is None
    args = ["token-thresholds", "--model", "tiny", "--folder", str(shipped)]
    assert main([*args, "--detectors", "nll"]) == 0
    out = capsys.readouterr().out
    assert "| nll |" in out and "validation" in out
    cfg = json.loads(cfg_path.read_text())
    assert cfg["token_threshold"] == pytest.approx(trained)
    assert cfg["token_threshold_from"]["split"] == "validation"


def test_train_reads_a_reviewed_export(tmp_path: Path, capsys, tiny_model) -> None:
    """The Review page's JSONL export is a training set like any other."""
    from core.data import resolve_dataset, stratified_head
    from core.review import write_ragtruth_jsonl

    examples = stratified_head(resolve_dataset("builtin")[1], 48)
    path = write_ragtruth_jsonl(examples, tmp_path / "reviewed.jsonl")
    out = tmp_path / "out"
    args = ["train", "--model", "tiny", "--device", "cpu", "--dataset", str(path)]
    assert main([*args, "--detectors", "nll", "--bootstrap", "0", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| nll |" in printed
    cfg = json.loads((out / "nll" / "cfg.json").read_text())
    assert cfg["trained_on"]["dataset"] == "reviewed"
    assert sum(cfg["trained_on"]["n"].values()) == len(examples)


def test_reproduce_refuses_artifacts_without_recipe(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "old" / "nll"
    folder.mkdir(parents=True)
    (folder / "cfg.json").write_text(json.dumps({"detector": "nll", "model": "x"}))
    (folder / "weights.json").write_text("{}")
    assert main(["train", "--reproduce", str(tmp_path / "old")]) == 2
    err = capsys.readouterr().err
    assert "records no training recipe" in err and "nll" in err


def test_bench_times_extraction_cold_and_cached(capsys, tiny_model) -> None:
    argv = ["bench", "--model", "tiny", "--device", "cpu", "--no-cold", "--repeats", "1"]
    assert main([*argv, "--tokens", "80", "--extraction", "4", "--batch-sizes", "2", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    ext = rep["extraction"]
    assert ext["n_examples"] == 4 and set(ext["detectors"]) >= {"nll", "context_gain", "lexical"}
    assert ext["cold_s"] > 0 and ext["plain_s"] > 0
    assert ext["warm_s"] < ext["cold_s"]  # every example a cache hit the second time
    assert set(ext["batched_s"]) == {"2"} and ext["batched_s"]["2"] > 0
    assert rep["aarf"] is None  # nothing shipped for the tiny model: skipped, not failed


def test_bench_loads_the_model_in_the_asked_dtype(capsys, tiny_model) -> None:
    argv = ["bench", "--model", "tiny", "--device", "cpu", "--no-cold", "--repeats", "1"]
    argv += ["--tokens", "60", "--extraction", "0", "--features", "", "--aarf", "0"]
    assert main([*argv, "--dtype", "bfloat16", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["env"]["dtype"] == "bfloat16" and rep["forward_s"] > 0
    with pytest.raises(SystemExit):
        main([*argv, "--dtype", "int8"])


def test_answer_one_per_source_of_one_split(tmp_path: Path, capsys, tiny_model) -> None:
    from core.data import load_builtin

    out = tmp_path / "answers.jsonl"
    argv = ["answer", "--model", "tiny", "--dataset", "builtin", "--out", str(out)]
    argv += ["--split", "test", "--one-per-source", "--limit", "3", "--max-new-tokens", "4"]
    assert main([*argv, "--temperature", "1.0"]) == 0
    assert "3 answers" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    test_groups = {e.provenance.group for e in load_builtin("test")}
    groups = [r["provenance"]["group"] for r in rows]
    assert len(set(groups)) == 3 and set(groups) <= test_groups  # one per source, test only
    assert all(r["provenance"]["split"] == "test" for r in rows)


def test_set_passes_detector_options_and_rejects_bad_ones(capsys, tmp_path: Path) -> None:
    import argparse

    from core.base.errors import DataError
    from core.cli.common import detector_options

    ns = argparse.Namespace(set=["redeep_token.scorer=logistic", "redeep_chunk.topk_frac=0.2"])
    assert detector_options(ns) == {
        "redeep_token": {"scorer": "logistic"},
        "redeep_chunk": {"topk_frac": 0.2},
    }
    with pytest.raises(DataError, match="DETECTOR.OPTION=VALUE"):
        detector_options(argparse.Namespace(set=["scorer=logistic"]))
    argv = ["evaluate", "--model", "tiny", "--dataset", "demo", "--detectors", "nll"]
    argv += ["--set", 'lexical.pos=["NOUN"]', "--out", str(tmp_path)]
    assert main(argv) != 0
    assert "options given for detectors not being run: ['lexical']" in capsys.readouterr().err


def test_spad_check_reports_the_largest_split_error(capsys, tiny_model) -> None:
    assert main(["spad-check", "--model", "tiny", "--dataset", "demo"]) == 0
    out = capsys.readouterr().out
    err = float(out.split("P_final| = ")[1].split()[0])
    assert 0.0 <= err < 1e-4 and "within the tolerance" in out
    assert "answer tokens, model" in out


def test_shap_lists_the_top_features_of_a_trained_spad(tmp_path: Path, capsys, tiny_model) -> None:
    art = tmp_path / "art"
    argv = ["--model", "tiny", "--dataset", "builtin", "--limit", "24"]
    assert (
        main(["train", *argv, "--detectors", "spad", "--set", "spad.n_iter=0", "--out", str(art)])
        == 0
    )
    capsys.readouterr()
    assert (
        main(["shap", *argv, "--artifact", str(art / "spad"), "--split", "all", "--top", "5"]) == 0
    )
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert "hallucinated" in lines[0] and lines[2].split()[:2] == ["feature", "source"]
    rows = lines[3:]
    assert len(rows) == 5
    means = [float(r.split()[3]) for r in rows]
    assert means == sorted(means, reverse=True)  # ranked by mean |SHAP|
    # No artifact for the tiny model is shipped: a clear error, not a crash.
    assert main(["shap", *argv]) == 2
    assert "spad" in capsys.readouterr().err


def test_mitigate_reports_rates_and_names_missing_detectors(
    tmp_path: Path, capsys, tiny_model, monkeypatch
) -> None:
    from core.data import builtin_examples
    from core.detectors import make_detector
    from core.pipeline.extract import extract_features

    demo = builtin_examples()
    det = make_detector("nll")
    det.fit(list(extract_features(tiny_model, demo, [det]).features["nll"]), demo)
    det.save(tmp_path / "detectors" / "nll")
    monkeypatch.setenv("RAGSCOPE_DETECTORS_DIR", str(tmp_path / "detectors"))
    args = ["mitigate", "--model", "tiny", "--dataset", "demo", "--split", "all", "--limit", "2"]
    code = main(
        [
            *args,
            "--method",
            "feedback-instance",
            "--max-new-tokens",
            "4",
            "--out",
            str(tmp_path / "r.json"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "# mitigation: feedback-instance" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["method"] == "feedback-instance" and "nll" in report["thresholds"]
    assert main([*args, "--detectors", "cortex"]) == 2
    assert "ragscope train --detectors cortex" in capsys.readouterr().err


def _cv_args(*extra: str) -> list[str]:
    return [
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--detectors",
        "nll,lexical",
        "--bootstrap",
        "50",
        *extra,
    ]


def test_evaluate_cv_reports_pooled_out_of_fold_metrics(tmp_path: Path, capsys, tiny_model) -> None:
    code = main(
        [
            "evaluate",
            "--cv",
            "3",
            "--dataset",
            "builtin",
            "--limit",
            "60",
            "--out",
            str(tmp_path),
            *_cv_args(),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "3-fold source-grouped cross-validation" in out and "| lexical |" in out
    (saved,) = tmp_path.glob("*.json")
    run = json.loads(saved.read_text())
    assert run["kind"] == "cv" and run["k"] == 3 and len(run["ids"]) == len(run["fold"])
    assert {r["detector"] for r in run["results"]} == {"nll", "lexical"}
    # several datasets combine only with --cv
    assert main(["evaluate", "--dataset", "builtin,demo", *_cv_args()]) == 2


def test_train_cv_saves_calibrated_artifacts_with_their_cv_metrics(
    tmp_path: Path, capsys, tiny_model, monkeypatch
) -> None:
    monkeypatch.setenv("RAGSCOPE_SHARED_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / "cache"))  # the run's folder
    shipped = tmp_path / "shipped"
    args = ["train", "--cv", "3", "--dataset", "builtin", "--limit", "60", "--out", str(shipped)]
    assert main([*args, *_cv_args()]) == 0
    capsys.readouterr()
    # Each fold was checkpointed (resumable), and the checkpoints went once all was saved.
    folds = tmp_path / "cache" / "cv-folds"
    assert folds.is_dir() and list(folds.iterdir()) == []
    cfg = json.loads((shipped / "lexical" / "cfg.json").read_text())
    assert cfg["calibration"]["kind"] == "platt"
    assert (
        cfg["trained_on"]["recipe"]["procedure"] == "cv"
        and "--cv 3" in cfg["trained_on"]["recipe"]["command"]
        and "--calibration crossfit" in cfg["trained_on"]["recipe"]["command"]
    )
    # Cross-fitted by default: the calibrator saw every training answer, not a fifth.
    assert cfg["train"]["procedure"]["calibration"] == "crossfit"
    assert cfg["calibration"]["n"] == cfg["train"]["procedure"]["n_calibration"]
    assert cfg["train"]["procedure"]["n_calibration"] == cfg["trained_on"]["n"]["builtin"]
    cv = cfg["metrics"]["cv"]
    assert cv["k"] == 3 and cv["pooled"]["n"] == cfg["trained_on"]["n"]["builtin"]
    assert cfg["threshold_criterion"] == "balanced_accuracy"
    rebuilt = tmp_path / "rebuilt"
    assert main(["train", "--reproduce", str(shipped), "--out", str(rebuilt)]) == 0
    assert "2/2 artifacts reproduced" in capsys.readouterr().out
    assert list((tmp_path / "cache" / "runs").glob("*-cv3-builtin.json"))  # not in ~/.cache


def test_reproduce_reads_a_recipe_from_before_cross_fitting_as_split(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    old = tmp_path / "old"
    args = ["train", "--cv", "3", "--dataset", "builtin", "--limit", "60", "--out", str(old)]
    assert main([*args, "--calibration", "split", *_cv_args()]) == 0
    for cfg_path in old.glob("*/cfg.json"):  # as artifacts trained before the option recorded
        cfg = json.loads(cfg_path.read_text())
        del cfg["trained_on"]["recipe"]["calibration"], cfg["trained_on"]["recipe"]["version"]
        cfg_path.write_text(json.dumps(cfg))
    capsys.readouterr()
    assert main(["train", "--reproduce", str(old), "--out", str(tmp_path / "again")]) == 0
    assert "2/2 artifacts reproduced" in capsys.readouterr().out


def test_shared_specs_say_what_is_missing(tmp_path: Path, capsys, monkeypatch) -> None:
    from core.base.errors import DataError
    from core.data import resolve_dataset, resolve_datasets

    monkeypatch.setenv("RAGSCOPE_SHARED_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="development data folder is not here"):
        resolve_dataset("shared:ragtruth_qa_dev")
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("RAGSCOPE_SHARED_DATA", str(tmp_path / "data"))
    with pytest.raises(DataError, match="no ragtruth_qa_dev.jsonl"):
        resolve_dataset("shared:ragtruth_qa_dev")
    with pytest.raises(DataError, match="must name a file"):
        resolve_dataset("shared:../secrets")
    names, exs = resolve_datasets("demo,builtin")
    assert names == ["demo", "builtin"]
    # each answer keeps the dataset its record names (the demo's are ragscope-demo)
    assert {e.provenance.dataset for e in exs} == {"ragscope-demo", "builtin"}
    assert len({e.id for e in exs}) == len(exs)
    assert main(["evaluate", "--cv", "--dataset", "shared:ragtruth_qa_dev", *_cv_args()]) == 2
    assert "no ragtruth_qa_dev.jsonl" in capsys.readouterr().err


def test_evaluate_matrix_trains_on_each_and_tests_on_the_others(
    tmp_path: Path, capsys, tiny_model
) -> None:
    from core.data import load_builtin, save_jsonl, stratified_head

    exs = stratified_head(load_builtin(), 80)
    save_jsonl([e for e in exs if e.task == "qa"], tmp_path / "qa.jsonl")
    save_jsonl([e for e in exs if e.task == "summary"], tmp_path / "summary.jsonl")
    specs = f"{tmp_path / 'qa.jsonl'},{tmp_path / 'summary.jsonl'}"
    args = [
        "evaluate",
        "--matrix",
        specs,
        "--cv",
        "2",
        "--calibration",
        "split",  # 2 folds of these few sources leave too few to cross-fit
        "--out",
        str(tmp_path / "runs"),
        *_cv_args(),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "## nll" in out and "| qa |" in out and "| summary |" in out
    (saved,) = (tmp_path / "runs").glob("*.json")
    run = json.loads(saved.read_text())
    assert run["kind"] == "matrix" and set(run["cells"]["lexical"]["qa"]) == {"qa", "summary"}
    # Without the diagonal: only the cross-set cells, from [:N] prefixes of the same files.
    saved.unlink()
    prefixed = f"{tmp_path / 'qa.jsonl'}[:30],{tmp_path / 'summary.jsonl'}[:30]"
    assert main([*args[:2], prefixed, *args[3:], "--no-diagonal"]) == 0
    (saved,) = (tmp_path / "runs").glob("*.json")
    cells = json.loads(saved.read_text())["cells"]["lexical"]
    assert set(cells["qa"]) == {"summary"} and set(cells["summary"]) == {"qa"}


def test_artifacts_sets_lists_each_shipped_set_and_marks_the_loaded_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAGSCOPE_DETECTORS_DIR", raising=False)
    monkeypatch.setenv("RAGSCOPE_DETECTOR_SET", "builtin")
    assert main(["artifacts", "sets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    by_name = {line[2:].split()[0]: line for line in lines}
    assert set(by_name) >= {"default", "builtin"}
    assert by_name["builtin"].startswith("* ") and by_name["default"].startswith("  ")
    assert "trained on builtin" in by_name["builtin"]
    assert all(" detectors  trained on " in line for line in lines)
    assert "defers to ragtruth" in by_name["default"] and "defers" not in by_name["builtin"]


def test_evaluate_as_trained_judges_every_answer_at_the_artifacts_thresholds(
    tmp_path: Path, capsys, tiny_model
) -> None:
    """``--artifacts DIR --as-trained``: the held-out judge's path. Every answer of the
    dataset is tested, nothing re-picks the thresholds (without it a validation part
    does, and only the test part is judged)."""
    art = tmp_path / "art"
    base = ["--model", "tiny", "--device", "cpu", "--detectors", "nll,lexical"]
    assert main(["train", *base, "--dataset", "demo", "--out", str(art)]) == 0
    shipped = {
        n: json.loads((art / n / "cfg.json").read_text())["threshold"] for n in ("nll", "lexical")
    }
    capsys.readouterr()
    out = tmp_path / "runs"
    judge = ["evaluate", *base, "--artifacts", str(art), "--out", str(out), "--bootstrap", "0"]
    assert (
        main([*judge, "--dataset", "builtin", "--limit", "40", "--as-trained", "--name", "j"]) == 0
    )
    run = json.loads((out / "j.json").read_text())
    from core.data import resolve_dataset, stratified_head

    n_all = len(stratified_head(resolve_dataset("builtin")[1], 40))
    for r in run["results"]:
        assert r["metrics"]["n"] == n_all  # every answer, not a test part
        assert r["threshold"] == pytest.approx(shipped[r["detector"]])
    # Without --as-trained a validation part re-picks the thresholds and a test part is judged.
    assert main([*judge, "--dataset", "builtin", "--limit", "40", "--name", "k"]) == 0
    k = json.loads((out / "k.json").read_text())
    assert all(r["metrics"]["n"] < n_all for r in k["results"])
    capsys.readouterr()
    assert main(["evaluate", *base, "--dataset", "demo", "--as-trained"]) != 0
    assert "--as-trained judges with trained detectors" in capsys.readouterr().err
