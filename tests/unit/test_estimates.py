"""Time estimates of page actions (core.pipeline.extract's estimating section): the examples not
cached yet, at a pace measured here on the first of them, whose features are kept."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from app.components.estimate import describe_work, format_seconds, time_left
from app.state import estimates
from core.detectors import make_detector
from core.engine.model import LoadedModel
from core.explain import clear_activation_cache, encode_answers
from core.pipeline.extract import (
    FeatureCache,
    WorkEstimate,
    estimate_extraction,
    example_chars,
    example_lengths,
    extract_features,
    fit_paces,
    is_cached,
    time_extraction,
    uncached,
)
from core.storage import Store
from core.storage.analyses import HASHES_PER_QUERY


@pytest.fixture
def cache(tmp_path: Path):
    with Store(tmp_path / "c.sqlite3") as store:
        yield FeatureCache(store)


def test_example_chars_count_the_prompt_material_and_the_answer(toy_example) -> None:
    want = sum(map(len, toy_example.passages)) + len(toy_example.question or "")
    assert example_chars(toy_example) == want + len(toy_example.response)
    verbatim = replace(
        toy_example, prompt="P" * 40 + toy_example.question + "".join(toy_example.passages)
    )
    assert example_chars(verbatim) == len(verbatim.prompt) + len(toy_example.response)


def test_the_estimate_counts_what_is_cached_and_paces_the_rest(
    tiny_model: LoadedModel, toy_example, cache: FeatureCache
) -> None:
    key = tiny_model.info.key
    dets = [make_detector("nll"), make_detector("context_gain")]
    a = toy_example
    b = replace(toy_example, id="toy-2", response=toy_example.response + " It is old.")
    c = replace(toy_example, id="toy-3", response="It was built in 1820.", spans=(), label=None)
    extract_features(tiny_model, [a], dets, cache=cache)
    assert is_cached(cache, key, a, dets) and not is_cached(cache, key, b, dets)
    timed: list[str] = []

    def pace(ex):
        timed.append(ex.id)
        return time_extraction(tiny_model, ex, dets, cache)

    est = estimate_extraction(key, [a, b, c], dets, cache, pace, fixed_seconds=2.0)
    # The first uncached example was timed, and its features kept: it now counts as cached.
    assert timed == ["toy-2"] and is_cached(cache, key, b, dets)
    assert (est.n_examples, est.n_cached, est.n_to_trace) == (3, 2, 1)
    assert est.chars_to_trace == example_chars(c) and est.known
    assert est.seconds == pytest.approx(2.0 + example_chars(c) * est.seconds_per_char)
    assert est.seconds_per_example == pytest.approx(est.seconds - 2.0)
    # Everything cached: nothing is timed, the estimate is the fixed part alone.
    timed.clear()
    done = estimate_extraction(key, [a, b], dets, cache, pace)
    assert timed == [] and done.n_to_trace == 0 and done.known and done.seconds == 0.0
    # No cache: every example is to trace.
    assert estimate_extraction(key, [a, b], dets, None, lambda ex: 1e-3).n_to_trace == 2
    # A composite needs every member's features before an example counts as cached.
    ens = make_detector("ensemble")
    assert not is_cached(cache, key, a, [ens])
    # Many examples at once give what one at a time gives.
    assert uncached(cache, key, [a, b, c, a], dets) == [c]
    assert uncached(cache, key, [a, c], [ens]) == [a, c]
    assert uncached(cache, key, [a, c], []) == []


def test_stored_hashes_are_asked_in_chunks_and_found_across_them(tmp_path: Path) -> None:
    n = 2 * HASHES_PER_QUERY + 7
    with Store(tmp_path / "h.sqlite3") as store:
        for i in range(0, n, 3):
            store.put_analysis(
                example_hash=f"h{i}", model="m", detector="nll", config_hash="c", result=[1]
            )
        asked = [f"h{i}" for i in range(n)] + ["h0"]
        found = store.stored_hashes(
            example_hashes=asked, model="m", detector="nll", config_hash="c"
        )
        assert found == {f"h{i}" for i in range(0, n, 3)}
        assert not store.stored_hashes(
            example_hashes=asked, model="m", detector="nll", config_hash="other"
        )


def test_the_words_say_the_time_what_is_cached_and_when_it_is_unknown() -> None:
    est = WorkEstimate(n_examples=8, n_cached=2, chars_to_trace=6000, seconds_per_char=0.01)
    text = describe_work(est, what="answers")
    assert "**about 1 min**" in text and "6 of 8 answers to trace at about 10.0 s each" in text
    assert "2 already in the feature cache" in text
    cached = WorkEstimate(n_examples=3, n_cached=3, chars_to_trace=0, seconds_per_char=None)
    assert "**a few seconds**" in describe_work(cached) and "all 3 answers" in describe_work(cached)
    gen = replace(cached, fixed_seconds=30.0)
    assert "**about 30 s**" in describe_work(gen, extra="the generation")
    unknown = WorkEstimate(n_examples=2, n_cached=0, chars_to_trace=10, seconds_per_char=None)
    assert not unknown.known and "unknown" in describe_work(unknown)
    assert format_seconds(61) == "1 min 1 s" and format_seconds(7260) == "2 h 1 min"


def test_the_bar_says_the_time_left_from_the_pace_so_far() -> None:
    assert time_left(0, 10, 5.0) == "" and time_left(10, 10, 50.0) == ""
    assert time_left(2, 10, 10.0) == " · about 40 s left"


def test_a_pace_is_recorded_once_and_read_back_sanely(tmp_path: Path) -> None:
    with Store(tmp_path / "p.sqlite3") as store:
        assert store.get_pace(model="m", detectors="nll:1") is None
        store.put_pace(model="m", detectors="nll:1", seconds_per_char=0.002)
        assert store.get_pace(model="m", detectors="nll:1") == 0.002
        assert store.get_pace(model="m", detectors="cortex:1") is None
        for bad in (float("nan"), float("inf"), 0.0, -1.0, 1e6):
            store.put_pace(model="m", detectors="nll:1", seconds_per_char=bad)  # not recorded
        assert store.get_pace(model="m", detectors="nll:1") == 0.002
        # A pace older than a day is measured again; a date in the future is not believed.
        with store._tx() as c:
            c.execute("UPDATE paces SET measured_at = '2020-01-01T00:00:00+00:00'")
        assert store.get_pace(model="m", detectors="nll:1") is None
        for when in ("2999-01-01T00:00:00+00:00", "yesterday", "2026-01-01T00:00:00"):
            with store._tx() as c:
                c.execute("UPDATE paces SET measured_at = ?", (when,))
            assert store.get_pace(model="m", detectors="nll:1") is None
        store.put_pace(model="m", detectors="nll:1", seconds_per_char=0.003)
        assert store.get_pace(model="m", detectors="nll:1") == 0.003
        # A row written by something else is not taken for a pace.
        with store._tx() as c:
            c.execute("UPDATE paces SET seconds_per_char = 'fast'")
        assert store.get_pace(model="m", detectors="nll:1") is None


def test_the_page_estimate_reads_the_pace_recorded_in_an_earlier_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: LoadedModel, toy_example
) -> None:
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "app.sqlite3"))
    dets = [make_detector("nll")]
    estimates.forget_timings()
    timed: list[str] = []

    def timing(model, ex, detectors, cache) -> float:
        timed.append(ex.id)
        return 0.004

    monkeypatch.setattr(estimates, "time_extraction", timing)
    first = estimates.work_estimate(tiny_model, [toy_example], dets)
    assert timed == [toy_example.id] and first.seconds_per_char == 0.004
    estimates.forget_timings()  # a new process: nothing memoised, the database remains
    again = estimates.work_estimate(tiny_model, [replace(toy_example, id="other")], dets)
    assert timed == [toy_example.id] and again.seconds_per_char == 0.004


def test_an_action_records_the_pace_it_ran_at_and_the_next_estimate_follows_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: LoadedModel, toy_example
) -> None:
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "app.sqlite3"))
    dets = [make_detector("nll")]
    estimates.forget_timings()
    monkeypatch.setattr(estimates, "time_extraction", lambda *a: 9.0)  # a slow first timing
    a = replace(toy_example, id="a")
    b = replace(toy_example, id="b", response=toy_example.response + " It is old.")
    c = replace(toy_example, id="c", response="It was built in 1820.", spans=(), label=None)
    assert estimates.work_estimate(tiny_model, [a, b], dets, action="scan").seconds_per_char == 9.0
    store = estimates.get_store()
    plain = estimates._pace_key(estimates.detectors_key(dets))

    def recorded(key: str = f"scan|{plain}") -> float | None:
        return store.get_pace(model=tiny_model.instance_key, detectors=key)

    # An action that fails records nothing.
    with (
        pytest.raises(RuntimeError),
        estimates.paced_extraction(tiny_model, [a, b], dets, action="scan"),
    ):
        raise RuntimeError("stopped")
    assert recorded() is None and recorded(plain) == 9.0
    # The action's own pace replaces the first timing for it: its time over what it traced.
    t0 = time.perf_counter()
    with estimates.paced_extraction(tiny_model, [a, b], dets, action="scan"):
        extract_features(tiny_model, [a, b], dets, cache=FeatureCache(store))
    outer = (time.perf_counter() - t0) / (example_chars(a) + example_chars(b))
    assert 0 < recorded() <= outer < 9.0  # type: ignore[operator]
    nxt = estimates.work_estimate(tiny_model, [a, b, c], dets, action="scan")
    assert (nxt.n_cached, nxt.seconds_per_char, nxt.seconds_per_kept) == (2, recorded(), 0.0)
    # Another action with the same detectors is not paced on this one's run.
    other = estimates.work_estimate(tiny_model, [a, b, c], dets, action="agreement")
    assert other.seconds_per_char == 9.0
    # An action that only reads the cache measures the pace of a kept answer.
    before = recorded()
    with estimates.paced_extraction(tiny_model, [a, b], dets, action="scan"):
        time.sleep(0.05)
    assert recorded() == before
    kept = recorded(f"scan|{plain}{estimates.KEPT}")
    assert kept is not None and 0.025 <= kept < 1.0
    again = estimates.work_estimate(tiny_model, [a, b, c], dets, action="scan")
    assert again.seconds_per_kept == kept and again.kept_seconds == pytest.approx(2 * kept)


class _Clock:
    """A clock an action's simulated work moves on."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


def test_estimates_of_a_page_action_fall_within_1_5x_of_its_recorded_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: LoadedModel, toy_example
) -> None:
    """Issue 55: on this machine a page's estimate missed its time by 2-3x (a Review scan
    54 s against 17 s, Agreement 90 s against 192 s). An action there costs a pace per
    character traced plus its own work on every answer, kept or not (judging, spans); the
    estimate must follow both from the runs recorded, within 1.5x either way."""
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "app.sqlite3"))
    clock = _Clock()
    monkeypatch.setattr(estimates, "time", clock)
    estimates.forget_timings()
    per_char, per_answer = 0.02, 1.5  # the machine's true costs, unknown to the estimate
    monkeypatch.setattr(estimates, "time_extraction", lambda *a: per_char)  # warm timing
    dets = [make_detector("nll")]
    cache = FeatureCache(estimates.get_store())
    examples = [
        replace(toy_example, id=f"e{i}", response=toy_example.response + " More." * (i % 5))
        for i in range(40)
    ]

    def run(chosen: list) -> float:
        """The action on ``chosen``: the true time, moved on the clock, features kept."""
        todo = uncached(cache, tiny_model.info.key, chosen, dets)
        took = per_char * sum(map(example_chars, todo)) + per_answer * len(chosen)
        with estimates.paced_extraction(tiny_model, chosen, dets, action="scan"):
            extract_features(tiny_model, todo, dets, cache=cache)
            clock.now += took
        return took

    misses = []
    for chosen in (examples[:8], examples[:8], examples[:20], examples[4:30], examples[:40]):
        said = estimates.work_estimate(tiny_model, chosen, dets, action="scan").seconds
        misses.append(said / run(chosen))
    # The first run knows only the warm extraction pace, not the action's own work.
    assert misses[0] < 1.0
    # Once a run has traced and one has only read, every estimate is within 1.5x.
    assert all(1 / 1.5 <= m <= 1.5 for m in misses[2:]), misses


def test_an_sae_read_records_its_pace_for_the_next_read_estimate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: LoadedModel, tiny_sae, toy_example
) -> None:
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "app.sqlite3"))
    clear_activation_cache()
    estimates.forget_timings()
    monkeypatch.setattr(estimates, "time_reading", lambda *a: 9.0)
    a = replace(toy_example, id="a")
    b = replace(toy_example, id="b", response=toy_example.response + " It is old.")
    assert estimates.sae_read_estimate(tiny_model, tiny_sae, [a, b], "post").seconds_per_char == 9.0
    with estimates.paced_read(tiny_model, tiny_sae, [a], "post"):
        encode_answers(tiny_model, tiny_sae, [a], activation="post")
    after = estimates.sae_read_estimate(tiny_model, tiny_sae, [a, b], "post")
    assert after.n_cached == 1 and 0 < after.seconds_per_char < 9.0
    assert after.fixed_seconds == 0.0
    # What the page does after a read (each feature's top answers, its cards) grows with
    # the answers read, kept ones too: once timed, the next estimate adds it.
    estimates.record_shown(tiny_model, tiny_sae, "post", 4, 2.0)
    shown = estimates.sae_read_estimate(tiny_model, tiny_sae, [a, b], "post")
    assert shown.fixed_seconds == pytest.approx(1.0)
    assert shown.seconds == pytest.approx(after.seconds + 1.0)


def test_an_action_that_says_each_example_s_end_paces_prompt_and_answer_apart(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: LoadedModel, toy_example
) -> None:
    """On this machine an answer character costs about ten prompt characters for the
    default set (per-token features), so a pace per character learnt on short answers
    missed longer ones by 1.5x (Agreement: 45 s against 30 s said). An action that ticks
    its progress per example gets the two paces, and a kept example's own cost."""
    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "app.sqlite3"))
    clock = _Clock()
    monkeypatch.setattr(estimates, "time", clock)
    estimates.forget_timings()
    monkeypatch.setattr(estimates, "time_extraction", lambda *a: 0.01)
    dets = [make_detector("nll")]
    cache = FeatureCache(estimates.get_store())
    p_pace, r_pace, kept_cost = 0.002, 0.02, 0.3

    def cost(e) -> float:
        p, r = example_lengths(e)
        return p_pace * p + r_pace * r

    def ex(i: int, answer_words: int, passage_words: int):
        return replace(
            toy_example,
            id=f"x{i}",
            passages=("Ada Lovell built the bridge. " * passage_words,),
            response="It was built in 1820 by Ada. " * answer_words,
            spans=(),
            label=None,
        )

    short = [ex(i, 1 + i % 3, 10 + 3 * i) for i in range(12)]  # short answers, varied
    long = [ex(100 + i, 8 + i % 4, 6) for i in range(8)]  # long answers

    def run(chosen: list) -> float:
        todo = uncached(cache, tiny_model.info.key, chosen, dets)
        took = 0.0
        with estimates.paced_extraction(tiny_model, chosen, dets, action="cmp") as pacer:
            tick = pacer.ticking(lambda done, total: None)
            extract_features(tiny_model, todo, dets, cache=cache)
            for i, e in enumerate(chosen, 1):
                step = cost(e) if e in todo else kept_cost
                clock.now += step
                took += step
                tick(i, len(chosen))
        return took

    run(short)
    got = estimates.work_estimate(tiny_model, short + long, dets, action="cmp")
    assert got.seconds_per_kept == 0.0  # that run kept nothing: a kept example's cost unknown
    actual = run(short + long)
    assert 1 / 1.5 <= got.seconds / actual <= 1.5, (got.seconds, actual)
    # This run read kept examples: their own times are the kept pace.
    again = estimates.work_estimate(tiny_model, short + long, dets, action="cmp")
    assert again.seconds_per_kept == pytest.approx(kept_cost)
    # A pace per character alone, as learnt from the short answers, would miss by more.
    plain = sum(map(cost, short)) / sum(map(example_chars, short))
    assert plain * sum(map(example_chars, long)) + 12 * kept_cost < actual / 1.5
    # fit_paces gives the two paces back from the examples' own times.
    fit = fit_paces([cost(e) for e in short], short)
    assert fit is not None and fit.prompt == pytest.approx(p_pace, rel=1e-6)
    assert fit.response == pytest.approx(r_pace, rel=1e-6)
    assert fit_paces([1.0] * 3, short[:3]) is None  # too few to split


def test_a_page_never_waits_for_its_estimate_the_timing_runs_in_the_background(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: LoadedModel, toy_example
) -> None:
    """Issue 67: Counterfactual, Review, Heads and Agreement spent 21-37 s "timing one
    answer" before a user could act. Under deferred_timing (estimate_caption's), the first
    estimate starts the timing on a thread and says it is pending at once; the next, once
    it is done, reads the pace it recorded; it is timed once."""
    import threading

    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "app.sqlite3"))
    dets = [make_detector("nll")]
    estimates.forget_timings()
    release = threading.Event()
    timed: list[str] = []

    def timing(model, ex, detectors, cache) -> float:
        timed.append(threading.current_thread().name)
        release.wait(30)  # a slow answer: the page goes on meanwhile
        return 0.004

    monkeypatch.setattr(estimates, "time_extraction", timing)
    t0 = time.perf_counter()
    with estimates.deferred_timing(), pytest.raises(estimates.PacePending) as pending:
        estimates.work_estimate(tiny_model, [toy_example], dets)
    assert time.perf_counter() - t0 < 5  # it did not wait for the timing
    assert estimates.timing(pending.value.key)
    with estimates.deferred_timing(), pytest.raises(estimates.PacePending):
        estimates.work_estimate(tiny_model, [toy_example], dets)  # still timing: once
    release.set()
    estimates.settle()
    assert not estimates.timing(pending.value.key)
    with estimates.deferred_timing():
        got = estimates.work_estimate(tiny_model, [toy_example], dets)
    assert got.seconds_per_char == 0.004 and timed == ["ragscope-estimate-timing"]


def test_judging_estimates_count_answer_tokens_and_an_adapted_set_reuses_the_pace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: LoadedModel, toy_example
) -> None:
    """Judging grows with the answer's tokens (the lens reads each at every layer), not
    with the prompt's characters: an Analyse's pace is per answer token, and a set that
    reads the same features (one adapted from it) estimates at the same pace."""
    import dataclasses
    from types import SimpleNamespace

    from core.pipeline.extract import answer_tokens
    from core.pipeline.sets import DetectorSet

    monkeypatch.setenv("RAGSCOPE_DB", str(tmp_path / "app.sqlite3"))
    dets = [make_detector("nll"), make_detector("context_gain")]
    dset = DetectorSet(
        name="s", folder=tmp_path, model_key=tiny_model.info.key, detectors=(), broken=(),
        other_models=(), stamp="1",
    )  # fmt: skip
    # the estimate reads each card's detector (its name and feature configuration)
    cards = tuple(SimpleNamespace(name=d.name, detector=d) for d in dets)
    dset = dataclasses.replace(dset, detectors=cards)  # type: ignore[arg-type]
    adapted = dataclasses.replace(dset, name="s+mine-1", stamp="2")
    n = answer_tokens(tiny_model, toy_example)
    estimates.record_answers(tiny_model, dset, estimates.ANALYSE, [toy_example], 2.0 * n)
    assert estimates.answers_seconds(
        tiny_model, dset, estimates.ANALYSE, [toy_example]
    ) == pytest.approx(2.0 * n)
    longer = replace(toy_example, response=toy_example.response + " It is very old indeed.")
    m = answer_tokens(tiny_model, longer)
    assert m > n
    # a longer answer, with the same passages: more, by its tokens
    assert estimates.answers_seconds(
        tiny_model, adapted, estimates.ANALYSE, [longer]
    ) == pytest.approx(2.0 * m)
    # the same passages with a short answer cost less than a character pace would say
    padded = replace(toy_example, passages=tuple(p * 5 for p in toy_example.passages))
    assert estimates.answers_seconds(
        tiny_model, dset, estimates.ANALYSE, [padded]
    ) == pytest.approx(2.0 * answer_tokens(tiny_model, padded))


def test_browser_tests_know_the_timing_caption_by_its_container_key() -> None:
    """tools.browser (which may not import the app) waits for the caption a page shows
    while an estimate is timed in the background, by the class of its container."""
    from app.components.estimate import TIMING_KEY
    from tools.browser import TIMING_CLASS

    assert TIMING_CLASS == f'[class*="st-key-{TIMING_KEY}-"]'
