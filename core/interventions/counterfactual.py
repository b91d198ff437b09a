"""Counterfactual context editing: change the passages, keep (or regenerate) the answer,
and re-score it with every detector (RAGLens appendix H's perturbation pattern).

- :func:`edit_example` makes the edited example: new passage texts, the same answer
  (teacher-forced; its gold spans stay valid, since the answer's characters do not
  move) or a regenerated one (no gold: spans and label are dropped).
- :func:`context_diff` lists what changed, word by word, per passage.
- :func:`support_span` / :func:`contradict_span` are the paper's case-study presets:
  copy a flagged span's claim into the passage it is about, or state it there in a
  different way (numbers shifted, names swapped), so the flags should disappear in
  the first case and stay in the second.
- :func:`score_pair` runs every given detector on both versions (one shared trace per
  version), with what else their features show (:func:`detector_views`: SPAD's
  source means, the ECS of ReDeEP's selected heads, RAGLens's top SAE features per
  token), and :class:`Counterfactual` keeps the original, the edit and the results;
  it saves to SQLite (:meth:`core.storage.Store.save_counterfactual`) and exports as
  JSON. :func:`judge_pair` does the same with a detector set and also gives the set's
  :class:`~core.pipeline.judge.Judgement` of each version, from the same traces.

An example with a verbatim prompt (RAGTruth) is compared on ragscope's own template on
both sides, since the verbatim prompt holds the original passages.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np

from core.base.errors import DataError, brief
from core.base.examples import RAGExample, Span
from core.detectors.raglens import RaglensDetector, feature_name
from core.engine.generate import GenerationConfig, generate
from core.engine.model import LoadedModel
from core.learning.contract import CALLS, Detector, Features, judge_features
from core.pipeline.extract import WARM_UP, run_example
from core.pipeline.judge import Judgement, judgement_from
from core.pipeline.sets import DetectorSet
from core.storage import Store

AnswerMode = Literal["fixed", "regenerate"]
ANSWER_MODES: tuple[AnswerMode, ...] = ("fixed", "regenerate")
NO_CONTEXT = "No relevant documents were found."
"""What "remove all context" leaves: the prompt always holds at least one passage, so
the edit reads as a retrieval that found nothing."""
FORMAT = 1

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NAME = re.compile(r"\b[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*\b")
STAND_IN_NAME = "Marrowby"


# --------------------------------------------------------------------------- edits


def on_template(example: RAGExample) -> RAGExample:
    """``example`` laid out with ragscope's template (its verbatim prompt dropped)."""
    return example if example.prompt is None else dataclasses.replace(example, prompt=None)


def edit_example(
    example: RAGExample, passages: Sequence[str], *, answer: str | None = None
) -> RAGExample:
    """The example with ``passages`` as its context (blank ones dropped).

    Args:
        example: The original.
        passages: The edited passage texts; none left (all blank) means "no context"
            (:data:`NO_CONTEXT`).
        answer: A regenerated answer; ``None`` keeps the original answer and its gold.

    Raises:
        DataError: The edited example is invalid (names the field to fix).
    """
    kept = tuple(p for p in passages if p.strip()) or (NO_CONTEXT,)
    base = on_template(example)
    suffix = "cf" if answer is None else "cf-regen"
    kw: dict[str, Any] = {"passages": kept, "id": f"{example.id}~{suffix}"}
    if answer is not None:
        kw.update(response=answer, spans=(), label=None)
    return dataclasses.replace(base, **kw)


@dataclass(frozen=True, kw_only=True)
class ContextChange:
    """One change between the original and the edited passages.

    Attributes:
        passage: Index of the passage (in the original; in the edit for added ones).
        op: ``replace``, ``delete``, ``insert`` (words inside a passage),
            ``remove_passage`` or ``add_passage``.
        old: The original words ("" for insertions).
        new: The new words ("" for deletions).
    """

    passage: int
    op: Literal["replace", "delete", "insert", "remove_passage", "add_passage"]
    old: str
    new: str

    def describe(self) -> str:
        where = f"passage {self.passage + 1}"
        return {
            "replace": f"{where}: “{self.old}” → “{self.new}”",
            "delete": f"{where}: deleted “{self.old}”",
            "insert": f"{where}: inserted “{self.new}”",
            "remove_passage": f"{where} removed",
            "add_passage": f"{where} added: “{self.new[:80]}”",
        }[self.op]


def context_diff(original: Sequence[str], edited: Sequence[str]) -> list[ContextChange]:
    """Word-level changes per passage (passages are matched by position)."""
    out: list[ContextChange] = []
    for k in range(max(len(original), len(edited))):
        if k >= len(edited):
            out.append(ContextChange(passage=k, op="remove_passage", old=original[k], new=""))
            continue
        if k >= len(original):
            out.append(ContextChange(passage=k, op="add_passage", old="", new=edited[k]))
            continue
        a, b = original[k].split(), edited[k].split()
        for tag, i0, i1, j0, j1 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
            if tag == "equal":
                continue
            out.append(
                ContextChange(
                    passage=k,
                    op=tag,
                    old=" ".join(a[i0:i1]),
                    new=" ".join(b[j0:j1]),
                )
            )
    return out


def claim_sentence(response: str, span: Span) -> tuple[int, int]:
    """Character range of the answer sentence holding (the start of) ``span``."""
    starts = [0] + [m.end() for m in _SENTENCE_END.finditer(response)]
    a = max(s for s in starts if s <= span.start)
    later = [s for s in starts if s > span.start]
    b = later[0] if later else len(response)
    return a, len(response[:b].rstrip())


def _target_passage(passages: Sequence[str], claim: str) -> int:
    """The passage sharing the most words with ``claim`` (the one it is about)."""
    words = {w.lower() for w in re.findall(r"\w+", claim)}
    overlap = [len(words & {w.lower() for w in re.findall(r"\w+", p)}) for p in passages]
    return int(np.argmax(overlap))


def _span(example: RAGExample, span: Span | int) -> Span:
    if isinstance(span, Span):
        return span
    if not example.spans:
        raise DataError(
            f"example {example.id!r} has no hallucination span to build the preset from; "
            "pick an answer with a gold or flagged span",
            field="spans",
        )
    if not 0 <= span < len(example.spans):
        raise DataError(f"example {example.id!r} has no span {span}", field="spans")
    return example.spans[span]


def support_span(example: RAGExample, span: Span | int = 0) -> tuple[str, ...]:
    """Passages that state the span's claim: the answer sentence holding the span is
    appended to the passage it shares the most words with."""
    s = _span(example, span)
    a, b = claim_sentence(example.response, s)
    claim = example.response[a:b].strip()
    k = _target_passage(example.passages, claim)
    out = list(example.passages)
    out[k] = f"{out[k].rstrip()} {claim}"
    return tuple(out)


def alter_claim(claim: str, span_text: str) -> str:
    """The claim with the span's facts stated differently: its numbers shifted, else its
    names replaced by :data:`STAND_IN_NAME`, else "not" put before the span."""
    i = claim.find(span_text)
    if i < 0:
        i, span_text = 0, claim
    head, body, tail = claim[:i], claim[i : i + len(span_text)], claim[i + len(span_text) :]
    if _NUMBER.search(body):

        def shift(m: re.Match[str]) -> str:
            digits = m.group(0).replace(",", "")
            try:
                return str(int(digits) + 7) if "." not in digits else f"{float(digits) * 1.5:g}"
            except ValueError:
                return m.group(0)

        changed = _NUMBER.sub(shift, body)
    elif _NAME.search(body):
        changed = _NAME.sub(STAND_IN_NAME, body)
    else:
        changed = f"not {body}"
    return f"{head}{changed}{tail}"


def contradict_span(example: RAGExample, span: Span | int = 0) -> tuple[str, ...]:
    """Passages that state the span's claim in a different way (:func:`alter_claim`),
    appended to the passage it is about: still unsupported, differently."""
    s = _span(example, span)
    a, b = claim_sentence(example.response, s)
    claim = example.response[a:b].strip()
    altered = alter_claim(claim, example.response[s.start : s.end])
    k = _target_passage(example.passages, claim)
    out = list(example.passages)
    out[k] = f"{out[k].rstrip()} {altered}"
    return tuple(out)


# --------------------------------------------------------------------------- scoring


@dataclass(frozen=True, kw_only=True)
class SideScore:
    """One detector's reading of one version of the answer.

    Attributes:
        score: Response score in [0, 1].
        flagged: Whether it reaches the detector's threshold.
        token_scores: Per answer token (``None`` when the detector gives none).
        token_offsets: Character ranges of the tokens that ``token_scores`` and
            ``token_rows`` describe.
        token_rows: Other per-token values by name (e.g. ``SAE F12`` activations).
        summary: Answer-level values by name (e.g. SPAD's mean sources).
        call: The verdict's call in words (:attr:`core.learning.contract.Verdict.call`:
            ``flagged``, ``not flagged``, ``no signal``, ``no threshold``).
    """

    score: float
    flagged: bool | None
    call: str = ""
    token_scores: tuple[float, ...] | None = None
    token_offsets: tuple[tuple[int, int], ...] | None = None
    token_rows: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    summary: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.call:  # a side made without its verdict's words: from its flag
            call = {True: "flagged", False: "not flagged", None: "no threshold"}[self.flagged]
            object.__setattr__(self, "call", call)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["token_rows"] = {k: list(v) for k, v in self.token_rows.items()}
        d["summary"] = dict(self.summary)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SideScore:
        flagged = d.get("flagged")
        if flagged is not None and not isinstance(flagged, bool):
            raise DataError(f"a side's flag must be true, false or null, not {flagged!r}")
        call = d.get("call") or ""  # saved before sides recorded it: from the flag
        if call and call not in CALLS:
            raise DataError(f"a side's call must be one of {', '.join(CALLS)}, not {call!r}")
        return cls(
            score=float(d["score"]),
            flagged=flagged,
            call=call,
            token_rows={k: tuple(map(float, v)) for k, v in (d.get("token_rows") or {}).items()},
            summary={k: float(v) for k, v in (d.get("summary") or {}).items()},
            token_scores=tuple(d["token_scores"]) if d.get("token_scores") is not None else None,
            token_offsets=(
                tuple(tuple(o) for o in d["token_offsets"])
                if d.get("token_offsets") is not None
                else None
            ),
        )


def detector_views(
    detector: Any, features: Any
) -> tuple[dict[str, tuple[float, ...]], dict[str, float]]:
    """What else a detector's features show about the answer, beyond its scores:
    ``(token rows, summary values)``.

    - ``spad``: the mean of each of the seven sources (and P_final) over the answer tokens;
    - ``redeep_token``: per token, the mean ECS of the heads the detector selected.
    """
    rows: dict[str, tuple[float, ...]] = {}
    summary: dict[str, float] = {}
    if features.tokens is None or not features.tokens.shape[0]:
        return rows, summary
    if "probability-sources" in detector.explained_on:
        means = features.tokens.mean(0)
        summary = {n: float(v) for n, v in zip(features.token_names, means, strict=True)}
    sel = getattr(detector, "selection_", None)
    if "head-tokens" in detector.explained_on and sel is not None and sel.heads:
        ecs = features.tokens[:, list(sel.heads)].mean(1)
        rows["ECS of the selected heads"] = tuple(map(float, ecs))
    return rows, summary


_NO_ROWS = SideScore(score=0.0, flagged=None)


def score_one(
    model: LoadedModel,
    detectors: Sequence[Detector],
    example: RAGExample,
    *,
    sae_features: Sequence[int] | None = (),
    n_sae: int = 2,
) -> dict[str, SideScore]:
    """Every detector's :class:`SideScore` of ``example`` (one shared trace), with its
    :func:`detector_views`, each verdict calibrated for the example's dataset
    (:func:`core.learning.contract.for_dataset`); for ``raglens``, the activation per token of ``sae_features``
    (``None``: the ``n_sae`` features of :func:`top_sae_features` on this example; the
    rows are named ``SAE F<k>``)."""
    return _side(model, detectors, example, sae_features=sae_features, n_sae=n_sae)[0]


def _side(
    model: LoadedModel,
    detectors: Sequence[Detector],
    example: RAGExample,
    *,
    sae_features: Sequence[int] | None = (),
    n_sae: int = 2,
) -> tuple[dict[str, SideScore], dict[str, Features]]:
    """:func:`score_one`'s scores and the features they were computed from."""
    feats = run_example(model, example, list(detectors))
    out = {}
    for d in detectors:
        v = judge_features(d, feats[d.name], example.provenance.dataset)
        rows, summary = detector_views(d, feats[d.name])
        offsets = v.token_offsets if v.token_offsets is not None else feats[d.name].token_offsets
        if isinstance(d, RaglensDetector) and (sae_features is None or len(sae_features) > 0):
            got = d.explain_answer(model, example)
            offsets = got.token_offsets  # its rows are per answer token, its score is not
            chosen = top_sae_features(got, n_sae) if sae_features is None else sae_features
            for k in chosen:
                rows[f"SAE F{k}"] = tuple(map(float, got.activations_of(k)))
        out[d.name] = SideScore(
            token_rows=rows,
            summary=summary,
            score=float(v.score),
            flagged=v.hallucinated,
            call=v.call,
            token_scores=None if v.token_scores is None else tuple(map(float, v.token_scores)),
            token_offsets=(
                None if offsets is None else tuple((int(a), int(b)) for a, b in np.asarray(offsets))
            ),
        )
    return out, feats


@dataclass(frozen=True, kw_only=True)
class Counterfactual:
    """An original answer, its edited context, and every detector's scores on both.

    Attributes:
        name: What the user called it.
        model: :attr:`~core.engine.model.ModelInfo.key` of the analysing model.
        original: The original example (on the template, see the module docstring).
        edited: The edited example.
        answer_mode: ``fixed`` (same answer) or ``regenerate``.
        original_scores: Detector name -> scores of the original.
        edited_scores: Detector name -> scores of the edited version.
        created_at: ISO time.
        id: Row id once saved.
        set_id: :attr:`core.pipeline.sets.DetectorSet.set_id` of the set whose detectors
            scored both sides (empty: a session saved before sessions recorded it). A
            page compares it with the set that judges the original now.
    """

    name: str
    model: str
    original: RAGExample
    edited: RAGExample
    answer_mode: AnswerMode
    original_scores: Mapping[str, SideScore] = field(default_factory=dict)
    edited_scores: Mapping[str, SideScore] = field(default_factory=dict)
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    id: int | None = None
    set_id: str = ""

    def __post_init__(self) -> None:
        if self.answer_mode not in ANSWER_MODES:
            raise DataError(f"answer_mode must be one of {ANSWER_MODES}, got {self.answer_mode!r}")
        if not self.name.strip():
            raise DataError("a counterfactual needs a name", field="name")

    @property
    def changes(self) -> list[ContextChange]:
        return context_diff(self.original.passages, self.edited.passages)

    def flag_counts(self) -> tuple[int, int, int]:
        """``(flag the original, flag the edited version, detectors counted)``: the
        detectors scored on both sides, less those that make no call on either (no signal,
        no threshold: :attr:`SideScore.call`)."""
        both = [
            (o, self.edited_scores[n])
            for n, o in self.original_scores.items()
            if n in self.edited_scores
        ]
        counted = [(o, e) for o, e in both if o.flagged is not None and e.flagged is not None]
        return (
            sum(bool(o.flagged) for o, _ in counted),
            sum(bool(e.flagged) for _, e in counted),
            len(counted),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "model": self.model,
            "answer_mode": self.answer_mode,
            "created_at": self.created_at,
            "original": self.original.to_dict(),
            "edited": self.edited.to_dict(),
            "changes": [dataclasses.asdict(c) for c in self.changes],
            "original_scores": {k: v.to_dict() for k, v in self.original_scores.items()},
            "edited_scores": {k: v.to_dict() for k, v in self.edited_scores.items()},
            "set_id": self.set_id,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=1)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, id: int | None = None) -> Counterfactual:  # noqa: A002
        if d.get("format") != FORMAT:
            raise DataError(
                f"counterfactual format {d.get('format')!r} is not {FORMAT}; save it again"
            )
        try:
            return cls(
                name=str(d["name"]),
                model=str(d["model"]),
                original=RAGExample.from_dict(d["original"]),
                edited=RAGExample.from_dict(d["edited"]),
                answer_mode=d["answer_mode"],
                original_scores={
                    k: SideScore.from_dict(v) for k, v in d["original_scores"].items()
                },
                edited_scores={k: SideScore.from_dict(v) for k, v in d["edited_scores"].items()},
                created_at=str(d["created_at"]),
                id=id,
                set_id=_set_id(d.get("set_id", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"malformed counterfactual ({brief(e)})") from e


def _set_id(value: object) -> str:
    """A saved session's set id, checked (one short printable line)."""
    if not isinstance(value, str) or len(value) > 300 or not value.isprintable():
        raise DataError("a counterfactual's set_id must be one short line of text")
    return value


def load_session(store: Store, cf_id: int) -> Counterfactual:
    """The session saved as ``cf_id`` (:meth:`core.storage.Store.save_counterfactual`).

    Raises:
        DataError: No such id, or its JSON is not a session.
    """
    return Counterfactual.from_dict(store.load_counterfactual(cf_id), id=cf_id)


@dataclass(frozen=True)
class ScoredOriginal:
    """The original side of :func:`score_pair`, scored ahead (:func:`score_original`).

    Attributes:
        model: ``ModelInfo.key`` of the model that scored it.
        example: The original as scored (on its template).
        scores: Each detector's :class:`SideScore`.
        seconds: How long the scoring took here.
        features: The features the scores were computed from (:func:`judge_pair` judges
            the side from them).
    """

    model: str
    example: RAGExample
    scores: dict[str, SideScore]
    seconds: float
    features: Mapping[str, Features] = field(default_factory=dict)


def score_original(
    model: LoadedModel, detectors: Sequence[Detector], original: RAGExample, *, n_sae: int = 2
) -> ScoredOriginal:
    """The original side of :func:`score_pair`, scored and timed as the pair scores it."""
    base = on_template(original)
    t0 = time.perf_counter()
    scores, feats = _side(model, detectors, base, sae_features=None, n_sae=n_sae)
    return ScoredOriginal(model.info.key, base, scores, time.perf_counter() - t0, feats)


def score_pair(
    model: LoadedModel,
    detectors: Sequence[Detector],
    original: RAGExample,
    edited: RAGExample,
    *,
    name: str,
    answer_mode: AnswerMode = "fixed",
    n_sae: int = 2,
    scored: ScoredOriginal | None = None,
) -> Counterfactual:
    """Score the original and the edited version with every detector (RAGLens: also the
    activations of the ``n_sae`` SAE features pushing the original hardest to
    "hallucinated", on both versions).

    ``scored``: the original's side scored ahead by ``detectors`` (:func:`score_original`,
    e.g. to time it); used when it is this original on this model, else scored again.
    """
    pair = _pair(model, detectors, original, edited, n_sae=n_sae, scored=scored)
    return pair.counterfactual(name=name, model=model.info.key, answer_mode=answer_mode)


@dataclass(frozen=True, kw_only=True, eq=False)
class JudgedPair:
    """:func:`judge_pair`'s result: the comparison and the set's judgement of each side.

    Attributes:
        counterfactual: The comparison (what is saved and exported).
        original: The set's judgement of the original (on its template).
        edited: The set's judgement of the edited version.
    """

    counterfactual: Counterfactual
    original: Judgement
    edited: Judgement


def judge_pair(
    model: LoadedModel,
    dset: DetectorSet,
    original: RAGExample,
    edited: RAGExample,
    *,
    name: str,
    answer_mode: AnswerMode = "fixed",
    n_sae: int = 2,
    scored: ScoredOriginal | None = None,
) -> JudgedPair:
    """:func:`score_pair` with the detectors of the set that judges the original
    (``dset.for_example``), and that set's judgement of each version
    (:func:`core.pipeline.judge.judgement_from`) from the same traces: one pass per
    version, whose verdicts are the ones every page shows.

    ``scored``: the original's side scored ahead by those detectors (:func:`score_original`).
    """
    base = on_template(original)
    by = dset.for_example(base)
    pair = _pair(model, by.fitted, original, edited, n_sae=n_sae, scored=scored)
    o_feats, o_s = pair.original
    e_feats, e_s = pair.edited
    return JudgedPair(
        counterfactual=pair.counterfactual(
            name=name, model=model.info.key, answer_mode=answer_mode, set_id=by.set_id
        ),
        original=judgement_from(base, dset, o_feats, by=by, seconds=o_s),
        edited=judgement_from(edited, dset, e_feats, by=by, seconds=e_s),
    )


@dataclass(frozen=True)
class _Pair:
    """Both sides scored: each side's scores, and its features and seconds."""

    base: RAGExample
    edited_example: RAGExample
    before: dict[str, SideScore]
    after: dict[str, SideScore]
    original: tuple[Mapping[str, Features], float]
    edited: tuple[Mapping[str, Features], float]

    def counterfactual(
        self, *, name: str, model: str, answer_mode: AnswerMode, set_id: str = ""
    ) -> Counterfactual:
        return Counterfactual(
            name=name,
            model=model,
            original=self.base,
            edited=self.edited_example,
            answer_mode=answer_mode,
            original_scores=self.before,
            edited_scores=self.after,
            set_id=set_id,
        )


def _pair(
    model: LoadedModel,
    detectors: Sequence[Detector],
    original: RAGExample,
    edited: RAGExample,
    *,
    n_sae: int,
    scored: ScoredOriginal | None,
) -> _Pair:
    base = on_template(original)
    if (
        scored is None
        or scored.model != model.info.key
        or scored.example != base
        or not {d.name for d in detectors} <= set(scored.features)
    ):  # not this original, on this model, with these detectors' features: score it
        scored = score_original(model, detectors, original, n_sae=n_sae)
    # The edited side reads the SAE features chosen on the original.
    sae = [
        int(r[len("SAE F") :]) for r in scored.scores.get(RaglensDetector.name, _NO_ROWS).token_rows
    ]
    t0 = time.perf_counter()
    after, feats = _side(model, detectors, edited, sae_features=sae)
    return _Pair(
        base=base,
        edited_example=edited,
        before=scored.scores,
        after=after,
        original=(scored.features, scored.seconds),
        edited=(feats, time.perf_counter() - t0),
    )


def warm_scoring(model: LoadedModel, detectors: Sequence[Detector]) -> None:
    """Score :data:`core.pipeline.extract.WARM_UP` as :func:`score_original` scores a side
    (nothing kept): what loads on first use (RAGLens's SAE, spaCy, a first pass's
    kernels) is loaded before a side is timed, so its pace is the warm one."""
    score_one(model, detectors, on_template(WARM_UP), sae_features=None)


def top_sae_features(answer: Any, n: int) -> list[int]:
    """The ``n`` RAGLens features pushing ``answer`` hardest to "hallucinated"; when none
    does, the ones with the largest contribution either way."""

    return (
        answer.top_positive(n)
        or sorted(
            answer.features,
            key=lambda k: -abs(answer.verdict.explanation.get(feature_name(k), 0.0)),
        )[:n]
    )


def regenerate(
    model: LoadedModel, example: RAGExample, passages: Sequence[str], **gen: Any
) -> RAGExample:
    """The edited example with an answer the model writes under the edited context (greedy)."""

    draft = edit_example(example, passages)
    out = generate(model, draft, GenerationConfig(**gen) if gen else None)
    if not out.text.strip():
        raise DataError("the model wrote an empty answer under the edited context; edit again")
    return edit_example(example, passages, answer=out.text)
