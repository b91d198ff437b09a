"""The ``ensemble`` detector on the tiny model: bundled member features (cached per
member), members fitted on train only, a calibrated stacker on a split they never saw,
token stacking, artifacts, and evaluation beside the members."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from core.base.errors import DataError, ModelError
from core.base.examples import source_key
from core.data import resolve_dataset, split_examples
from core.detectors import detector_class, make_detector
from core.detectors.ensemble import STACK_FOLDS, EnsembleDetector, choose_c, logit
from core.evaluation.evaluate import EvalOptions, Splits, evaluate, set_thresholds
from core.learning.calibration import MIN_DATASET_ANSWERS, PlattCalibrator
from core.learning.contract import for_dataset, judge_features
from core.learning.learners import LogisticCalibrator, grouped_folds
from core.pipeline.extract import FeatureCache, extract_features, run_example
from core.review import propose_flags
from core.storage import Store

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MEMBERS = ("nll", "context_gain", "lexical")


def _ensemble(**kw) -> EnsembleDetector:
    return make_detector("ensemble", members=MEMBERS, **kw)


@pytest.fixture(scope="module")
def splits():
    examples = resolve_dataset("builtin")[1]
    # a small balanced subset that keeps whole sources together
    by_key: dict[str, list] = {}
    for e in examples:
        by_key.setdefault(source_key(e), []).append(e)
    chosen = [e for k in sorted(by_key)[:60] for e in by_key[k]]
    return split_examples(chosen, fractions=(0.5, 0.25, 0.25), seed=1)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory):
    with Store(tmp_path_factory.mktemp("ens") / "t.sqlite3") as s:
        yield s


@pytest.fixture(scope="module")
def extracted(tiny_model, splits, db):
    ens = _ensemble()
    nll = make_detector("nll")
    everything = [*splits["train"], *splits["validation"], *splits["test"]]
    ext = extract_features(tiny_model, everything, [nll, ens], cache=FeatureCache(db))
    by_id = {f.example_id: f for f in ext.features["ensemble"]}
    return ext, {s: [by_id[e.id] for e in splits[s]] for s in splits}


def test_features_bundle_the_members_once_and_only_members_are_cached(
    tiny_model, splits, extracted, db
):
    ext, _ = extracted
    first = ext.features["ensemble"][0]
    assert first.detector == "ensemble" and first.names == () and first.response.size == 0
    assert list(first.members) == list(MEMBERS)
    # the batch's own nll and the member share one computation
    assert first.members["nll"] is ext.features["nll"][0]
    cached = {r[0] for r in db._query("SELECT DISTINCT detector FROM analyses")}
    assert cached == set(MEMBERS)
    # equal to the members computed on their own
    ex = ext.examples[0]
    alone = run_example(tiny_model, ex, [make_detector(n) for n in MEMBERS])
    for n in MEMBERS:
        np.testing.assert_allclose(first.members[n].response, alone[n].response, rtol=1e-5)
    # the ensemble's own features() (no engine) give the same bundle
    direct = run_example(tiny_model, ex, [_ensemble()])["ensemble"]
    np.testing.assert_allclose(
        direct.members["lexical"].response, alone["lexical"].response, rtol=1e-5
    )
    with pytest.raises(ValueError, match="composite"):
        first.to_bytes()
    # a member that disagrees with a detector of its name in the batch is refused
    other = make_detector("ensemble", members=("lexical",), member_configs={"lexical": {}})
    clash = make_detector("lexical", **_other_lexical_option())
    with pytest.raises(DataError, match="different feature options"):
        run_example(tiny_model, ex, [clash, other])


def test_out_of_fold_members_take_the_kept_members_choices(splits, extracted, monkeypatch):
    """The members refitted for the stacker's out-of-fold rows are built with what the
    kept members chose (``pinned``), so the stacker learns scores of the same form;
    the kept members themselves keep their configs."""
    _, f = extracted
    lexical = detector_class("lexical")
    seen: list[tuple[str, ...]] = []
    real_fit = lexical.fit

    def fit(self, features, examples, **kw):
        seen.append(tuple(self.config.pos))
        return real_fit(self, features, examples, **kw)

    monkeypatch.setattr(lexical, "fit", fit)
    monkeypatch.setattr(lexical, "pinned", lambda self: {"pos": ("NOUN",)})
    ens = _ensemble(stack_folds=3).fit(f["train"], splits["train"])
    default = tuple(make_detector("lexical").config.pos)
    assert seen == [default] + [("NOUN",)] * 3  # the kept member first, then one per fold
    assert tuple(ens.members_["lexical"].config.pos) == default


def _other_lexical_option() -> dict:
    cfg = make_detector("lexical").config.to_dict()
    key = next(k for k, v in cfg.items() if isinstance(v, tuple | list) and v)
    return {key: tuple(cfg[key])[:1]}


def test_split_stacking_members_learn_on_train_and_the_stacker_on_validation(splits, extracted):
    _, f = extracted
    ens = _ensemble(stacking="split").fit(
        f["train"], splits["train"], validation=(f["validation"], splits["validation"])
    )
    # every member is exactly the detector fitted on the training split alone
    for n in MEMBERS:
        alone = make_detector(n).fit([x.members[n] for x in f["train"]], splits["train"])
        np.testing.assert_allclose(
            ens.members_[n].response_model_.coef_, alone.response_model_.coef_, rtol=1e-6
        )
    # the stacker: an unweighted logistic regression on the members' validation logits
    X = np.stack(
        [
            logit([ens.members_[n].predict(x.members[n]).score for n in MEMBERS])
            for x in f["validation"]
        ]
    )
    y = np.asarray([int(e.label) for e in splits["validation"]])
    c = choose_c(X, y)
    assert ens.train_info_["C"] == c and ens.stacker_.class_weight is None
    ref = LogisticCalibrator(C=c, class_weight=None).fit(X, y)
    np.testing.assert_allclose(ens.stacker_.coef_, ref.coef_, rtol=1e-6)
    # unweighted: the mean predicted probability on its own split is the base rate
    assert ref.predict_proba(X).mean() == pytest.approx(y.mean(), abs=0.02)
    v = ens.predict(f["test"][0])
    row = logit([ens.members_[n].predict(f["test"][0].members[n]).score for n in MEMBERS])
    assert v.score == pytest.approx(float(ref.predict_proba(row[None])[0]), abs=1e-9)
    contrib = sum(v.explanation.values())
    assert contrib + ens.stacker_.intercept_ == pytest.approx(
        float(ens.stacker_.decision_function(row[None])[0])
    )
    assert set(v.explanation) == set(MEMBERS)
    assert [n for n, _ in ens.importances()] and len(ens.importances()) == 3
    # token stacking over the members that score the answer's tokens
    assert ens.token_members_ and set(ens.token_members_) <= set(MEMBERS)
    nll_v = ens.member_verdicts(f["test"][0])["nll"]
    np.testing.assert_array_equal(v.token_offsets, nll_v.token_offsets)
    assert v.token_scores.shape == (nll_v.token_scores.shape[0],)
    assert ((v.token_scores >= 0) & (v.token_scores <= 1)).all()


def test_crossfit_stacks_out_of_fold_member_scores_of_every_training_answer(splits, extracted):
    _, f = extracted
    train, val = splits["train"], splits["validation"]
    ens = _ensemble().fit(f["train"], train, validation=(f["validation"], val))
    assert ens.config.stacking == "crossfit" and ens.train_info_["stacking"] == "crossfit"
    # the members kept are fitted on all training answers
    for n in MEMBERS:
        alone = make_detector(n).fit([x.members[n] for x in f["train"]], train)
        np.testing.assert_allclose(
            ens.members_[n].response_model_.coef_, alone.response_model_.coef_, rtol=1e-6
        )
    # rebuild the stacker's rows: each training answer scored by members fitted without
    # its fold, then the validation answers scored by the members kept
    y_tr = np.asarray([int(e.label) for e in train])
    folds = grouped_folds(y_tr, np.asarray([source_key(e) for e in train]), STACK_FOLDS, 0)
    assert len(folds) >= 2
    rows, ys = [], []
    for tr_i, te_i in folds:
        assert not {source_key(train[i]) for i in tr_i} & {source_key(train[i]) for i in te_i}
        fitted = {
            n: make_detector(n).fit(
                [f["train"][i].members[n] for i in tr_i], [train[i] for i in tr_i]
            )
            for n in MEMBERS
        }
        for i in te_i:
            rows.append(logit([fitted[n].predict(f["train"][i].members[n]).score for n in MEMBERS]))
            ys.append(y_tr[i])
    for x, e in zip(f["validation"], val, strict=True):
        rows.append(logit([ens.members_[n].predict(x.members[n]).score for n in MEMBERS]))
        ys.append(int(e.label))
    X, y = np.stack(rows), np.asarray(ys)
    assert ens.train_info_["n_stack"] == len(y) > len(val)
    ref = LogisticCalibrator(C=choose_c(X, y), class_weight=None).fit(X, y)
    np.testing.assert_allclose(ens.stacker_.coef_, ref.coef_, rtol=1e-6)
    with pytest.raises(DataError, match="unknown stacking"):
        _ensemble(stacking="blend")
    with pytest.raises(DataError, match="stack_folds"):
        _ensemble(stack_folds=1)
    three = _ensemble(stack_folds=3).fit(f["train"], train)
    assert three.train_info_["n_stack"] == len(train)  # every training answer, out of fold


def test_without_validation_members_and_stacker_see_different_sources(splits, extracted):
    _, f = extracted
    ens = _ensemble(stacking="split").fit(f["train"], splits["train"])
    n_stack, n_fit = ens.train_info_["n_stack"], ens.train_info_["n_train"]
    assert n_stack + n_fit == len(splits["train"]) and 0 < n_stack < n_fit
    fit_i, stack_i = ens._split(f["train"], splits["train"])
    keys_fit = {source_key(splits["train"][i]) for i in fit_i}
    keys_stack = {source_key(splits["train"][i]) for i in stack_i}
    assert not keys_fit & keys_stack


def test_save_load_round_trip_and_bad_artifacts(
    splits, extracted, tmp_path: Path, tiny_model, reseal
):
    _, f = extracted
    ens = _ensemble().fit(
        f["train"], splits["train"], validation=(f["validation"], splits["validation"])
    )
    ens.threshold_ = 0.4
    out = ens.save(tmp_path / "ensemble")
    assert {p.name for p in (out / "members").iterdir()} == set(MEMBERS)
    back = detector_class("ensemble").load(out, model_key=tiny_model.info.key)
    assert back.threshold_ == 0.4 and back.token_members_ == ens.token_members_
    for x in f["test"][:5]:
        a, b = ens.predict(x), back.predict(x)
        assert a.score == pytest.approx(b.score, abs=1e-12)
        np.testing.assert_allclose(a.token_scores, b.token_scores, atol=1e-7)
    with pytest.raises(ModelError):
        detector_class("ensemble").load(out, model_key="another|model")
    w = json.loads((out / "weights.json").read_text())
    w["response"]["coef"] = w["response"]["coef"][:2]
    w["response"]["mean"] = w["response"]["mean"][:2]
    w["response"]["scale"] = w["response"]["scale"][:2]
    (out / "weights.json").write_text(json.dumps(w))
    with pytest.raises(DataError, match="does not match the SHA-256"):
        detector_class("ensemble").load(out)
    reseal(out)
    with pytest.raises(DataError, match="members"):
        detector_class("ensemble").load(out)
    with pytest.raises(DataError, match="ensemble features"):
        ens.predict(f["test"][0].members["nll"])


def test_token_context_reads_the_answers_stacked_logit(
    splits, extracted, tmp_path: Path, tiny_model, reseal
):
    """With token_context the token stacker reads [token logits, answer logit a, token
    logits * a]: two tokens with equal member scores in answers of different suspicion
    get different scores; the width is checked when the artifact is loaded."""
    _, f = extracted
    ens = _ensemble(stacking="split", token_context=True).fit(
        f["train"], splits["train"], validation=(f["validation"], splits["validation"])
    )
    k = len(ens.token_members_)
    assert k and ens.token_stacker_.coef_.shape == (2 * k + 1,)
    x = f["test"][0]
    verdicts = ens.member_verdicts(x)
    a = float(ens.stacker_.decision_function(ens._row(verdicts)[None, :])[0])
    tok = np.stack([logit(verdicts[n].token_scores) for n in ens.token_members_], 1)
    want = ens.token_stacker_.predict_proba(
        np.concatenate([tok, np.full((len(tok), 1), a), tok * a], 1)
    )
    v = ens.predict(x)
    np.testing.assert_allclose(v.token_scores, want, atol=1e-6)
    assert v.score == pytest.approx(
        _ensemble(stacking="split")
        .fit(f["train"], splits["train"], validation=(f["validation"], splits["validation"]))
        .predict(x)
        .score
    )  # the answer's score does not depend on the token option
    out = ens.save(tmp_path / "ctx")
    back = detector_class("ensemble").load(out, model_key=tiny_model.info.key)
    np.testing.assert_allclose(back.predict(x).token_scores, v.token_scores, atol=1e-7)
    # A token stacker of the other width than the config says is refused.
    _refused(out, reseal, "token_context", False, f"token stacker does not read the {k} inputs")


def _refused(out: Path, reseal, option: str, value, match: str) -> None:
    """An artifact whose cfg.json sets ``option`` to ``value`` is refused on load."""
    cfg = json.loads((out / "cfg.json").read_text())
    cfg["config"][option] = value
    (out / "cfg.json").write_text(json.dumps(cfg))
    reseal(out)
    with pytest.raises(DataError, match=match):
        detector_class("ensemble").load(out)


def test_token_windows_read_each_members_neighbourhood(
    splits, extracted, tmp_path: Path, tiny_model, reseal
):
    """With token_windows the token stacker reads the raw member token logits, then their
    centred window means per width (edges repeated), then the context columns; the
    artifact keeps the widths and a stacker of another width is refused on load."""
    _, f = extracted
    ens = _ensemble(stacking="split", token_context=True, token_windows=(3, 5)).fit(
        f["train"], splits["train"], validation=(f["validation"], splits["validation"])
    )
    k = len(ens.token_members_)
    assert k and ens.token_stacker_.coef_.shape == (3 * k + k + 1,)
    x = max(f["test"], key=lambda g: len(ens.member_verdicts(g)["nll"].token_scores))
    verdicts = ens.member_verdicts(x)
    tok = np.stack([logit(verdicts[n].token_scores) for n in ens.token_members_], 1)
    t = len(tok)
    assert t >= 5

    def mean(col: np.ndarray, w: int) -> np.ndarray:  # by hand: pad with the edge values
        h = w // 2
        padded = np.concatenate([np.full(h, col[0]), col, np.full(h, col[-1])])
        return np.array([padded[i : i + w].mean() for i in range(t)])

    a = float(ens.stacker_.decision_function(ens._row(verdicts)[None, :])[0])
    cols = [tok] + [np.stack([mean(tok[:, j], w) for j in range(k)], 1) for w in (3, 5)]
    want = ens.token_stacker_.predict_proba(np.concatenate([*cols, np.full((t, 1), a), tok * a], 1))
    v = ens.predict(x)
    np.testing.assert_allclose(v.token_scores, want, atol=1e-6)
    out = ens.save(tmp_path / "win")
    back = detector_class("ensemble").load(out, model_key=tiny_model.info.key)
    assert back.config.token_windows == (3, 5)
    np.testing.assert_allclose(back.predict(x).token_scores, v.token_scores, atol=1e-7)
    _refused(out, reseal, "token_windows", [3], r"token_windows=\[3\]")
    for bad in ([4], [3, 3], [1], [0], ["5"], [True], [257], 5, None, "9"):
        _refused(out, reseal, "token_windows", bad, "token_windows")


def test_answer_token_max_reads_each_members_most_suspect_stretch(
    splits, extracted, tmp_path: Path, tiny_model, reseal
):
    """With answer_token_max the response stacker reads the member response logits, then
    per width each token member's highest windowed token logit (its response logit for
    an answer it left without tokens); the inputs are named in the explanation, the
    artifact keeps them and a stacker or a member list that does not fit is refused."""
    _, f = extracted
    ens = _ensemble(stacking="split", answer_token_max=(1, 5)).fit(
        f["train"], splits["train"], validation=(f["validation"], splits["validation"])
    )
    m = ens.answer_members_
    assert m and set(m) <= set(MEMBERS)
    assert ens.stacker_.coef_.shape == (len(MEMBERS) + 2 * len(m),)
    names = [*MEMBERS, *(f"{n} max@1" for n in m), *(f"{n} max@5" for n in m)]
    assert ens.input_names() == names
    x = max(f["test"], key=lambda g: len(ens.member_verdicts(g)[m[0]].token_scores))
    verdicts = ens.member_verdicts(x)
    t = len(verdicts[m[0]].token_scores)
    assert t >= 5

    def peak(n: str, w: int) -> float:  # by hand: pad with the edge values, then the max
        z = logit(verdicts[n].token_scores)
        padded = np.concatenate([np.full(w // 2, z[0]), z, np.full(w // 2, z[-1])])
        return max(padded[i : i + w].mean() for i in range(len(z)))

    row = [*logit([verdicts[n].score for n in MEMBERS])]
    row += [peak(n, w) for w in (1, 5) for n in m]
    v = ens.predict(x)
    assert v.score == pytest.approx(float(ens.stacker_.predict_proba(np.array([row]))[0]))
    assert list(v.explanation) == names
    # An answer a member scored no tokens of reads that member's response logit.
    bare = {**verdicts, m[0]: dataclasses.replace(verdicts[m[0]], token_scores=None)}
    assert ens._row(bare)[len(MEMBERS)] == pytest.approx(logit([verdicts[m[0]].score])[0])
    assert [n for n, _ in ens.importances()] == sorted(
        names, key=lambda n: -abs(ens.stacker_.coef_[names.index(n)])
    )
    out = ens.save(tmp_path / "peaks")
    back = detector_class("ensemble").load(out, model_key=tiny_model.info.key)
    assert back.answer_members_ == m and back.config.answer_token_max == (1, 5)
    assert back.predict(x).score == pytest.approx(v.score, abs=1e-12)
    _refused(out, reseal, "answer_token_max", [1], r"answer_token_max=\[1\]")
    for bad in ([4], [3, 3], [0], ["5"], [True], [257], 5, None):
        _refused(out, reseal, "answer_token_max", bad, "answer_token_max")
    cfg = json.loads((out / "cfg.json").read_text())
    cfg["config"]["answer_token_max"] = [1, 5]
    (out / "cfg.json").write_text(json.dumps(cfg))
    w = json.loads((out / "weights.json").read_text())
    for key in ("answer_token_members", "token_members"):
        for bad in (["spad"], [m[0], m[0]], "nll", [3], {"nll": 1}):
            (out / "weights.json").write_text(json.dumps({**w, key: bad}))
            reseal(out)
            with pytest.raises(DataError, match="token members"):
                detector_class("ensemble").load(out)


def test_config_is_checked():
    with pytest.raises(DataError, match="repeat"):
        make_detector("ensemble", members=("nll", "nll"))
    with pytest.raises(DataError, match="its own member"):
        make_detector("ensemble", members=("nll", "ensemble"))
    with pytest.raises(DataError, match="not members"):
        make_detector("ensemble", members=("nll",), member_configs={"lexical": {}})
    with pytest.raises(DataError, match="at least one"):
        make_detector("ensemble", members=())


def test_a_member_that_cannot_read_the_model_makes_the_ensemble_unavailable(tiny_model):
    why = make_detector("ensemble").unavailable(tiny_model.info)
    assert why is not None and why.startswith("member raglens")
    assert _ensemble().unavailable(tiny_model.info) is None


def test_evaluate_reports_the_ensemble_beside_its_members(tiny_model, splits, db):
    run = evaluate(
        tiny_model,
        [*MEMBERS, "ensemble"],
        Splits.of(splits, "builtin"),
        EvalOptions(n_boot=50),
        configs={"ensemble": {"members": MEMBERS}},
        cache=FeatureCache(db),
    )
    names = [r.detector for r in run.results]
    assert names == [*MEMBERS, "ensemble"]
    ens = run.results[-1]
    assert 0.0 <= ens.metrics["auroc"] <= 1.0
    # token metrics from the token stacker, labelled on the verdict's own token grid
    assert ens.token_metrics is not None and 0.0 <= ens.token_metrics["auroc"] <= 1.0


def test_the_ensembles_token_scores_flag_review_spans_like_any_detectors(splits, extracted):
    """Issue 37: the ensemble's token output feeds whole-word review spans."""
    _, f = extracted
    ens = _ensemble(stacking="split").fit(
        f["train"], splits["train"], validation=(f["validation"], splits["validation"])
    )
    ex = splits["test"][0]
    v = ens.predict(f["test"][0])
    words = [
        j for j, (a, b) in enumerate(v.token_offsets) if any(c.isalnum() for c in ex.response[a:b])
    ]
    top = max(words, key=lambda j: v.token_scores[j])  # its most suspect word token
    thr = float(v.token_scores[top])
    flags = propose_flags(ex, {"ensemble": v}, {"ensemble": thr})
    a, b = (int(o) for o in v.token_offsets[top])
    (hit,) = [fl for fl in flags if fl.start < b and a < fl.end]  # the span holding it
    assert ex.response[a:b].strip() in ex.response[hit.start : hit.end]
    assert hit.sources == {"ensemble": (pytest.approx(thr), thr)}
    assert ex.response[hit.start : hit.end].strip() == ex.response[hit.start : hit.end]


def _as_datasets(examples, names=("alpha_dev", "beta")):
    """``examples`` with their sources dealt out to the datasets ``names`` in turn."""
    keys = sorted({source_key(e) for e in examples})
    which = {k: names[i % len(names)] for i, k in enumerate(keys)}
    return [
        dataclasses.replace(
            e, provenance=dataclasses.replace(e.provenance, dataset=which[source_key(e)])
        )
        for e in examples
    ]


def test_a_dataset_stacker_reads_its_datasets_answers_through_that_datasets_calibration(
    splits, extracted, tmp_path: Path, tiny_model, reseal
):
    """With dataset_stackers a training dataset gets a response stacker of its own,
    fitted on its stacking rows alone with its own token-peak widths; its raw score
    rides in the verdict, that dataset's own calibration is fitted on it, and every
    judging path (for_dataset) reads an answer of that dataset (or another split of it)
    by it, while other datasets and unknown ones keep the pooled stacker."""
    _, f = extracted
    train = _as_datasets(splits["train"])
    alpha = [i for i, e in enumerate(train) if e.provenance.dataset == "alpha_dev"]
    assert len(alpha) >= MIN_DATASET_ANSWERS
    ens = _ensemble(dataset_stackers={"alpha_dev": [5], "beta": [], "gamma": [3]}).fit(
        f["train"], train
    )
    # the pooled stacker is what it is without dataset stackers
    plain = _ensemble().fit(f["train"], train)
    np.testing.assert_allclose(ens.stacker_.coef_, plain.stacker_.coef_)
    info = ens.train_info_["dataset_stackers"]
    assert info["alpha_dev"]["n"] == len(alpha) and "skipped" in info["gamma"]
    assert (
        set(ens.dataset_stackers_) <= {"alpha_dev", "beta"} and "alpha_dev" in ens.dataset_stackers_
    )
    own = ens.dataset_stackers_["alpha_dev"]
    assert own.widths == (5,) and own.answer_members
    assert own.stacker.coef_.shape == (len(MEMBERS) + len(own.answer_members),)
    assert ens.input_names("alpha_dev")[len(MEMBERS) :] == [
        f"{n} max@5" for n in own.answer_members
    ]
    x = f["test"][0]
    v = ens.predict(x)
    row = ens._row(ens.member_verdicts(x), (5,), own.answer_members)
    assert v.raw_by_dataset["alpha_dev"] == pytest.approx(
        float(own.stacker.predict_proba(row[None, :])[0])
    )
    assert v.score == pytest.approx(plain.predict(x).score)
    # calibration: alpha_dev's own is fitted on its stacker's raw scores
    raw = [ens.predict(g) for g in f["train"]]
    set_thresholds(ens, f["train"], train, calibrate=[True] * len(train), by_dataset=True)
    cal = ens.dataset_calibration_["alpha_dev"]
    by_hand = PlattCalibrator().fit(
        np.array([raw[i].raw_by_dataset["alpha_dev"] for i in alpha]),
        np.array([int(bool(train[i].label)) for i in alpha]),
    )
    probe = np.array([0.2, 0.5, 0.8])
    np.testing.assert_allclose(cal.calibrator.transform(probe), by_hand.transform(probe), atol=1e-6)
    # every path: another split of alpha reads its stacker; beta and unknown do not
    v = ens.predict(x)
    a = judge_features(ens, x, "alpha_test")
    assert a.calibrated_for == "alpha_dev" and a.raw_score == v.raw_score
    assert a.judged_raw == v.raw_by_dataset["alpha_dev"]
    assert a.score == pytest.approx(cal.apply(v.raw_by_dataset["alpha_dev"]))
    assert a.hallucinated == (a.score >= cal.threshold)
    assert for_dataset(ens, v, "alpha_dev").score == a.score
    assert judge_features(ens, x, None).score == v.score and v.judged_raw == v.raw_score
    if "beta" in ens.dataset_calibration_ and "beta" not in ens.dataset_stackers_:
        b = judge_features(ens, x, "beta")
        assert b.score == pytest.approx(ens.dataset_calibration_["beta"].apply(v.raw_score))
    # the artifact keeps the dataset stackers; tampering is refused
    out = ens.save(tmp_path / "own")
    back = detector_class("ensemble").load(out, model_key=tiny_model.info.key)
    assert set(back.dataset_stackers_) == set(ens.dataset_stackers_)
    assert back.config.dataset_stackers == {"alpha_dev": (5,), "beta": (), "gamma": (3,)}
    assert back.predict(x).raw_by_dataset == pytest.approx(v.raw_by_dataset)
    assert judge_features(back, x, "alpha_test").score == pytest.approx(a.score)
    _refused(
        out, reseal, "dataset_stackers", {"alpha_dev": [3, 5], "beta": []}, "'alpha_dev'.s stacker"
    )
    for bad, match in (
        ({"alpha_dev": [4]}, "dataset_stackers"),
        ({"alpha_dev": "5"}, "dataset_stackers"),
        ({"": [5]}, "dataset_stackers"),
        ({"a\nb": []}, "dataset_stackers"),
        ([5], "dataset_stackers"),
        ({f"d{i}": [] for i in range(1000)}, "dataset_stackers"),
    ):
        _refused(out, reseal, "dataset_stackers", bad, match)
    cfg = json.loads((out / "cfg.json").read_text())
    cfg["config"]["dataset_stackers"] = {"alpha_dev": [5], "beta": [], "gamma": [3]}
    (out / "cfg.json").write_text(json.dumps(cfg))
    w = json.loads((out / "weights.json").read_text())
    for bad in (
        {"delta": w["dataset_stackers"]["alpha_dev"]},
        {"alpha_dev": {"response": w["response"]}},
        {"alpha_dev": {**w["dataset_stackers"]["alpha_dev"], "answer_token_members": ["spad"]}},
        "alpha_dev",
    ):
        (out / "weights.json").write_text(json.dumps({**w, "dataset_stackers": bad}))
        reseal(out)
        with pytest.raises(DataError):
            detector_class("ensemble").load(out)
