"""``ensemble``: the landed detectors stacked by a calibrated logistic regression.

Members are ordinary detectors (default: every detector of ragscope's own, see
:meth:`~core.detectors.registry.Registry.stacked`, each class's
``stacked_by_default``). The ensemble reads no activations itself: its features
are the members' own features, bundled (:attr:`core.learning.contract.Features.members`);
the extraction engine computes and caches each member's features under the
member's own key, so nothing is traced or stored twice
(:meth:`EnsembleDetector.member_detectors`).

Fitting keeps the stacker honest: it learns only from member scores of answers the
scoring members never saw. With ``stacking="crossfit"`` (the default; stacked
generalisation as in Wolpert 1992 and scikit-learn's ``StackingClassifier``) the
members are fitted :data:`STACK_FOLDS` times, each without one source-grouped fold of
the training answers and with what the members kept chose fixed
(:meth:`~core.learning.contract.Detector.pinned`: InterpDetect's classifier, SPAD's booster
hyper-parameters), and score that fold; the stacker learns from all these
out-of-fold rows (plus the validation split's rows, scored by the members refitted on
all training answers, when a validation split is given). With ``stacking="split"``
the members are fitted once, on the training split, and the stacker on the
validation split when one is given (as ``ragscope train`` and ``ragscope evaluate``
do), else on a held-out quarter of the training sources: fewer rows, a noisier
stacker.

- Response level: one feature per member, the logit of its response score (with
  ``answer_token_max``, also, per member that scores tokens, the highest of its token
  logits averaged over windows of each width: where its most suspect stretch of the
  answer sits); an (unweighted, so calibrated) L2 logistic regression whose strength
  is chosen by cross-validated log loss.
- Token level, when ``tokens`` is on: one feature per member that scores tokens
  on the same token grid (the answer's tokens), the logit of its token score (with
  ``token_windows``, also its mean over windows of neighbouring tokens; with
  ``token_context``, the answer's stacked logit and its products); a second logistic
  regression on the gold token labels of the stacking split.

- Per dataset, with ``dataset_stackers``: a training dataset may also get a response
  stacker of its own, fitted on that dataset's stacking rows alone with its own
  ``answer_token_max`` widths (the members and the token stacker stay shared). Its raw
  score rides in :attr:`~core.learning.contract.Verdict.raw_by_dataset`; the dataset's own
  calibration is fitted on it, and :func:`core.learning.contract.for_dataset` judges an answer
  of that dataset (or another split of it) by it. Answers of any other dataset are read
  by the pooled stacker as before.
- Per dataset, from reviews (:mod:`core.evaluation.adapt`): an adaptation may add a
  *reviewed* stacker of a dataset's own (:meth:`EnsembleDetector.with_review_stacker`),
  fitted on that dataset's reviewed answers over the members' logits and the pooled
  stacker's logit (:meth:`EnsembleDetector.review_row`); it is routed like the ones above.

A verdict's explanation is each member's contribution to the response logit;
:meth:`EnsembleDetector.member_verdicts` gives the members' own verdicts.
The artifact folder holds the stacker and each member's own artifact
(``members/<name>/``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np

from core.base.errors import DataError, ModelError
from core.base.examples import RAGExample, source_key
from core.detectors.common import FittedDetector, Writers
from core.detectors.registry import MEMBERS
from core.engine.model import ModelInfo
from core.engine.trace import Needs
from core.learning import learners
from core.learning.calibration import (
    MAX_DATASET_CALIBRATIONS,
    MAX_DATASET_NAME,
    MIN_DATASET_ANSWERS,
    MIN_DATASET_CLASS,
    enough_for_own,
)
from core.learning.contract import (
    Detector,
    DetectorConfig,
    ExplanationKind,
    Features,
    Run,
    Verdict,
    check_fit_inputs,
    require_fitted,
    thresholded_verdict,
)
from core.learning.labels import response_labels, span_labels
from core.learning.learners import LogisticCalibrator
from core.signals.smoothing import check_window, window_mean, window_peak

C_GRID: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)
"""Regularisation strengths the stacker chooses among (by cross-validated log loss)."""
STACK_FRACTION = 0.25
"""Share of the training sources held out for the stacker when no validation split is given."""
STACK_FOLDS = 5
"""Default folds of the members' out-of-fold scores that ``stacking="crossfit"`` stacks."""
STACKINGS = ("crossfit", "split")
POOLED_INPUT = "pooled stacker"
"""The name of a reviewed stacker's last input: the pooled stacker's logit."""
_EPS = 1e-4


def logit(p: np.ndarray) -> np.ndarray:
    """``log(p / (1 - p))`` with ``p`` clipped to ``[1e-4, 1 - 1e-4]``."""
    q = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    return np.log(q / (1.0 - q))


def choose_c(X: np.ndarray, y: np.ndarray, seed: int = 0) -> float:
    """The strength in :data:`C_GRID` with the best cross-validated log loss (the middle
    of the grid when the split is too small to cross-validate)."""
    return learners.choose_c(X, y, C_GRID, scoring="neg_log_loss", seed=seed)[0]


@dataclass(frozen=True, kw_only=True)
class EnsembleConfig(DetectorConfig):
    """Options of :class:`EnsembleDetector`.

    Attributes:
        members: The detectors stacked, by name.
        member_configs: Per member, config options (default: each member's defaults).
        tokens: Also stack the members' token scores (a token-level stacker).
        token_context: The token stacker also reads the answer's stacked logit and its
            product with each member's token logit, so a token's score can depend on
            how suspect its whole answer is (off: the token logits alone).
        token_windows: The token stacker also reads each member's token logits averaged
            over centred windows of these widths (odd, tokens;
            :func:`core.signals.smoothing.window_mean`), so a token's score can draw on its
            neighbours' (hallucinated spans run over many tokens). Empty: none.
        answer_token_max: The response stacker also reads, for each of these widths
            (odd, tokens; 1 is the raw logits) and each member that scored the tokens of
            every stacking answer, the maximum over the answer of that member's token
            logits averaged over centred windows of the width: an answer is as suspect
            as its most suspect stretch. An answer a member left without token scores
            reads the member's response logit there instead. Empty: none.
        dataset_stackers: Training dataset name -> the ``answer_token_max`` widths of a
            response stacker of that dataset's own, fitted on its stacking answers alone
            (a dataset with fewer than :data:`~core.learning.calibration.MIN_DATASET_ANSWERS`
            of them, or :data:`~core.learning.calibration.MIN_DATASET_CLASS` of a class, gets
            none; ``train_info_`` says so). Empty: the pooled stacker reads every answer.
        stacking: ``crossfit`` (stack the members' out-of-fold scores on all training
            answers) or ``split`` (stack scores on the validation split only); see the
            module docstring.
        stack_folds: Folds of ``crossfit`` stacking (each refits every member once).
        seed: Seed of the stacker's cross-validation, its folds and the held-out quarter.
    """

    FIT_ONLY: ClassVar[frozenset[str]] = frozenset(
        {
            "tokens",
            "token_context",
            "token_windows",
            "answer_token_max",
            "dataset_stackers",
            "seed",
            "stacking",
            "stack_folds",
        }
    )

    members: tuple[str, ...] = field(default_factory=MEMBERS.stacked)
    member_configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    tokens: bool = True
    token_context: bool = False
    token_windows: tuple[int, ...] = ()
    answer_token_max: tuple[int, ...] = ()
    dataset_stackers: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    stacking: str = "crossfit"
    stack_folds: int = STACK_FOLDS
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The options; ``dataset_stackers`` only when set (so the configs of artifacts
        saved before it existed keep their hash)."""
        d = super().to_dict()
        if not d["dataset_stackers"]:
            del d["dataset_stackers"]
        return d

    def __post_init__(self) -> None:
        if self.stacking not in STACKINGS:
            raise DataError(
                f"unknown stacking {self.stacking!r}; use one of {list(STACKINGS)}",
                field="stacking",
            )
        widths = _widths(self.token_windows, "token_windows", "[9, 25]")
        _widths(self.answer_token_max, "answer_token_max", "[1, 25]")
        object.__setattr__(self, "dataset_stackers", _dataset_stackers(self.dataset_stackers))
        if 1 in widths:
            raise DataError(
                f"token_windows must be widths above 1 (the raw logits are always read), "
                f"got {list(self.token_windows)}",
                field="token_windows",
            )
        if not 2 <= self.stack_folds <= 20:
            raise DataError("stack_folds must be between 2 and 20", field="stack_folds")
        if not self.members:
            raise DataError("the ensemble needs at least one member detector", field="members")
        if len(set(self.members)) != len(self.members):
            raise DataError(f"ensemble members repeat: {list(self.members)}", field="members")
        if "ensemble" in self.members:
            raise DataError("an ensemble cannot be its own member", field="members")
        unknown = sorted(set(self.member_configs) - set(self.members))
        if unknown:
            raise DataError(
                f"options given for detectors that are not members: {unknown}",
                field="member_configs",
            )


class EnsembleDetector(FittedDetector):
    """Stacked members (see the module docstring)."""

    name: ClassVar[str] = "ensemble"
    explanation_kind: ClassVar[ExplanationKind] = "contributions"
    stacked_by_default: ClassVar[bool] = False
    Config: ClassVar[type[EnsembleConfig]] = EnsembleConfig
    composite: ClassVar[bool] = True
    fitted_attr = "stacker_"

    @property
    def gives_token_scores(self) -> bool:  # type: ignore[override]  # a fitted token stacker decides
        """Whether its token stacker is fitted (it then scores every answer token)."""
        return bool(self.token_members_)

    def __init__(self, config: EnsembleConfig | None = None) -> None:
        self.config = config or EnsembleConfig()
        self.members_: dict[str, Detector] = {
            n: MEMBERS.make(n, **dict(self.config.member_configs.get(n, {})))
            for n in self.config.members
        }
        self.stacker_: LogisticCalibrator | None = None
        self.token_stacker_: LogisticCalibrator | None = None
        self.token_members_: tuple[str, ...] = ()
        self.answer_members_: tuple[str, ...] = ()
        self.dataset_stackers_: dict[str, DatasetStacker] = {}
        self.model_key_: str | None = None
        self.threshold_: float = 0.5
        self.train_info_: dict[str, Any] = {}
        # An instance attribute: whether any member reads the no-context pass.
        self.needs_bare = any(m.needs_bare for m in self.members_.values())

    # -- the contract --------------------------------------------------------------

    def unavailable(self, model: ModelInfo) -> str | None:
        """Why a member cannot read ``model`` (e.g. RAGLens without an SAE), or ``None``."""
        for n, m in self.members_.items():
            why = m.unavailable(model)
            if why is not None:
                return f"member {n}: {why}"
        return None

    def member_detectors(self) -> list[Detector]:
        """The members, whose features the extraction engine computes (and caches)."""
        return list(self.members_.values())

    def needs(self, model: ModelInfo) -> Needs | None:

        wanted = [n for n in (m.needs(model) for m in self.members_.values()) if n is not None]
        return Needs.union(wanted) if wanted else None

    def bare_needs(self, model: ModelInfo) -> Needs | None:

        asked = [m.bare_needs(model) for m in self.members_.values() if m.needs_bare]
        wanted = [n for n in asked if n is not None]
        return Needs.union(wanted) if wanted else None

    def features(self, run: Run) -> Features:
        """The members' features of this run, bundled (the extraction engine instead
        computes each member once, shared with the run's other detectors, and bundles)."""
        return self.bundle(
            run.example.id, run.model.key, {n: m.features(run) for n, m in self.members_.items()}
        )

    def bundle(self, example_id: str, model_key: str, members: Mapping[str, Features]) -> Features:
        """The ensemble's features of one example: its members' features, by name."""
        missing = [n for n in self.config.members if n not in members]
        if missing:
            raise DataError(f"ensemble: no features of members {missing} for {example_id!r}")
        return Features(
            detector=self.name,
            example_id=example_id,
            model=model_key,
            names=(),
            response=np.zeros(0, np.float32),
            members={n: members[n] for n in self.config.members},
        )

    # -- learning ------------------------------------------------------------------

    def _split(
        self, features: Sequence[Features], examples: Sequence[RAGExample]
    ) -> tuple[list[int], list[int]]:

        keys = sorted({source_key(e) for e in examples})
        rng = np.random.default_rng(self.config.seed)
        held = set(rng.permutation(keys)[: max(1, round(STACK_FRACTION * len(keys)))].tolist())
        fit = [i for i, e in enumerate(examples) if source_key(e) not in held]
        stack = [i for i, e in enumerate(examples) if source_key(e) in held]
        if not fit or not stack:
            raise DataError(
                f"the ensemble needs a validation split or more training sources (got "
                f"{len(keys)}): its members and its stacker must learn from different examples"
            )
        return fit, stack

    def fit(
        self,
        features: Sequence[Features],
        examples: Sequence[RAGExample],
        *,
        validation: tuple[Sequence[Features], Sequence[RAGExample]] | None = None,
    ) -> Self:
        """Fit the members and the stacker (see the module docstring)."""

        model_key = check_fit_inputs(self.name, features, examples)
        has_val = validation is not None and bool(validation[0])
        if self.config.stacking == "crossfit":
            tr_f, tr_ex = list(features), list(examples)
            self._fit_members(tr_f, tr_ex)
            st_ex, verdicts = self._out_of_fold(tr_f, tr_ex)
            if validation is not None and has_val:
                st_ex += list(validation[1])
                verdicts += [self._verdicts(f) for f in validation[0]]
        else:
            if validation is None or not has_val:
                fit_i, stack_i = self._split(features, examples)
                tr_f, tr_ex = [features[i] for i in fit_i], [examples[i] for i in fit_i]
                st_f, st_ex = [features[i] for i in stack_i], [examples[i] for i in stack_i]
            else:
                tr_f, tr_ex = list(features), list(examples)
                st_f, st_ex = list(validation[0]), list(validation[1])
            self._fit_members(tr_f, tr_ex)
            verdicts = [self._verdicts(f) for f in st_f]
        y = response_labels(st_ex)
        if len(set(y.tolist())) < 2:
            raise DataError(
                "the ensemble's stacking split needs faithful and hallucinated examples; "
                "use a larger or more balanced dataset"
            )
        self.answer_members_ = self._answer_members(verdicts, self.config.answer_token_max)
        X = np.stack([self._row(v) for v in verdicts])
        c = choose_c(X, y, self.config.seed)
        self.stacker_ = LogisticCalibrator(C=c, class_weight=None).fit(X, y)
        self.dataset_stackers_, own_info = self._fit_dataset_stackers(verdicts, st_ex)
        self.token_stacker_ = None
        self.token_members_ = ()
        if self.config.tokens:
            self._fit_tokens(verdicts, st_ex)
        self.model_key_ = model_key
        self.train_info_ = {
            "n_train": len(tr_f),
            "n_stack": len(st_ex),
            "stacking": self.config.stacking,
            "n_hallucinated": int(response_labels(tr_ex).sum()),
            "C": c,
            "token_members": list(self.token_members_),
            "answer_token_members": list(self.answer_members_),
            **({"dataset_stackers": own_info} if self.config.dataset_stackers else {}),
        }
        return self

    def _answer_members(
        self, verdicts: Sequence[Mapping[str, Verdict]], widths: Sequence[int]
    ) -> tuple[str, ...]:
        """The members whose token peaks a stacker with ``widths`` reads: those that
        scored the tokens of every stacking answer (none without widths)."""
        if not widths:
            return ()
        return tuple(n for n in self.config.members if all(_has_tokens(v[n]) for v in verdicts))

    def _fit_dataset_stackers(
        self, verdicts: Sequence[Mapping[str, Verdict]], st_ex: Sequence[RAGExample]
    ) -> tuple[dict[str, DatasetStacker], dict[str, dict[str, Any]]]:
        """Each ``dataset_stackers`` dataset's own response stacker, fitted on its
        stacking rows alone (see the module docstring), and what each fit used (or why
        a dataset got none)."""
        out: dict[str, DatasetStacker] = {}
        info: dict[str, dict[str, Any]] = {}
        names = [e.provenance.dataset for e in st_ex]
        for name, widths in self.config.dataset_stackers.items():
            rows = [i for i, d in enumerate(names) if d == name]
            y = response_labels([st_ex[i] for i in rows]) if rows else np.zeros(0)
            n_pos = int(y.sum())
            if not enough_for_own(y):
                info[name] = {
                    "n": len(rows),
                    "n_positive": n_pos,
                    "skipped": (
                        f"needs {MIN_DATASET_ANSWERS} stacking answers with "
                        f"{MIN_DATASET_CLASS} of each class"
                    ),
                }
                continue
            vs = [verdicts[i] for i in rows]
            members = self._answer_members(vs, widths)
            X = np.stack([self._row(v, widths, members) for v in vs])
            c = choose_c(X, y, self.config.seed)
            out[name] = DatasetStacker(
                widths=widths,
                answer_members=members,
                stacker=LogisticCalibrator(C=c, class_weight=None).fit(X, y),
            )
            info[name] = {"n": len(rows), "n_positive": n_pos, "C": c}
        return out, info

    def _fit_members(
        self,
        features: Sequence[Features],
        examples: Sequence[RAGExample],
        members: Mapping[str, Detector] | None = None,
    ) -> None:
        for n, det in (self.members_ if members is None else members).items():
            det.fit([self._member(f, n) for f in features], examples)

    def _out_of_fold(
        self, features: Sequence[Features], examples: Sequence[RAGExample]
    ) -> tuple[list[RAGExample], list[dict[str, Verdict]]]:
        """Every training answer that falls in a usable fold, with its members' verdicts
        from members fitted without its fold. Those members take what the fitted members
        chose (:meth:`~core.learning.contract.Detector.pinned`: a classifier, hyper-parameters),
        so the stacker learns from scores of the same form as the ones it will read."""
        pinned = {
            n: MEMBERS.make(
                n, **{**dict(self.config.member_configs.get(n, {})), **dict(det.pinned())}
            )
            for n, det in self.members_.items()
        }
        y = response_labels(examples)
        groups = np.asarray([source_key(e) for e in examples])
        folds = learners.grouped_folds(y, groups, self.config.stack_folds, self.config.seed)
        if not folds:
            raise DataError(
                f"the ensemble's cross-fitted stacking needs at least two sources with "
                f"faithful and hallucinated answers (got {len(set(groups.tolist()))} sources); "
                "use more data or `--set ensemble.stacking=split`"
            )
        out_ex: list[RAGExample] = []
        out_v: list[dict[str, Verdict]] = []
        for train, test in folds:
            self._fit_members([features[i] for i in train], [examples[i] for i in train], pinned)
            out_ex += [examples[i] for i in test]
            out_v += [self._verdicts(features[i], pinned) for i in test]
        return out_ex, out_v

    def _fit_tokens(
        self,
        verdicts: Sequence[Mapping[str, Verdict]],
        st_ex: Sequence[RAGExample],
    ) -> None:
        candidates = [n for n in self.config.members if verdicts and _has_tokens(verdicts[0][n])]
        grid = [_grid(v, candidates) for v in verdicts]
        members = [
            n
            for n in candidates
            if all(
                g is not None and _has_tokens(v[n]) and np.array_equal(_offsets(v[n]), g)
                for v, g in zip(verdicts, grid, strict=True)
            )
        ]
        if not members:
            return
        X, y = [], []
        for v, g, ex in zip(verdicts, grid, st_ex, strict=True):
            lab = span_labels(g, ex)
            if lab is None and ex.label is False and g is not None:
                lab = np.zeros(g.shape[0], np.int8)  # a faithful answer without spans
            if lab is None:
                continue
            X.append(self._token_rows(v, members))
            y.append(lab)
        if not y or len(set(np.concatenate(y).tolist())) < 2:
            return
        self.token_stacker_ = LogisticCalibrator(class_weight=None).fit(
            np.concatenate(X), np.concatenate(y)
        )
        self.token_members_ = tuple(members)

    # -- prediction ----------------------------------------------------------------

    def _member(self, features: Features, name: str) -> Features:
        if features.detector != self.name or features.members is None:
            raise DataError(
                f"ensemble: expected ensemble features (the members' features bundled), got "
                f"{features.detector!r} features for {features.example_id!r}"
            )
        if name not in features.members:
            raise DataError(
                f"ensemble: the features of {features.example_id!r} lack member {name!r}"
            )
        return features.members[name]

    def _verdicts(
        self, features: Features, members: Mapping[str, Detector] | None = None
    ) -> dict[str, Verdict]:
        return {
            n: det.predict(self._member(features, n))
            for n, det in (self.members_ if members is None else members).items()
        }

    def _row(
        self,
        verdicts: Mapping[str, Verdict],
        widths: Sequence[int] | None = None,
        answer_members: Sequence[str] | None = None,
    ) -> np.ndarray:
        """The response stacker's inputs (:meth:`input_names`): each member's response
        logit, then per width of ``answer_token_max`` (or ``widths``, a dataset
        stacker's) each answer member's windowed token-logit maximum."""
        widths = self.config.answer_token_max if widths is None else widths
        members = self.answer_members_ if answer_members is None else answer_members
        row = logit(np.asarray([verdicts[n].score for n in self.config.members]))
        if not members or not widths:
            return row
        peaks = [_token_peak(verdicts[n], w) for w in widths for n in members]
        return np.concatenate([row, np.asarray(peaks, dtype=np.float64)])

    def input_names(self, dataset: str | None = None) -> list[str]:
        """Names of the response stacker's inputs (of ``dataset``'s own stacker when
        given): the members, then ``<member> max@<width>`` per width of
        ``answer_token_max`` and answer member."""
        own = self.dataset_stackers_.get(dataset) if dataset is not None else None
        widths = own.widths if own is not None else self.config.answer_token_max
        members = own.answer_members if own is not None else self.answer_members_
        pooled = [POOLED_INPUT] if own is not None and own.reviewed else []
        return (
            list(self.config.members) + [f"{n} max@{w}" for w in widths for n in members] + pooled
        )

    def _pooled_logit(self, verdicts: Mapping[str, Verdict]) -> np.ndarray:
        """``[1]`` the pooled stacker's logit of these member verdicts."""
        assert self.stacker_ is not None
        return logit(self.stacker_.predict_proba(self._row(verdicts)[None, :]))

    def _own_row(self, verdicts: Mapping[str, Verdict], own: DatasetStacker) -> np.ndarray:
        """A dataset stacker's inputs: :meth:`_row` with its widths and answer members,
        then, for a reviewed stacker, the pooled stacker's logit."""
        row = self._row(verdicts, own.widths, own.answer_members)
        return np.concatenate([row, self._pooled_logit(verdicts)]) if own.reviewed else row

    def review_row(self, features: Features) -> np.ndarray:
        """The inputs of a reviewed stacker (:meth:`with_review_stacker`) for one answer:
        each member's response logit, then the pooled stacker's logit."""
        require_fitted(self, "stacker_", self.name)
        verdicts = self._verdicts(features)
        return np.concatenate([self._row(verdicts, (), ()), self._pooled_logit(verdicts)])

    def with_review_stacker(
        self, dataset: str, stacker: LogisticCalibrator | None
    ) -> EnsembleDetector:
        """A copy whose stacker of ``dataset``'s own is ``stacker`` (fitted on
        :meth:`review_row` rows of its reviewed answers), or, with ``None``, without the
        reviewed stacker it had for ``dataset`` (a stacker trained on the dataset stays).

        Raises:
            DataError: ``stacker`` does not read :meth:`review_row`'s inputs, or the
                dataset has a trained stacker (a training dataset needs no review one).
        """
        require_fitted(self, "stacker_", self.name)
        had = self.dataset_stackers_.get(dataset)
        if had is not None and not had.reviewed:
            if stacker is None:
                return self
            raise DataError(
                f"the ensemble has a stacker of {dataset!r} trained on it; a reviewed one "
                "would replace it"
            )
        out = copy.copy(self)
        own = dict(self.dataset_stackers_)
        widths = dict(self.config.dataset_stackers)
        own.pop(dataset, None)
        widths.pop(dataset, None)
        if stacker is not None:
            n_inputs = len(self.config.members) + 1
            if stacker.coef_ is None or stacker.coef_.shape != (n_inputs,):
                raise DataError(
                    f"a reviewed stacker of {dataset!r} must read the {n_inputs} inputs of "
                    "review_row (the members' logits and the pooled stacker's)"
                )
            own[dataset] = DatasetStacker(
                widths=(), answer_members=(), stacker=stacker, reviewed=True
            )
            widths[dataset] = ()
        out.config = replace(self.config, dataset_stackers=widths)
        out.dataset_stackers_ = own
        return out

    def _token_rows(
        self,
        verdicts: Mapping[str, Verdict],
        members: Sequence[str],
        row: np.ndarray | None = None,
    ) -> np.ndarray:
        """``[T, k]`` the members' token logits, then for each width of ``token_windows``
        their window means (``k`` columns each); with ``token_context`` also the
        answer's stacked logit ``a`` (of ``row``, the answer's :meth:`_row` when the
        caller has it) and each raw token logit times ``a`` (:func:`token_inputs`
        columns in all)."""
        tok = np.stack([logit(_scores(verdicts[n])) for n in members], axis=1)
        cols = [tok] + [
            np.stack([window_mean(tok[:, j], w) for j in range(tok.shape[1])], axis=1)
            for w in self.config.token_windows
        ]
        if self.config.token_context:
            assert self.stacker_ is not None
            r = self._row(verdicts) if row is None else row
            a = float(self.stacker_.decision_function(r[None, :])[0])
            cols += [np.full((tok.shape[0], 1), a), tok * a]
        return np.concatenate(cols, axis=1)

    def member_verdicts(self, features: Features) -> dict[str, Verdict]:
        """Each member's own verdict on these features."""
        require_fitted(self, "stacker_", self.name)
        return self._verdicts(features)

    def predict(self, features: Features) -> Verdict:
        require_fitted(self, "stacker_", self.name)
        assert self.stacker_ is not None
        if features.model != self.model_key_:
            raise ModelError(
                f"ensemble was trained on {self.model_key_!r} but these features come from "
                f"{features.model!r}; retrain or load the matching model"
            )
        verdicts = self._verdicts(features)
        row = self._row(verdicts)
        score = float(self.stacker_.predict_proba(row[None, :])[0])
        contrib = self.stacker_.contributions(row)
        token_scores = offsets = None
        if self.token_stacker_ is not None:
            offsets = _grid(verdicts, self.token_members_)
            usable = offsets is not None and all(
                _has_tokens(verdicts[n]) and np.array_equal(_offsets(verdicts[n]), offsets)
                for n in self.token_members_
            )
            if usable:
                X = self._token_rows(verdicts, self.token_members_, row)
                token_scores = self.token_stacker_.predict_proba(X).astype(np.float32)
            else:
                offsets = None
        own = {
            name: float(
                np.clip(s.stacker.predict_proba(self._own_row(verdicts, s)[None, :])[0], 0, 1)
            )
            for name, s in self.dataset_stackers_.items()
        }
        return thresholded_verdict(
            self,
            features,
            score,
            token_scores=token_scores,
            token_offsets=offsets,
            explanation={n: float(c) for n, c in zip(self.input_names(), contrib, strict=True)},
            raw_by_dataset=own,
        )

    def importances(self) -> list[tuple[str, float]]:
        """The response stacker's inputs (:meth:`input_names`) by the size of their weight
        (on standardised inputs), largest first."""
        require_fitted(self, "stacker_", self.name)
        assert self.stacker_ is not None and self.stacker_.coef_ is not None
        pairs = list(zip(self.input_names(), self.stacker_.coef_.tolist(), strict=True))
        return sorted(pairs, key=lambda p: -abs(p[1]))

    # -- artifacts -----------------------------------------------------------------

    def save(self, folder: str | Path, *, extra: Mapping[str, Any] | None = None) -> Path:
        """Each member's artifact (``members/<name>``), then the ensemble's own."""
        require_fitted(self, self.fitted_attr, self.name)
        for n, det in self.members_.items():
            det.save(Path(folder) / "members" / n)
        return super().save(folder, extra=extra)

    def fitted_state(self) -> tuple[dict[str, Any], Writers]:
        assert self.stacker_ is not None
        return {
            "response": self.stacker_.to_json(),
            "token": self.token_stacker_.to_json() if self.token_stacker_ else None,
            "token_members": list(self.token_members_),
            "answer_token_members": list(self.answer_members_),
            "dataset_stackers": {
                name: {
                    "response": st.stacker.to_json(),
                    "answer_token_members": list(st.answer_members),
                    **({"reviewed": True} if st.reviewed else {}),
                }
                for name, st in self.dataset_stackers_.items()
            },
        }, {}

    def restore_state(self, folder: Path, w: Mapping[str, Any], cfg: Mapping[str, Any]) -> None:
        self.stacker_ = LogisticCalibrator.from_json(w["response"])
        self.token_stacker_ = LogisticCalibrator.from_json(w["token"]) if w.get("token") else None
        members = self.config.members
        self.token_members_ = _member_names(w.get("token_members"), members, folder)
        self.answer_members_ = _member_names(w.get("answer_token_members"), members, folder)
        self.dataset_stackers_ = _read_dataset_stackers(
            w.get("dataset_stackers", {}), self.config, folder
        )

    def fitted_models(self) -> Mapping[str, tuple[Any, int | None]]:
        """Every fitted part: the pooled stacker, the token stacker and each dataset's
        own (reviewed ones too), beside the calibrations; their finite values and scales
        are checked here, the inputs each must read by :meth:`after_load` (whose message
        names the config options that set them)."""
        parts = {
            k: v
            for k, v in super().fitted_models().items()
            if k not in ("dataset_stackers_", "members_")
        }
        for name, own in self.dataset_stackers_.items():
            parts[f"dataset_stackers_[{name!r}]"] = (own.stacker, None)
        return parts

    def after_load(self, folder: Path, w: Mapping[str, Any]) -> None:
        """The stackers read as many inputs as the config gives; then the members."""
        assert self.stacker_ is not None
        for name, stacker in [(None, self.stacker_)] + [
            (d, s.stacker) for d, s in self.dataset_stackers_.items()
        ]:
            n_inputs = len(self.input_names(name))
            if stacker.coef_ is None or stacker.coef_.shape != (n_inputs,):
                widths = (
                    self.config.dataset_stackers[name]
                    if name is not None
                    else self.config.answer_token_max
                )
                whose = f"{name!r}'s stacker" if name is not None else "stacker"
                raise DataError(
                    f"the ensemble's {whose} does not read the {n_inputs} inputs its "
                    f"{len(self.config.members)} members and answer_token_max="
                    f"{list(widths)} give; retrain it with "
                    "`ragscope train --detectors ensemble`",
                    source=str(folder),
                )
        if self.token_stacker_ is not None:
            k = len(self.token_members_)
            want = token_inputs(self.config, k)
            coef = self.token_stacker_.coef_
            if not k or coef is None or coef.shape != (want,):
                raise DataError(
                    f"the ensemble's token stacker does not read the {want} inputs its "
                    f"{k} token members, token_windows={list(self.config.token_windows)} and "
                    f"token_context={self.config.token_context} give; "
                    "retrain it with `ragscope train --detectors ensemble`",
                    source=str(folder),
                )
        for n in self.config.members:
            self.members_[n] = MEMBERS.get(n).load(
                folder / "members" / n, model_key=self.model_key_
            )


@dataclass(frozen=True, kw_only=True)
class DatasetStacker:
    """A dataset's own response stacker (``EnsembleConfig.dataset_stackers``).

    Attributes:
        widths: Its ``answer_token_max`` widths.
        answer_members: The members whose token peaks it reads.
        stacker: The fitted logistic regression.
        reviewed: Fitted by an adaptation on the dataset's reviewed answers (it also
            reads the pooled stacker's logit: :meth:`EnsembleDetector.review_row`),
            not in training.
    """

    widths: tuple[int, ...]
    answer_members: tuple[str, ...]
    stacker: LogisticCalibrator
    reviewed: bool = False


def _dataset_stackers(value: object) -> dict[str, tuple[int, ...]]:
    """``dataset_stackers`` as written (a config is hostile): at most
    :data:`~core.learning.calibration.MAX_DATASET_CALIBRATIONS` dataset names of one short line,
    each mapped to a list of distinct odd widths."""
    example = '{"ragtruth_qa_dev": [25]}'
    if not isinstance(value, Mapping):
        raise DataError(
            f"dataset_stackers must map dataset names to widths, e.g. {example}; got "
            f"{type(value).__name__}",
            field="dataset_stackers",
        )
    if len(value) > MAX_DATASET_CALIBRATIONS:
        raise DataError(
            f"dataset_stackers names {len(value)} datasets; at most {MAX_DATASET_CALIBRATIONS}",
            field="dataset_stackers",
        )
    out = {}
    for name, widths in value.items():
        if type(name) is not str or not 0 < len(name) <= MAX_DATASET_NAME or "\n" in name:
            raise DataError(
                "dataset_stackers has a dataset name that is not one short line",
                field="dataset_stackers",
            )
        if type(widths) not in (list, tuple):
            raise DataError(
                f"dataset_stackers[{name!r}] must be a list of odd widths (may be empty), "
                f"e.g. {example}; got {widths!r}",
                field="dataset_stackers",
            )
        out[name] = tuple(_widths(tuple(widths), f"dataset_stackers[{name!r}]", "[25]"))
    return out


def _read_dataset_stackers(
    value: object, config: EnsembleConfig, folder: str | Path
) -> dict[str, DatasetStacker]:
    """A saved ``dataset_stackers`` weight map, read as untrusted: only datasets the
    config names (a dataset may lack one: too few answers), each stacker valid."""
    if not isinstance(value, Mapping) or not set(value) <= set(config.dataset_stackers):
        raise DataError(
            "the ensemble's weights hold dataset stackers its config does not name; retrain "
            "it with `ragscope train --detectors ensemble`",
            source=str(folder),
        )
    out = {}
    for name, w in value.items():
        keys = {"response", "answer_token_members"}
        if (
            not isinstance(w, Mapping)
            or set(w) - {"reviewed"} != keys
            or w.get("reviewed", True) is not True
        ):
            raise DataError(
                f"the ensemble's stacker of {name!r} is malformed; retrain it with "
                "`ragscope train --detectors ensemble`",
                source=str(folder),
            )
        reviewed = "reviewed" in w
        members = _member_names(w["answer_token_members"], config.members, folder)
        if reviewed and (config.dataset_stackers[name] or members):
            raise DataError(
                f"the ensemble's reviewed stacker of {name!r} reads token peaks (widths "
                f"{list(config.dataset_stackers[name])}, members {list(members)}), which a "
                "reviewed stacker never does; adapt it again with `ragscope adapt`",
                source=str(folder),
            )
        out[name] = DatasetStacker(
            widths=config.dataset_stackers[name],
            answer_members=members,
            stacker=LogisticCalibrator.from_json(w["response"]),
            reviewed=reviewed,
        )
    return out


def token_inputs(config: EnsembleConfig, k: int) -> int:
    """Columns the token stacker reads for ``k`` token members (see ``_token_rows``)."""
    return k * (1 + len(config.token_windows)) + (k + 1 if config.token_context else 0)


def _widths(value: object, option: str, example: str) -> list[int]:
    """``value`` as distinct window widths (a config is hostile: anything else raises a
    DataError naming ``option``)."""
    if type(value) is not tuple:
        raise DataError(
            f"{option} must be a list of odd widths, e.g. {example}; got {value!r}", field=option
        )
    widths = [check_window(w, option) for w in value]
    if len(set(widths)) != len(widths):
        raise DataError(f"{option} repeats a width: {list(widths)}", field=option)
    return widths


def _member_names(value: object, members: Sequence[str], folder: str | Path) -> tuple[str, ...]:
    """A saved list of member names (absent: none), checked against the config's members."""
    names = [] if value is None else value
    if (
        type(names) is not list
        or not all(type(n) is str and n in members for n in names)
        or len(set(names)) != len(names)
    ):
        raise DataError(
            f"the ensemble's weights name token members {value!r} that are not its own "
            "distinct members; retrain it with `ragscope train --detectors ensemble`",
            source=str(folder),
        )
    return tuple(names)


def _token_peak(v: Verdict, width: int) -> float:
    """The highest of ``v``'s token logits averaged over windows of ``width`` (its
    response logit when it scored no tokens)."""
    if not _has_tokens(v):
        return float(logit(np.asarray([v.score]))[0])
    return window_peak(logit(np.asarray(v.token_scores)), width)


def _has_tokens(v: Verdict) -> bool:
    return v.token_scores is not None and v.token_offsets is not None and v.token_scores.size > 0


def _scores(v: Verdict) -> np.ndarray:
    """A token member's token scores (it has them: :func:`_has_tokens`)."""
    if v.token_scores is None:
        raise ValueError(f"{v.detector} gave no token scores")
    return v.token_scores


def _offsets(v: Verdict) -> np.ndarray:
    """A token member's token offsets (it has them: :func:`_has_tokens`)."""
    if v.token_offsets is None:
        raise ValueError(f"{v.detector} gave no token offsets")
    return v.token_offsets


def _grid(verdicts: Mapping[str, Verdict], members: Sequence[str]) -> np.ndarray | None:
    """The token offsets the token members share (those of the first that has any)."""
    for n in members:
        if _has_tokens(verdicts[n]):
            return np.asarray(verdicts[n].token_offsets)
    return None
