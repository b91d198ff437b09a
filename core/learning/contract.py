"""The detector contract: typed features and verdicts, the protocol, scoring helpers.

A detector declares the activations it needs (:meth:`Detector.needs`), turns
one traced example into :class:`Features` (:meth:`Detector.features`), learns
from many (:meth:`Detector.fit`) and scores one (:meth:`Detector.predict`
-> :class:`Verdict`, :func:`thresholded_verdict`). Fitted detectors save as an
artifact folder (:mod:`core.learning.artifact`, the layer above this one).

The engine (:mod:`core.pipeline.extract`, :mod:`core.evaluation.evaluate`) and every workflow are typed
against :class:`Detector`; the registry of named detectors is :mod:`core.detectors`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import math
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Literal,
    Protocol,
    Self,
    get_args,
    runtime_checkable,
)

import numpy as np
from numpy.lib import format as npformat
from pydantic import ConfigDict, TypeAdapter, ValidationError

from core.base.errors import DataError, ModelError, NotFittedError
from core.base.examples import RAGExample
from core.base.safeio import (
    check_zip,
    parse_json,
)
from core.engine.layout import Layout
from core.engine.model import LoadedModel, ModelInfo
from core.engine.trace import Needs, Trace
from core.learning.calibration import (
    DatasetCalibration,
    PlattCalibrator,
    match_dataset,
)
from core.learning.labels import span_labels
from core.learning.span_rule import SpanRule

if TYPE_CHECKING:
    import pandas as pd

ExplanationKind = Literal["contributions", "values", "shap"]
"""What a detector's verdict explanation holds (:attr:`DetectorBase.explanation_kind`)."""

PageRole = Literal[
    "head-tokens",
    "head-chunks",
    "head-stats",
    "probability-sources",
    "sae-features",
    "token-heatmaps",
]
"""A part of the app (and of the CLI's analyses) that explains one detector's mechanism,
by what it shows (:attr:`DetectorBase.explained_on`, read through
:meth:`core.detectors.registry.Registry.explained`): ``head-tokens``, each answer token's
score from the heads and layers a detector selected (Heads & layers, the ReDeEP
walkthrough, AARF); ``head-chunks``, the same per answer chunk; ``head-stats``, every
head's and layer's statistics over labelled answers; ``probability-sources``, a token's
probability taken apart by source (the SHAP pages); ``sae-features``, SAE features and
their explanations (GAM, Feature explanations, steering); ``token-heatmaps``, token
scores smoothed by label persistence (Token heatmaps)."""
PAGE_ROLES: tuple[PageRole, ...] = get_args(PageRole)

ARTIFACT_VERSION = 1


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True, kw_only=True, eq=False)
class Features:
    """What one detector read from one example.

    Label-free: gold labels come from the example at fit/evaluation time, so
    cached features serve any labelling of the same text.

    Attributes:
        detector: Detector name.
        example_id: Example id.
        model: :attr:`ModelInfo.key` of the model the features were read with.
        names: Names of the response-level features.
        response: ``[n_features]`` response-level vector.
        token_names: Names of the token-level features (may be empty).
        tokens: ``[n_tokens, n_token_features]`` per response token, or ``None``.
        token_offsets: ``[n_tokens, 2]`` character range of each response token.
        chunk_names: Names of chunk-level features (may be empty).
        chunks: ``[n_chunks, n_chunk_features]`` or ``None``.
        chunk_offsets: ``[n_chunks, 2]`` character ranges of the chunks.
        members: A composite detector's features (the ensemble's): its members'
            features by name. Never cached itself (the members are, each under its
            own key); ``None`` for every other detector.
    """

    detector: str
    example_id: str
    model: str
    names: tuple[str, ...]
    response: np.ndarray
    token_names: tuple[str, ...] = ()
    tokens: np.ndarray | None = None
    token_offsets: np.ndarray | None = None
    chunk_names: tuple[str, ...] = ()
    chunks: np.ndarray | None = None
    chunk_offsets: np.ndarray | None = None
    members: Mapping[str, Features] | None = None

    def __post_init__(self) -> None:
        r = np.asarray(self.response, dtype=np.float32).reshape(-1)
        object.__setattr__(self, "response", r)
        if r.shape[0] != len(self.names):
            raise ValueError(
                f"{self.detector}: {r.shape[0]} response values for {len(self.names)} names"
            )
        for arr, names, offs, what in (
            (self.tokens, self.token_names, self.token_offsets, "tokens"),
            (self.chunks, self.chunk_names, self.chunk_offsets, "chunks"),
        ):
            if arr is None:
                continue
            a = np.asarray(arr, dtype=np.float32)
            if a.ndim != 2 or a.shape[1] != len(names):
                raise ValueError(
                    f"{self.detector}: {what} must be [n, {len(names)}], got {a.shape}"
                )
            if offs is None or np.asarray(offs).shape != (a.shape[0], 2):
                raise ValueError(f"{self.detector}: {what} need [n, 2] character offsets")
            object.__setattr__(self, what, a)

    def token_labels(self, example: RAGExample) -> np.ndarray | None:
        """Gold label per token (1 = overlaps a hallucinated span), ``None`` without spans."""
        return span_labels(self.token_offsets, example)

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame({"feature": list(self.names), "value": self.response})

    def to_bytes(self) -> bytes:
        """A compact ``.npz`` payload (for the feature cache).

        Raises:
            ValueError: Composite features (:attr:`members`): their members are cached instead.
        """
        if self.members is not None:
            raise ValueError(
                f"{self.detector}: composite features are not cached; cache each member's"
            )
        buf = io.BytesIO()
        arrays: dict[str, np.ndarray] = {"response": self.response}
        for name in ("tokens", "token_offsets", "chunks", "chunk_offsets"):
            v = getattr(self, name)
            if v is not None:
                arrays[name] = np.asarray(v)
        meta = {
            "detector": self.detector,
            "example_id": self.example_id,
            "model": self.model,
            "names": self.names,
            "token_names": self.token_names,
            "chunk_names": self.chunk_names,
        }
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
        np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub reads **arrays as maybe allow_pickle
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes, *, example_id: str | None = None) -> Features:
        """Features from :meth:`to_bytes`'s payload: a bounded ``.npz`` of plain arrays
        (``allow_pickle`` stays off) and a JSON header.

        Raises:
            DataError: A damaged or foreign payload (the feature cache then recomputes).
        """
        try:
            with zipfile.ZipFile(io.BytesIO(blob)) as zf:
                check_zip(
                    zf,
                    source="feature cache entry",
                    max_members=16,
                    max_bytes=PAYLOAD_UNPACKED_LIMIT,
                )
                _check_npy_headers(zf)
            with np.load(io.BytesIO(blob), allow_pickle=False) as z:
                meta = parse_json(z["meta"].tobytes(), source="feature cache entry")
                get = {k: z[k] for k in z.files if k != "meta"}
            return cls._from_parts(meta, get, example_id)
        except DataError:
            raise
        except MALFORMED + (zipfile.BadZipFile, EOFError) as e:
            raise DataError(
                f"unreadable feature cache entry ({type(e).__name__}: {str(e)[:120]})",
                source="feature cache",
            ) from e

    @classmethod
    def _from_parts(
        cls, meta: Any, get: Mapping[str, np.ndarray], example_id: str | None
    ) -> Features:
        if not isinstance(meta, dict):
            raise DataError("feature cache entry header is not a JSON object")
        _check_payload(meta, get)
        return cls(
            detector=meta["detector"],
            example_id=example_id or meta["example_id"],
            model=meta["model"],
            names=tuple(meta["names"]),
            response=get["response"],
            token_names=tuple(meta["token_names"]),
            tokens=get.get("tokens"),
            token_offsets=get.get("token_offsets"),
            chunk_names=tuple(meta["chunk_names"]),
            chunks=get.get("chunks"),
            chunk_offsets=get.get("chunk_offsets"),
        )

    def check_fits(self, example: RAGExample, response_offsets: np.ndarray | None = None) -> None:
        """Refuse features that cannot be ``example``'s: character offsets past the end of
        its response, or (given the example's ``response_offsets`` under the model, as
        every detector's extraction writes them) other token offsets.

        Raises:
            DataError: Naming the detector, the example and what does not fit.
        """
        n = len(example.response)
        for what, offs in (("token", self.token_offsets), ("chunk", self.chunk_offsets)):
            if offs is not None and offs.size and int(offs.max()) > n:
                raise DataError(
                    f"{self.detector} features: {what} offsets reach character "
                    f"{int(offs.max())}, but the response of {example.id!r} has {n} characters "
                    "(features of another example?)"
                )
        if (
            response_offsets is not None
            and self.token_offsets is not None
            and not np.array_equal(self.token_offsets, response_offsets)
        ):
            raise DataError(
                f"{self.detector} features: {len(self.token_offsets)} token offsets that are "
                f"not the {len(response_offsets)} tokens of {example.id!r}'s response under "
                "this model (features of another example?)"
            )


PAYLOAD_NAMES_LIMIT = 1 << 20
"""Most feature names (of one level) a stored payload may declare."""
PAYLOAD_UNPACKED_LIMIT = 256 << 20
"""Most bytes a stored payload's arrays may unpack to."""


def _check_npy_headers(zf: zipfile.ZipFile) -> None:
    """Refuse an array whose ``.npy`` header declares more bytes than its member holds
    (numpy would allocate the declared shape before reading), before anything is read.

    Raises:
        DataError: Naming the member, what it declares and what it holds.
    """
    for info in zf.infolist():
        with zf.open(info) as fh:
            version = npformat.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = npformat.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, _, dtype = npformat.read_array_header_2_0(fh)
            else:
                raise DataError(f"feature cache entry: {info.filename} is .npy {version}")
        declared = math.prod(shape) * dtype.itemsize
        if dtype.hasobject or declared > info.file_size:
            raise DataError(
                f"feature cache entry: {info.filename} declares {declared:,} bytes of "
                f"{dtype} but holds {info.file_size:,}"
            )


def _check_payload(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """What every stored payload must be, as the detectors' own extraction writes it:
    lists of names, finite float values, integer character offsets with
    ``0 <= start <= end``.

    Raises:
        DataError: Naming the array or header field and what is wrong.
    """
    for key in ("detector", "model", "example_id"):
        if not isinstance(meta.get(key), str):
            raise DataError(f"feature cache entry: {key!r} is not a string")
    for key in ("names", "token_names", "chunk_names"):
        v = meta.get(key)
        if (
            not isinstance(v, list)
            or len(v) > PAYLOAD_NAMES_LIMIT
            or not all(isinstance(x, str) for x in v)
        ):
            raise DataError(f"feature cache entry: {key!r} is not a list of names")
    unknown = set(arrays) - {"response", "tokens", "chunks", "token_offsets", "chunk_offsets"}
    if unknown:
        raise DataError(f"feature cache entry: unknown arrays {sorted(unknown)}")
    for key in ("response", "tokens", "chunks"):
        a = arrays.get(key)
        if a is None:
            continue
        if not np.issubdtype(a.dtype, np.floating):
            raise DataError(f"feature cache entry: {key!r} is {a.dtype}, not floats")
        if not np.isfinite(a).all():
            raise DataError(
                f"feature cache entry: {key!r} holds {int((~np.isfinite(a)).sum())} NaN or "
                "infinite values (extraction writes finite ones)"
            )
    for key in ("token_offsets", "chunk_offsets"):
        o = arrays.get(key)
        if o is None:
            continue
        if not np.issubdtype(o.dtype, np.integer) or o.ndim != 2 or o.shape[1:] != (2,):
            raise DataError(f"feature cache entry: {key!r} is not [n, 2] integer offsets")
        if o.size and (int(o.min()) < 0 or bool((o[:, 0] > o[:, 1]).any())):
            raise DataError(
                f"feature cache entry: {key!r} holds impossible character ranges "
                "(negative, or a start after its end)"
            )


CALLS = ("flagged", "not flagged", "no signal", "no threshold")
"""The calls a verdict makes, in words (:attr:`Verdict.call`)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class Verdict:
    """A detector's judgement of one response.

    Attributes:
        detector: Detector name.
        example_id: Example id.
        score: Probability-like hallucination score of the response, in [0, 1].
        hallucinated: ``score >= threshold`` when the detector has a threshold.
        token_scores: ``[n_tokens]`` scores in [0, 1], or ``None``.
        token_offsets: ``[n_tokens, 2]`` character ranges, with token scores.
        chunk_scores: ``[n_chunks]`` scores in [0, 1], or ``None``.
        explanation: Feature name -> contribution (or value) behind the score.
        raw_score: The detector's own score before calibration, when the detector
            carries a calibrator (``score`` is then the calibrated probability);
            ``None`` otherwise.
        calibrated_for: The training dataset whose own calibration and threshold gave
            ``score`` and ``hallucinated`` (:func:`for_dataset`); ``None``: the pooled
            calibration of all the detector's training data.
        threshold: The threshold ``hallucinated`` was decided at, from the same fit as
            the calibration that gave ``score`` (``None``: the detector has none).
        raw_by_dataset: Training dataset -> the raw score of the detector's scorer of
            that dataset's own (the ensemble's ``dataset_stackers``), beside the pooled
            scorer's ``raw_score``: :func:`for_dataset` calibrates that one with the
            dataset's own calibration, which was fitted on it. Empty for most detectors.
        no_signal: Why the calibration that gave ``score`` carries no signal (it is
            flat: :attr:`core.learning.calibration.PlattCalibrator.flat`), in words;
            the verdict then makes no call (``hallucinated`` is ``None``) and a set
            leaves it out of its vote and its counts. ``None``: it carries one.
    """

    detector: str
    example_id: str
    score: float
    hallucinated: bool | None = None
    token_scores: np.ndarray | None = None
    token_offsets: np.ndarray | None = None
    chunk_scores: np.ndarray | None = None
    explanation: Mapping[str, float] = field(default_factory=dict)
    raw_score: float | None = None
    calibrated_for: str | None = None
    threshold: float | None = None
    raw_by_dataset: Mapping[str, float] = field(default_factory=dict)
    no_signal: str | None = None

    @property
    def called(self) -> bool:
        """Whether the verdict makes a call (flagged or not): it has a threshold and its
        calibration carries a signal (:attr:`no_signal`)."""
        return self.hallucinated is not None and self.no_signal is None

    @property
    def call(self) -> str:
        """The call in words, as every page and report shows it: ``"flagged"``, ``"not
        flagged"``, ``"no signal"`` (:attr:`no_signal`) or ``"no threshold"``."""
        if self.no_signal is not None:
            return "no signal"
        if self.hallucinated is None:
            return "no threshold"
        return "flagged" if self.hallucinated else "not flagged"

    @property
    def judged_raw(self) -> float | None:
        """The raw score behind ``score``: that of :attr:`calibrated_for`'s own scorer
        when the detector has one (:attr:`raw_by_dataset`), else :attr:`raw_score`."""
        if self.calibrated_for is not None and self.calibrated_for in self.raw_by_dataset:
            return self.raw_by_dataset[self.calibrated_for]
        return self.raw_score

    def __post_init__(self) -> None:
        if not 0.0 <= self.score <= 1.0 or np.isnan(self.score):
            raise ValueError(f"{self.detector}: score {self.score} is outside [0, 1]")
        if self.no_signal is not None and self.hallucinated is not None:
            raise ValueError(f"{self.detector}: a verdict with no signal makes no call")
        if self.threshold is not None and self.hallucinated is not None:
            # One fit gives the probability and the threshold it is compared with.
            assert self.hallucinated == (self.score >= self.threshold), (
                f"{self.detector}: flag {self.hallucinated} disagrees with "
                f"{self.score} against threshold {self.threshold}"
            )

    def to_frame(self) -> pd.DataFrame:
        """Token scores as a table (empty when the detector gives none)."""
        import pandas as pd

        if self.token_scores is None or self.token_offsets is None:
            return pd.DataFrame(columns=["start", "end", "score"])
        return pd.DataFrame(
            {
                "start": self.token_offsets[:, 0],
                "end": self.token_offsets[:, 1],
                "score": self.token_scores,
            }
        )


@dataclass(frozen=True, kw_only=True, eq=False)
class Run:
    """Everything a detector may read about one example: the example, its layout, traces.

    Attributes:
        example: The example.
        layout: The layout with context.
        trace: The traced forward pass with context (``None`` when no detector
            in the batch needs activations).
        bare: The no-context trace, present when some detector asked for it.
        model: Facts about the analysing model.
        loaded: The analysing model itself, for detectors that read its weights
            (logit lens, copying heads); ``None`` when features are built offline.
        memo: Values derived from the traces that several detectors share
            (e.g. the PKS matrix), computed once per run (see :meth:`shared`).
    """

    example: RAGExample
    layout: Layout
    trace: Trace | None
    bare: Trace | None
    model: ModelInfo
    loaded: LoadedModel | None = None
    memo: dict[Any, Any] = field(default_factory=dict, repr=False)

    def shared(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per run under ``key``; later callers get the same value."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def require_model(self, detector: str) -> LoadedModel:
        """The loaded model, or a clear error for detectors that read its weights."""
        if self.loaded is None:
            raise ModelError(
                f"{detector} reads the model's weights: build its features with the model "
                "loaded (core.pipeline.extract.run_example / extract_features)"
            )
        return self.loaded


# ----------------------------------------------------------------------------- config


@dataclass(frozen=True, kw_only=True)
class DetectorConfig:
    """Base of every detector config: frozen, keyword-only, hashable into cache keys."""

    #: Options that only change how the detector learns or scores, never its
    #: features: left out of :meth:`feature_hash`, so changing them reuses cached features.
    FIT_ONLY: ClassVar[frozenset[str]] = frozenset()
    #: How :meth:`from_untrusted` reads a config (pydantic): exact JSON types, finite numbers.
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(strict=True, allow_inf_nan=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def config_hash(self) -> str:
        return _hash({"class": type(self).__name__, **self.to_dict(), "artifact": ARTIFACT_VERSION})

    def feature_hash(self) -> str:
        """Hash of the options the features depend on (the feature-cache key)."""
        d = {k: v for k, v in self.to_dict().items() if k not in self.FIT_ONLY}
        return _hash({"class": type(self).__name__, **d, "artifact": ARTIFACT_VERSION})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Self:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise DataError(
                f"unknown {cls.__name__} options {sorted(unknown)}; known: {sorted(known)}"
            )
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    @classmethod
    def from_untrusted(cls, d: object) -> Self:
        """A config read from a file someone else may have written (an artifact's
        ``cfg.json``): every option of exactly its declared type (an integer is not
        ``"1"`` or ``1.0``, a flag not ``1``; lists for tuples), numbers finite, unknown
        options refused, then the config's own range checks.

        Raises:
            DataError: Naming the first offending option, its value and the type wanted.
        """
        if not isinstance(d, Mapping):
            raise DataError(f"the {cls.__name__} must be a JSON object, not {type(d).__name__}")
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise DataError(f"unknown {cls.__name__} options {sorted(unknown)}")
        try:
            _adapter(cls).validate_json(json.dumps(d, allow_nan=True))  # type: ignore[arg-type]  # a class is hashable; mypy's Hashable misses type[Self]
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            where = ".".join(str(x) for x in err["loc"]) or None
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, DataError):
                raise DataError(cause.reason, field=cause.field or where) from e
            got = repr(err["input"])
            got = got if len(got) <= 80 else f"{got[:80]}..."
            msg = f"{err['msg']}, got {got}" if where else str(cause or err["msg"])
            raise DataError(msg, field=where) from e
        except (TypeError, ValueError) as e:  # a value json cannot write
            raise DataError(f"the {cls.__name__} is not plain JSON ({e})") from e
        # Built from the values as written (pydantic would turn 0 into 0.0 for a float
        # option, which changes the config hash the artifact records).
        return cls.from_dict(d)


@functools.cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


def _hash(payload: Mapping[str, Any]) -> str:
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# ----------------------------------------------------------------------------- protocol


@runtime_checkable
class Detector(Protocol):
    """What every detector provides (see the module docstring). Detectors derive from
    :class:`DetectorBase`, which gives the optional parts their defaults."""

    name: ClassVar[str]

    @property
    def config(self) -> DetectorConfig:
        """Its options (each detector class's own :class:`DetectorConfig`)."""
        ...

    #: Whether :meth:`features` reads the no-context trace (``Run.bare``).
    needs_bare: bool
    #: Whether the detector combines others (:meth:`member_detectors`, :meth:`bundle`).
    composite: ClassVar[bool]
    #: Traits (:class:`DetectorBase` documents each and gives the defaults).
    stacked_by_default: ClassVar[bool]
    explanation_kind: ClassVar[ExplanationKind]
    explains_sae_features: ClassVar[bool]
    reads_heads: ClassVar[bool]
    needs_sae: ClassVar[bool]
    reads_text_only: ClassVar[bool]
    explained_on: ClassVar[frozenset[PageRole]]
    trained_by_default: ClassVar[bool]
    #: What fitting leaves (restored from an artifact's ``cfg.json``): the answer
    #: threshold, the token threshold (``None`` when not chosen), the score calibration
    #: (``None``: raw scores) and facts about the training.
    threshold_: float
    token_threshold_: float | None
    span_rule_: SpanRule | None
    calibration_: PlattCalibrator | None
    dataset_calibration_: Mapping[str, DatasetCalibration]
    train_info_: dict[str, Any]

    def needs(self, model: ModelInfo) -> Needs | None:
        """Hooks and positions to trace; ``None`` when no activations are needed."""
        ...

    def bare_needs(self, model: ModelInfo) -> Needs | None:
        """What the no-context pass must record (asked only when ``needs_bare``)."""
        ...

    def unavailable(self, model: ModelInfo) -> str | None:
        """Why this detector cannot read ``model`` (e.g. no SAE for it); ``None`` if it can."""
        ...

    def member_detectors(self) -> Sequence[Detector]:
        """A composite's members, whose features the engine computes (empty otherwise)."""
        ...

    def bundle(self, example_id: str, model_key: str, members: Mapping[str, Features]) -> Features:
        """A composite's features for one example, from its members' (by name)."""
        ...

    def pinned(self) -> Mapping[str, Any]:
        """Config overrides that fix what this fitted detector chose on its validation
        part (a classifier, a layer): detectors refitted for its cross-fitted
        calibration use them, so the calibrator learns scores of the same form as the
        ones it will map (empty: nothing chosen)."""
        ...

    def features(self, run: Run) -> Features: ...

    def fit(self, features: Sequence[Features], examples: Sequence[RAGExample]) -> Self:
        """Learn from the training split.

        A detector that selects hyper-parameters may also accept a keyword
        ``validation=(features, examples)``; :func:`core.evaluation.evaluate.evaluate` then
        passes the validation split, and the test split never reaches ``fit``.
        """
        ...

    def predict(self, features: Features) -> Verdict: ...

    def save(self, folder: str | Path, *, extra: Mapping[str, Any] | None = None) -> Path: ...

    @classmethod
    def load(cls, folder: str | Path, *, model_key: str | None = None) -> Self: ...


class DetectorClass(Protocol):
    """A detector class as the registry holds it: named, made from its config (the
    class's own :class:`DetectorConfig`) and loaded from an artifact folder."""

    @property
    def name(self) -> str: ...

    @property
    def Config(self) -> type[DetectorConfig]: ...  # noqa: N802 - the class attribute's name

    @property
    def composite(self) -> bool: ...

    # Its traits (:class:`DetectorBase` documents each).
    @property
    def stacked_by_default(self) -> bool: ...

    @property
    def explanation_kind(self) -> ExplanationKind: ...

    @property
    def explains_sae_features(self) -> bool: ...

    @property
    def reads_heads(self) -> bool: ...

    @property
    def needs_sae(self) -> bool: ...

    @property
    def reads_text_only(self) -> bool: ...

    @property
    def explained_on(self) -> frozenset[PageRole]: ...

    @property
    def trained_by_default(self) -> bool: ...

    def __call__(self, config: Any = None) -> Detector: ...

    def load(self, folder: str | Path, *, model_key: str | None = None) -> Detector: ...


class DetectorBase:
    """Defaults for the optional parts of :class:`Detector`: a plain (not composite)
    detector that reads any model and records the same hooks without context."""

    name: ClassVar[str]
    needs_bare: bool = False
    composite: ClassVar[bool] = False
    #: Whether its verdicts give every answer token a score (:func:`scores_tokens`).
    gives_token_scores: ClassVar[bool] = False
    # Traits pages and reports read instead of lists of detector names:
    #: Whether an ensemble stacks it when given no member list
    #: (:func:`core.detectors.registry.Registry.stacked`).
    stacked_by_default: ClassVar[bool] = True
    #: What its verdicts' ``explanation`` holds, so it is drawn right: each input's
    #: contribution to the log-odds (``contributions``: bars), the values its score was
    #: read from (``values``: a table), or inputs of a classifier explained by SHAP
    #: (``shap``: a waterfall of its classifier).
    explanation_kind: ClassVar[ExplanationKind] = "values"
    #: Whether its explanation's inputs are SAE features (their text explanations are
    #: shown beside them, the Feature explanations page reads them).
    explains_sae_features: ClassVar[bool] = False
    #: Whether its features carry each attention head's external-context score (a
    #: head grid is drawn, Heads & layers explains it).
    reads_heads: ClassVar[bool] = False
    #: Whether it needs an SAE trained on the model (a model without one cannot run it).
    needs_sae: ClassVar[bool] = False
    #: Whether it reads the text alone, no activation (it runs without a forward pass).
    reads_text_only: ClassVar[bool] = False
    #: The parts of the app that explain its mechanism (:data:`PageRole`); each part
    #: explains exactly one registered detector.
    explained_on: ClassVar[frozenset[PageRole]] = frozenset()
    #: Whether ``ragscope train`` (and a recipe) trains it when no detector is named:
    #: the cheap baselines every other detector is compared with.
    trained_by_default: ClassVar[bool] = False
    #: Maps the detector's score to a probability calibrated on held-out data (set by
    #: the training workflow, saved in ``cfg.json``); ``None``: scores are shown as they are.
    calibration_: PlattCalibrator | None = None
    #: Dataset name -> that dataset's own calibrator and threshold, for a detector
    #: trained on several datasets (:func:`for_dataset`); empty: the pooled ones only.
    dataset_calibration_: Mapping[str, DatasetCalibration] = MappingProxyType({})
    token_threshold_: float | None = None
    #: How its token scores become the spans a set shows when it is the set's span
    #: judge (:mod:`core.pipeline.span_judge`); ``None``: the default at its token threshold.
    span_rule_: SpanRule | None = None

    def needs(self, model: ModelInfo) -> Needs | None:
        raise NotImplementedError

    def bare_needs(self, model: ModelInfo) -> Needs | None:
        return self.needs(model)

    def unavailable(self, model: ModelInfo) -> str | None:
        return None

    def member_detectors(self) -> Sequence[Detector]:
        return ()

    def pinned(self) -> Mapping[str, Any]:
        return {}

    def fitted_models(self) -> Mapping[str, tuple[Any, int | None]]:
        """What this fitted detector learned, for the load-time consistency check
        (:func:`core.base.safeio.check_fitted`): a label (its file, or the attribute) ->
        (the fitted model, the number of features the detector gives it, ``None`` when
        not fixed). By default every public ``..._`` attribute, width unknown; detectors
        whose models read a known width say so."""
        return {k: (v, None) for k, v in vars(self).items() if k.endswith("_") and k[0] != "_"}

    def bundle(self, example_id: str, model_key: str, members: Mapping[str, Features]) -> Features:
        raise TypeError(f"{self.name} is not a composite detector")


def tokens_from_chunks(
    chunk_scores: np.ndarray, chunk_offsets: np.ndarray, token_offsets: np.ndarray | None
) -> np.ndarray | None:
    """Per token, the highest score of the chunks it overlaps (0 for tokens in none)."""
    if token_offsets is None:
        return None
    out = np.zeros(token_offsets.shape[0], dtype=np.float32)
    for s, (a, b) in zip(chunk_scores, chunk_offsets, strict=True):
        hit = (token_offsets[:, 0] < b) & (a < token_offsets[:, 1])
        out[hit] = np.maximum(out[hit], s)
    return out


def check_features(
    name: str,
    features: Features,
    model_key: str | None,
    names: Sequence[str] | None = None,
) -> None:
    """Refuse features read with another model (or with other columns) than a fitted detector's.

    Raises:
        ModelError: ``features.model`` is not ``model_key``, or ``features.names``
            differs from ``names`` (another config, e.g. other copying heads).
    """
    if model_key and features.model and features.model != model_key:
        raise ModelError(
            f"{name} was trained on {model_key!r} but these features come from "
            f"{features.model!r}; retrain or load the matching model"
        )
    if names is not None and tuple(features.names) != tuple(names):
        raise ModelError(
            f"{name}: these features have other columns than the fitted detector (another "
            "config?); re-extract them with the artifact's config"
        )


def scores_tokens(detector: Any) -> bool:
    """Whether ``detector``'s verdicts carry token scores (to flag spans with): what its
    class declares (:attr:`DetectorBase.gives_token_scores`), or a fitted token
    threshold."""
    if getattr(detector, "token_threshold_", None) is not None:
        return True
    return bool(getattr(detector, "gives_token_scores", False))


def flag_threshold(detector: Any) -> float:
    """The threshold to flag single tokens at: the detector's token threshold (best token
    F1 on validation, recorded by ``ragscope train`` / ``ragscope token-thresholds``),
    else its answer threshold, else 0.5."""
    tok = getattr(detector, "token_threshold_", None)
    if tok is not None:
        return float(tok)
    return float(getattr(detector, "threshold_", 0.5))


MALFORMED: tuple[type[BaseException], ...] = (
    OSError,
    KeyError,
    TypeError,
    ValueError,
    AttributeError,
    IndexError,
    RuntimeError,
)
"""What reading a damaged artifact raises (turned into a :class:`DataError` by :func:`load_fitted`)."""


def for_dataset(detector: Any, verdict: Verdict, dataset: str | None) -> Verdict:
    """``verdict`` as ``detector`` judges an answer of ``dataset``: its score through that
    dataset's own calibrator and flagged at its own threshold when the detector has them
    (:attr:`DetectorBase.dataset_calibration_`; another split of a training dataset, e.g.
    ``ragtruth_qa_test`` for ``ragtruth_qa_dev``, gets that dataset's:
    :func:`core.learning.calibration.match_dataset`; :attr:`Verdict.calibrated_for` then names
    the training dataset), else ``verdict`` unchanged (the pooled calibration). A
    detector with a scorer of that dataset's own (:attr:`Verdict.raw_by_dataset`) is
    judged by that scorer's raw score; ``raw_score`` stays the pooled scorer's."""
    hit = match_dataset(getattr(detector, "dataset_calibration_", None) or {}, dataset)
    if hit is None or verdict.raw_score is None:
        return verdict
    name, cal = hit
    # The dataset's own scorer's raw score when it has one (its calibration was fitted
    # on those: :func:`own_raw_scores`), else the pooled scorer's.
    p = cal.apply(verdict.raw_by_dataset.get(name, verdict.raw_score))
    silent = no_signal_reason(cal.calibrator, name)
    return dataclasses.replace(
        verdict,
        score=p,
        hallucinated=None if silent else p >= cal.threshold,
        calibrated_for=name,
        threshold=float(cal.threshold),
        no_signal=silent,
    )


def no_signal_reason(calibrator: Any, dataset: str | None) -> str | None:
    """Why a verdict through ``calibrator`` (fitted on ``dataset``'s answers; ``None``:
    on all the detector's training data) makes no call, or ``None`` when it carries a
    signal: a flat calibration gives every answer the base rate of the answers it was
    fitted on, which sits at the threshold chosen there, so it would flag every answer
    or none (:attr:`core.learning.calibration.PlattCalibrator.flat`)."""
    if calibrator is None or not getattr(calibrator, "flat", False):
        return None
    where = dataset or "its training data"
    return f"no signal on {where}: its calibration there is flat (its scores did not rank them)"


def own_raw_scores(verdicts: Sequence[Verdict], datasets: Sequence[str | None]) -> np.ndarray:
    """Each uncalibrated verdict's raw score as its own dataset's calibration reads it:
    the score of the detector's scorer of that dataset when it has one
    (:attr:`Verdict.raw_by_dataset`), else its ``score`` (what a dataset's own
    calibration is fitted on, so that :func:`for_dataset` applies it to the same)."""
    return np.asarray(
        [
            v.raw_by_dataset.get(d, v.score) if d else v.score
            for v, d in zip(verdicts, datasets, strict=True)
        ],
        dtype=np.float64,
    )


def judge_features(detector: Any, features: Features, dataset: str | None) -> Verdict:
    """``detector``'s verdict on ``features`` of an answer of ``dataset``: its prediction
    through :func:`for_dataset` (the one way every path judges an answer)."""
    return for_dataset(detector, detector.predict(features), dataset)


def calibrated_as(detector: Any, verdict: Verdict, dataset: str | None) -> Verdict:
    """``verdict`` judged as if its answer came from ``dataset``: that training dataset's
    own calibration and threshold (:func:`for_dataset`), or with ``None`` the pooled ones
    of all the detector's training data. A verdict of an uncalibrated detector (no
    ``raw_score``) is returned unchanged."""
    cal = getattr(detector, "calibration_", None)
    if verdict.raw_score is None or cal is None:
        return verdict
    p = min(max(float(cal.transform(verdict.raw_score)), 0.0), 1.0)
    thr = float(detector.threshold_)
    silent = no_signal_reason(cal, None)
    pooled = dataclasses.replace(
        verdict,
        score=p,
        hallucinated=None if silent else p >= thr,
        calibrated_for=None,
        threshold=thr,
        no_signal=silent,
    )
    return for_dataset(detector, pooled, dataset) if dataset else pooled


def decision_threshold(detector: Any, verdict: Verdict) -> float:
    """The threshold ``verdict`` was flagged at: its dataset's own, or the detector's."""
    if verdict.threshold is not None:
        return verdict.threshold
    own = getattr(detector, "dataset_calibration_", None) or {}
    cal = own.get(verdict.calibrated_for) if verdict.calibrated_for else None
    return cal.threshold if cal is not None else float(detector.threshold_)


def thresholded_verdict(detector: Any, features: Features, score: float, **kw: Any) -> Verdict:
    """The verdict of a fitted detector with a ``threshold_``: ``score`` clamped to [0, 1]
    (rounding can step just outside), mapped through the detector's ``calibration_`` when
    it has one (the raw score is kept as ``raw_score``; the threshold is then on the
    calibrated scale), flagged when it reaches the threshold; ``kw`` are the other
    :class:`Verdict` fields (token/chunk scores, explanation). Token scores come with
    the features' token offsets unless ``token_offsets`` is given."""
    if kw.get("token_scores") is not None:
        kw.setdefault("token_offsets", features.token_offsets)
    raw = min(max(float(score), 0.0), 1.0)
    cal = getattr(detector, "calibration_", None)
    shown = min(max(float(cal.transform(raw)), 0.0), 1.0) if cal is not None else raw
    thr = float(detector.threshold_)
    silent = no_signal_reason(cal, None)
    return Verdict(
        detector=detector.name,
        example_id=features.example_id,
        score=shown,
        hallucinated=None if silent else shown >= thr,
        raw_score=raw if cal is not None else None,
        threshold=thr,
        no_signal=silent,
        **kw,
    )


def check_fit_inputs(
    name: str,
    features: Sequence[Features],
    examples: Sequence[RAGExample],
    *,
    same_columns: bool = False,
) -> str:
    """The model key all training ``features`` come from, after the checks every ``fit``
    makes: one Features per example (and at least one), one model (and, with
    ``same_columns``, one set of feature names).

    Raises:
        DataError: The lists differ in length or are empty.
        ModelError: The features come from different models (or configs).
    """
    if len(features) != len(examples) or not features:
        raise DataError(
            f"{name}: fit needs one Features per example; got {len(features)} and {len(examples)}"
        )
    models = {f.model for f in features}
    if len(models) != 1:
        raise ModelError(
            f"{name}: features come from different models {sorted(models)}; train on one"
        )
    if same_columns and len({f.names for f in features}) != 1:
        raise ModelError(
            f"{name}: features have different columns (several configs or SAEs); "
            "re-extract them with one config"
        )
    return models.pop()


def require_fitted(obj: Any, attr: str, name: str) -> None:
    if getattr(obj, attr, None) is None:
        raise NotFittedError(
            f"detector {name!r} is not fitted; call fit() or load an artifact "
            f"(`ragscope train --detectors {name}`)"
        )


FeatureFn = Callable[[Run], Features]


def align_token_scores(
    scores: np.ndarray, offsets: np.ndarray, target_offsets: np.ndarray
) -> np.ndarray:
    """Carry token scores onto another tokenization of the same text.

    A detector re-renders the answer from its text, so a generated answer's own tokens
    may be split differently; each target token takes the highest score of the source
    tokens its characters overlap (NaN when none does).

    Args:
        scores: ``[n_src]`` scores.
        offsets: ``[n_src, 2]`` character ranges of the scored tokens.
        target_offsets: ``[n_tgt, 2]`` character ranges to score.

    Returns:
        ``[n_tgt]`` float64 scores.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    src = np.asarray(offsets).reshape(-1, 2)
    tgt = np.asarray(target_offsets).reshape(-1, 2)
    if src.shape[0] != s.shape[0]:
        raise ValueError(f"{s.shape[0]} scores for {src.shape[0]} token offsets")
    if src.shape == tgt.shape and np.array_equal(src, tgt):
        return s.copy()
    overlap = (src[None, :, 0] < tgt[:, None, 1]) & (tgt[:, None, 0] < src[None, :, 1])
    out = np.where(overlap, s[None, :], -np.inf).max(axis=1, initial=-np.inf)
    return np.where(np.isfinite(out), out, np.nan)
