"""Detector sets: which fitted detectors judge answers for a model, loaded once, each
with a typed card of what its ``cfg.json`` records.

One rule picks the set (:func:`resolve_set`), for the app, every CLI command, ``bench``
and the training jobs alike:

1. a set named by the caller (``--set NAME``; ``custom`` is not a name to ask for),
2. else ``RAGSCOPE_DETECTORS_DIR`` (a folder of artifacts, set name ``custom``),
3. else ``RAGSCOPE_DETECTOR_SET`` (a shipped set by name),
4. else the ``default`` set (``assets/detectors``);

and when that folder holds nothing for the model (no artifact of it, loaded or broken),
the detectors trained on this machine for the model (set name ``trained``).

:class:`~core.learning.artifact.TrainedOn` (re-exported here; ``compare_artifacts`` reads the
training data hashes through it too) is the one reader of an artifact's
``cfg.json["trained_on"]`` and :class:`ArtifactCard` of the rest of what the app and the CLI show about an artifact;
each ``cfg.json`` is read once when listing the folder and once more, verified against
its file hashes, by the detector's own loader.

A set may defer to **experts**: other shipped sets, each trained on one dataset alone,
named in the set folder's ``experts.json`` (``{"experts": ["ragtruth"]}``). An answer of
an expert's training dataset (or another split of it: the rule that picks a dataset's
own calibration, :func:`core.learning.calibration.match_dataset`) is judged by that expert,
whole (:meth:`DetectorSet.for_dataset`); every other answer by the set itself. An expert
is used only when it is trained on the same model, on one dataset, and reads exactly the
features the set's detectors of the same name read, so no answer is traced twice; one
that is not is named in :attr:`DetectorSet.expert_problems` and not used.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.base.errors import DataError, RagscopeError, brief
from core.base.paths import (
    CUSTOM_SET,
    DEFAULT_SET,
    TRAINED_SET,
    adapted_sets_dir,
    detector_set_dir,
    detector_set_name,
    is_set_name,
    model_detectors_dir,
    shipped_dir,
)
from core.base.safeio import read_json_file
from core.detectors import DETECTORS, available_detectors, load_shipped
from core.learning.artifact import TrainedOn, artifact_info, cfg_at, cfg_number
from core.learning.calibration import match_dataset
from core.learning.contract import Detector

if TYPE_CHECKING:
    from core.base.examples import RAGExample

ANSWER_JUDGE = DETECTORS.composite()
"""The detector whose verdict is a set's overall verdict on an answer, when the set has
it (it stacks the others); a set without it is judged by the share of its detectors that
flag the answer (:func:`core.pipeline.judge.overall_verdict`)."""
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


@dataclass(frozen=True, kw_only=True, eq=False)
class ArtifactCard:
    """A fitted detector of a set, with what its ``cfg.json`` records.

    Attributes:
        name: Detector name (also the artifact's folder name).
        folder: The artifact folder.
        detector: The fitted detector.
        model: The model key it was trained on.
        training: What it was trained on, and the recipe.
        threshold: The pooled calibration's answer threshold (each training dataset's
            own threshold is in :attr:`calibrations`' detector state).
        token_threshold: The token-score threshold it flags spans at (``None``: the
            detector scores no tokens, or none was fitted).
        calibrated: Whether its scores are calibrated probabilities.
        calibrations: The training datasets it keeps a calibration and threshold of its
            own for (an answer of one is judged by it).
        own_stackers: The training datasets whose answers the ensemble reads with a
            response stacker of that dataset's own (``ensemble.dataset_stackers``).
        auroc: Its recorded AUROC: pooled out of fold for cross-validated training,
            else on the held-out test split.
        auroc_from: Where :attr:`auroc` comes from (``"5-fold CV"``, ``"test split"``).
        metrics: The metrics ``cfg.json`` records, as written.
    """

    name: str
    folder: Path
    detector: Detector
    model: str | None
    training: TrainedOn
    threshold: float
    token_threshold: float | None
    calibrated: bool
    calibrations: tuple[str, ...]
    auroc: float | None
    auroc_from: str | None
    metrics: Mapping[str, Any]
    own_stackers: tuple[str, ...] = ()

    @property
    def trained_on(self) -> str | None:
        """The training data in words (:attr:`TrainedOn.label`)."""
        return self.training.label

    @property
    def n_train(self) -> int | None:
        return self.training.n_train

    @property
    def cv_run(self) -> str | None:
        """The name of the CV run its CV metrics come from (a file name in the runs
        folder), when it records a safe one."""
        run = cfg_at(self.metrics, "cv", "run")
        if isinstance(run, str) and 0 < len(run) <= 200 and _RUN_NAME.fullmatch(run):
            return run
        return None

    @classmethod
    def of(
        cls, name: str, folder: Path, detector: Detector, cfg: Mapping[str, Any]
    ) -> ArtifactCard:
        """The card of a loaded detector, from the ``cfg.json`` read when listing."""
        auroc = cfg_number(cfg_at(cfg, "metrics", "cv", "pooled", "auroc"))
        k = cfg_at(cfg, "metrics", "cv", "k")
        auroc_from = f"{k}-fold CV" if auroc is not None else None
        if auroc is None:
            auroc = cfg_number(cfg_at(cfg, "metrics", "test", "auroc"))
            auroc_from = "test split" if auroc is not None else None
        threshold = getattr(detector, "threshold_", None)
        if threshold is None:
            threshold = cfg_number(cfg.get("threshold"))
        token = getattr(detector, "token_threshold_", None)
        metrics = cfg.get("metrics")
        model = cfg.get("model")
        return cls(
            name=name,
            folder=folder,
            detector=detector,
            model=model if isinstance(model, str) else None,
            training=TrainedOn.from_cfg(cfg),
            threshold=float(threshold) if threshold is not None else 0.5,
            token_threshold=float(token) if token is not None else None,
            calibrated=getattr(detector, "calibration_", None) is not None,
            calibrations=tuple(sorted(getattr(detector, "dataset_calibration_", None) or {})),
            own_stackers=tuple(sorted(getattr(detector, "dataset_stackers_", None) or {})),
            auroc=auroc,
            auroc_from=auroc_from,
            metrics=metrics if isinstance(metrics, dict) else {},
        )


@dataclass(frozen=True, kw_only=True)
class BrokenArtifact:
    """An artifact folder of a set that could not be loaded.

    Attributes:
        name: Detector name (the folder's name).
        folder: The artifact folder.
        reason: Why loading failed.
    """

    name: str
    folder: Path
    reason: str


@dataclass(frozen=True, kw_only=True, eq=False)
class DetectorSet:
    """The fitted detectors that judge answers for one model, from one folder.

    Attributes:
        name: The set's name (``default``, a shipped set's, ``custom``, ``trained``).
        folder: Where the artifacts were looked for.
        model_key: ``ModelInfo.key`` of the model they were loaded for.
        detectors: The loaded detectors trained on that model, with their cards, by
            folder name.
        broken: Artifacts that could not be read or loaded, with the reason.
        other_models: Model keys that the readable artifacts of other models were made for.
        foreign: ``(detector, model key)`` of each readable artifact made for another
            model (asked for by name, it is refused naming that model).
        stamp: Changes whenever an artifact file of the folder changes.
        error: Why the requested set could not be used (the default set was loaded).
        experts: The sets this one defers to, by the one training dataset of each.
        expert_problems: Why an expert named in ``experts.json`` is not used.
        deferred_from: For an expert chosen by :meth:`for_dataset`: the set that
            deferred to it.
        adapted: For a set adapted to a dataset from its reviews: what its
            :data:`ADAPTED_FILE` records.
    """

    name: str
    folder: Path
    model_key: str
    detectors: tuple[ArtifactCard, ...]
    broken: tuple[BrokenArtifact, ...]
    other_models: tuple[str, ...]
    stamp: str
    foreign: tuple[tuple[str, str], ...] = ()
    error: str | None = None
    experts: Mapping[str, DetectorSet] = field(default_factory=dict)
    expert_problems: tuple[str, ...] = ()
    deferred_from: str | None = None
    adapted: AdaptedInfo | None = None

    @property
    def fitted(self) -> list[Detector]:
        """The fitted detectors, in the set's order."""
        return [c.detector for c in self.detectors]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.detectors)

    def card(self, name: str) -> ArtifactCard:
        """The card of detector ``name``.

        Raises:
            DataError: The set has no loaded detector of that name (the message says
                why when its artifact is broken, and lists the ones there are).
        """
        for c in self.detectors:
            if c.name == name:
                return c
        for b in self.broken:
            if b.name == name:
                raise DataError(
                    f"the {self.name} set's {name} artifact cannot be loaded: {b.reason}"
                )
        for det, model in self.foreign:
            if det == name:
                raise DataError(
                    f"the {self.name} set's {name} (in {self.folder}) was trained on model "
                    f"{model!r}, not {self.model_key!r}; load the model it was trained on, "
                    f"or train one for this model (`ragscope train --detectors {name}`)"
                )
        raise DataError(
            f"the {self.name} detector set has no {name} for this model; it has "
            f"{', '.join(self.names) or 'none'} (train it with `ragscope train --detectors {name}`)"
        )

    def subset(self, names: list[str] | tuple[str, ...]) -> DetectorSet:
        """This set with only the detectors ``names`` (``--detectors A,B``), in that order
        (its experts too: an answer one judges gets the same detectors).

        Raises:
            DataError: A name the set does not have (see :meth:`card`).
        """
        cards = tuple(self.card(n) for n in dict.fromkeys(names))
        chosen = [c.name for c in cards]
        experts = {
            ds: replace(e, detectors=tuple(c for n in chosen for c in e.detectors if c.name == n))
            for ds, e in self.experts.items()
        }
        return replace(self, detectors=cards, experts=experts)

    def for_dataset(self, dataset: str | None) -> DetectorSet:
        """The set that judges answers of ``dataset``: the expert trained on it (or on
        another split of it), else this set."""
        found = match_dataset(self.experts, dataset)
        return self if found is None else found[1]

    def for_example(self, example: RAGExample) -> DetectorSet:
        """The set that judges ``example``'s answer (:meth:`for_dataset` of its
        provenance's dataset): what every page, command and the Python API judge it with."""
        return self.for_dataset(example.provenance.dataset)

    def for_examples(self, examples: Iterable[RAGExample]) -> DetectorSet:
        """The set that judges all of ``examples`` (one dataset's answers: that dataset's
        expert), else this set: what a page shows as the detectors of a dataset, e.g. the
        token thresholds a scan starts from. Each answer is still judged by
        :meth:`for_example`."""
        sets = {id(s): s for s in (self.for_example(e) for e in examples)}
        return next(iter(sets.values())) if len(sets) == 1 else self

    def stale(self, kept_set_id: str, example: RAGExample) -> str | None:
        """Why a result kept with :attr:`set_id` ``kept_set_id`` is not what the set
        that judges ``example`` now would show (``None``: it is), in words every page
        shows above such a result: computed with the previous set, named, beside the set
        in use now."""
        now = self.for_example(example)
        if kept_set_id == now.set_id:
            return None
        was = (
            f"the {kept_set_id.split('@')[0]} set (`{kept_set_id}`)"
            if kept_set_id
            else ("a set it did not record")
        )
        return (
            f"computed with the previous set, {was}; the {now.name} set (`{now.set_id}`) "
            "judges this answer now"
        )

    @property
    def judge_name(self) -> str | None:
        """The detector that gives the overall verdict (:data:`ANSWER_JUDGE`), if loaded."""
        return ANSWER_JUDGE if ANSWER_JUDGE in self.names else None

    @property
    def trained_on(self) -> tuple[str, ...]:
        """The distinct training-data labels the loaded detectors record, in order."""
        return tuple(dict.fromkeys(c.trained_on for c in self.detectors if c.trained_on))

    @property
    def cache_id(self) -> str:
        """Identifies this set of detectors (and its experts), for caches of its verdicts."""
        own = f"{self.model_key}|{self.folder}|{self.stamp}|{','.join(self.names)}"
        return "+".join([own, *(e.cache_id for e in self.experts.values())])

    @property
    def set_id(self) -> str:
        """The id every verdict of this set carries: its name and 8 hex digits of
        :attr:`cache_id` (``default+ragscope-demo-1f073a78@3c9e...``). It changes when an
        artifact of the set (or of an expert it defers to) is added, removed or written
        again, e.g. when the set is adapted anew, so a kept result of the previous state
        is told apart from one of this state."""
        digest = hashlib.sha256(self.cache_id.encode("utf-8")).hexdigest()[:8]
        return f"{self.name}@{digest}"


def artifacts_stamp(root: Path) -> str:
    """Changes whenever an artifact file under ``root`` is added, removed or rewritten."""
    parts: list[str] = []
    for path in sorted(root.glob("*/*.json")) if root.is_dir() else ():
        try:
            stat = path.stat()
        except OSError:  # removed while listing: the next load sees the new state
            continue
        parts.append(f"{path.relative_to(root)}:{stat.st_mtime_ns}:{stat.st_size}")
    return hashlib.sha256("\n".join(parts).encode("utf-8")).hexdigest()[:16]


def resolve_set(name: str | None = None) -> tuple[str, Path, str | None]:
    """The set's name and folder by the module's rule (before falling back to the set
    trained on this machine), and why a requested set could not be used (then the
    default set is used).

    Args:
        name: A shipped set asked for by name (``--set NAME``); ``None``: the
            environment's (``RAGSCOPE_DETECTORS_DIR``, ``RAGSCOPE_DETECTOR_SET``).
    """
    try:
        if name is not None:
            if name in (CUSTOM_SET, TRAINED_SET):
                raise DataError(
                    f"{name!r} is not a set to ask for by name: set RAGSCOPE_DETECTORS_DIR to "
                    "a folder of artifacts, or train detectors here for the model"
                )
            return name, detector_set_dir(name), None
        return detector_set_name(), shipped_dir(), None
    except DataError as e:
        return DEFAULT_SET, detector_set_dir(DEFAULT_SET), str(e)


def _read_folder(model_key: str, root: Path, name: str, stamp: str) -> DetectorSet:
    """Load every artifact in ``root`` made for ``model_key`` (each cfg.json read once
    here, once more verified by the detector's loader)."""
    cards: list[ArtifactCard] = []
    broken: list[BrokenArtifact] = []
    others: set[str] = set()
    foreign: list[tuple[str, str]] = []
    registered = set(available_detectors())
    for sub in sorted(root.iterdir()) if root.is_dir() else ():
        if sub.name not in registered or not (sub / "cfg.json").is_file():
            continue
        try:
            cfg = artifact_info(sub)
        except DataError:
            broken.append(
                BrokenArtifact(name=sub.name, folder=sub, reason="its cfg.json cannot be read")
            )
            continue
        model = cfg.get("model")
        if model != model_key:
            if isinstance(model, str) and model:
                others.add(model)
                foreign.append((sub.name, model))
            continue
        try:
            det = load_shipped(sub.name, model_key, root)
            cards.append(ArtifactCard.of(sub.name, sub, det, cfg))
        except RagscopeError as e:
            broken.append(BrokenArtifact(name=sub.name, folder=sub, reason=str(e)))
        except (KeyError, TypeError, ValueError) as e:
            # Well-formed JSON with the wrong content: the loaders index into it directly.
            reason = f"malformed artifact ({brief(e)})"
            broken.append(BrokenArtifact(name=sub.name, folder=sub, reason=reason))
    return DetectorSet(
        name=name,
        folder=root,
        model_key=model_key,
        detectors=tuple(cards),
        broken=tuple(broken),
        other_models=tuple(sorted(others)),
        foreign=tuple(foreign),
        stamp=stamp,
    )


_LOCK = threading.Lock()
_LOADED: OrderedDict[tuple[str, str, str], DetectorSet] = OrderedDict()
_KEEP = 8


def _kept(
    cache: OrderedDict[Any, DetectorSet], key: Any, make: Callable[[], DetectorSet]
) -> DetectorSet:
    """``cache[key]``, else ``make()`` kept there (the :data:`_KEEP` most recently used)."""
    with _LOCK:
        found = cache.get(key)
        if found is not None:
            cache.move_to_end(key)
            return found
    made = make()
    with _LOCK:
        cache[key] = made
        while len(cache) > _KEEP:
            cache.popitem(last=False)
    return made


def _folder_set(model_key: str, root: Path, name: str) -> DetectorSet:
    """:func:`_read_folder`, kept per model, folder and stamp (reloaded when files change)."""
    stamp = artifacts_stamp(root)
    loaded = _kept(
        _LOADED, (model_key, str(root), stamp), lambda: _read_folder(model_key, root, name, stamp)
    )
    return loaded if loaded.name == name else replace(loaded, name=name)


EXPERTS_FILE = "experts.json"
"""The file of a set folder that names the sets it defers to."""

MAX_EXPERTS = 8
"""The most experts a set may name."""


def expert_names(root: Path) -> tuple[str, ...]:
    """The expert sets ``root``'s :data:`EXPERTS_FILE` names (none without the file).

    Raises:
        DataError: The file is unreadable, too large, or not ``{"experts": [set names]}``.
    """
    path = root / EXPERTS_FILE
    if not path.is_file():
        return ()
    value = read_json_file(path, 64 * 1024, what="experts file", follow_symlinks=False)
    names = value.get("experts") if isinstance(value, dict) and set(value) == {"experts"} else None
    if (
        not isinstance(names, list)
        or not all(isinstance(n, str) and is_set_name(n) for n in names)
        or len(names) > MAX_EXPERTS
        or len(set(names)) != len(names)
    ):
        raise DataError(
            f'must be {{"experts": [...]}} naming at most {MAX_EXPERTS} distinct shipped '
            'sets, e.g. {"experts": ["ragtruth"]}',
            source=str(path),
        )
    return tuple(names)


def _expert(parent: DetectorSet, name: str) -> tuple[str, DetectorSet]:
    """The expert set ``name`` of ``parent``, by its one training dataset.

    Raises:
        DataError: Why it cannot be used.
    """
    if name in (parent.name, DEFAULT_SET):
        raise DataError(f"the expert {name!r} is the set itself or the default set")
    root = detector_set_dir(name)
    found = _folder_set(parent.model_key, root, name)
    if not found.detectors:
        raise DataError(f"the expert set {name!r} has no detectors for this model")
    if found.broken:
        b = found.broken[0]
        raise DataError(f"the {b.name} of the expert set {name!r} cannot be loaded: {b.reason}")
    datasets = {c.training.datasets for c in found.detectors}
    if len(datasets) != 1 or len(next(iter(datasets))) != 1:
        raise DataError(
            f"the expert set {name!r} must be trained on one dataset alone; its detectors "
            f"record {sorted(d for ds in datasets for d in ds) or 'none'}"
        )
    mine = {c.name: c.detector.config.feature_hash() for c in parent.detectors}
    for c in found.detectors:
        if mine.get(c.name) != c.detector.config.feature_hash():
            raise DataError(
                f"the {c.name} of the expert set {name!r} reads other features than the "
                f"{parent.name} set's (or the {parent.name} set has none): an answer would be "
                "traced twice; train the expert with the same member options"
            )
    return next(iter(datasets))[0], replace(found, deferred_from=parent.name)


ADAPTED_FILE = "adapted.json"
"""The file of a derived set's folder that names its base set and dataset."""

MAX_ADAPTED = 64
"""The most derived sets of one model that are read (a bound on a crowded folder)."""

_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, kw_only=True)
class AdaptedInfo:
    """What a derived set's :data:`ADAPTED_FILE` says: the set it adapts, for which
    dataset, from which reviews, and when (:mod:`core.evaluation.adapt` writes it).

    Attributes:
        n_reviews: Answers with a label it was fitted from.
        n_random: Of them, reviewed in the random order (those calibrate).
        refit: Whether its ensemble got a stacker of the dataset's own fitted on them.
    """

    base_set: str
    dataset: str
    reviews_hash: str
    n_reviews: int
    n_random: int
    created_at: str
    refit: bool = False

    KEYS = frozenset({"base_set", "dataset", "reviews_hash", "n_reviews", "n_random", "created_at"})
    OPTIONAL = frozenset({"refit"})  # absent from files written before it existed

    def to_json(self) -> dict[str, str | int | bool]:
        return {k: getattr(self, k) for k in sorted(self.KEYS | self.OPTIONAL)}

    @classmethod
    def read(cls, folder: Path) -> AdaptedInfo:
        """Read and check ``folder``'s :data:`ADAPTED_FILE` (bounded; exact keys).

        Raises:
            DataError: Missing, unreadable, or not that shape.
        """
        path = folder / ADAPTED_FILE
        value = read_json_file(path, 16 * 1024, what="adapted-set file", follow_symlinks=False)
        if not isinstance(value, dict) or set(value) - cls.OPTIONAL != cls.KEYS:
            raise DataError(
                f"must hold exactly {sorted(cls.KEYS)}: adapt the set again from the Review "
                "page or `ragscope adapt`",
                source=str(path),
            )
        base, dataset, digest = value["base_set"], value["dataset"], value["reviews_hash"]
        if not (isinstance(base, str) and (is_set_name(base) or base in (CUSTOM_SET, TRAINED_SET))):
            raise DataError("base_set must be a detector set's name", source=str(path))
        if not (isinstance(dataset, str) and 0 < len(dataset) <= 200 and dataset.isprintable()):
            raise DataError(
                "dataset must be one printable line of at most 200 characters", source=str(path)
            )
        if not (isinstance(digest, str) and _HEX64.fullmatch(digest)):
            raise DataError("reviews_hash must be 64 hex digits", source=str(path))
        counts = (value["n_reviews"], value["n_random"])
        if (
            not all(type(c) is int and 0 <= c <= 10_000_000 for c in counts)
            or counts[1] > counts[0]
        ):
            raise DataError(
                "n_reviews and n_random must be counts, n_random <= n_reviews", source=str(path)
            )
        when = value["created_at"]
        if not (isinstance(when, str) and len(when) <= 40 and when.isprintable()):
            raise DataError("created_at must be a time", source=str(path))
        refit = value.get("refit", False)
        if type(refit) is not bool:
            raise DataError("refit must be true or false", source=str(path))
        return cls(
            base_set=base,
            dataset=dataset,
            reviews_hash=digest,
            n_reviews=counts[0],
            n_random=counts[1],
            created_at=when,
            refit=refit,
        )


def adapted_set_name(base_set: str, dataset: str) -> str:
    """The derived set's name (and folder): the base set's name, ``+``, the dataset's
    name in lower-case letters, digits, ``_`` and ``-`` (at most 48), then 8 hex digits
    of its SHA-256 (two datasets never share a folder)."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", dataset.lower()).strip("-")[:48]
    digest = hashlib.sha256(dataset.encode("utf-8")).hexdigest()[:8]
    return f"{base_set}+{slug or 'dataset'}-{digest}"


def _adapted_folders(model_key: str) -> list[Path]:
    root = adapted_sets_dir(model_key)
    if not root.is_dir():
        return []
    found = sorted(
        p
        for p in root.iterdir()
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
    )
    return found[:MAX_ADAPTED]


def _adapted_stamp(model_key: str) -> str:
    parts = []
    for p in _adapted_folders(model_key):
        try:
            stat = (p / ADAPTED_FILE).lstat()
            parts.append(f"{p.name}:{stat.st_mtime_ns}:{stat.st_size}:{artifacts_stamp(p)}")
        except OSError:
            parts.append(f"{p.name}:?")
    return "|".join(parts)


def _adapted(parent: DetectorSet) -> tuple[dict[str, DetectorSet], list[str]]:
    """The sets derived from ``parent`` for a dataset each (:data:`ADAPTED_FILE` names
    it as the base), checked like experts; and why any other is not used."""
    out: dict[str, DetectorSet] = {}
    problems: list[str] = []
    for folder in _adapted_folders(parent.model_key):
        try:
            info = AdaptedInfo.read(folder)
        except DataError as e:
            problems.append(f"the adapted set {folder.name!r}: {e}")
            continue
        if info.base_set != parent.name:
            continue
        found = _folder_set(parent.model_key, folder, folder.name)
        problem = None
        if not found.detectors or found.broken:
            why = found.broken[0].reason if found.broken else "no detectors for this model"
            problem = f"the adapted set {folder.name!r} cannot be used: {why}"
        else:
            mine = {c.name: c.detector.config.feature_hash() for c in parent.detectors}
            if any(mine.get(c.name) != c.detector.config.feature_hash() for c in found.detectors):
                problem = (
                    f"the adapted set {folder.name!r} reads other features than the "
                    f"{parent.name} set: adapt it again"
                )
        if problem is not None:
            problems.append(problem)
            continue
        out[info.dataset] = replace(found, deferred_from=parent.name, adapted=info)
    return out, problems


def _experts_stamp(found: DetectorSet) -> str:
    """Changes when ``found``'s experts file or an artifact of a set it may name changes
    (what :func:`_with_experts`' checks depend on)."""
    path = found.folder / EXPERTS_FILE
    adapted = _adapted_stamp(found.model_key)
    try:
        stat = path.lstat()
        own = f"{stat.st_mtime_ns}:{stat.st_size}:{adapted}"
    except OSError:
        return f"none:{adapted}"
    try:
        names = expert_names(found.folder)
    except DataError:
        names = ()
    stamps = []
    for n in names:
        try:
            root = detector_set_dir(n)
            stamps.append(f"{n}:{root}:{artifacts_stamp(root)}")
        except DataError:
            stamps.append(f"{n}:?")
    return "|".join([own, *stamps])


_CHECKED: OrderedDict[tuple[str, str, str, str, str], DetectorSet] = OrderedDict()


def _with_experts(found: DetectorSet) -> DetectorSet:
    """``found`` with the experts its folder names, checked once per state of the files
    (an expert's own experts are not read: one level of deferring)."""
    key = (found.model_key, str(found.folder), found.name, found.stamp, _experts_stamp(found))
    return _kept(_CHECKED, key, lambda: _check_experts(found))


def _check_experts(found: DetectorSet) -> DetectorSet:
    """``found`` with its usable experts, and why each other named one is not used
    (nothing for a set with no detectors for the model: it judges nothing)."""
    if not found.detectors:
        return found
    adapted, problems = _adapted(found)
    try:
        names = expert_names(found.folder)
    except DataError as e:
        return replace(found, experts=adapted, expert_problems=(*problems, str(e)))
    experts: dict[str, DetectorSet] = {}
    for name in names:
        try:
            dataset, expert = _expert(found, name)
        except DataError as e:
            problems.append(str(e))
            continue
        if dataset in experts:
            problems.append(f"two experts for {dataset}: {experts[dataset].name} and {name}")
            continue
        experts[dataset] = expert
    # A set adapted to a dataset from its reviews judges that dataset's answers, before
    # an expert trained on it (it was derived from that expert when there was one).
    return replace(found, experts={**experts, **adapted}, expert_problems=tuple(problems))


def load_set(model_key: str, name: str | None = None) -> DetectorSet:
    """The detector set that judges answers for the model ``model_key``, by the rule of
    this module; loaded once per process and folder state. A broken artifact does not
    raise: it is listed in :attr:`DetectorSet.broken` and the others still load.

    Args:
        model_key: ``ModelInfo.key`` of the loaded model.
        name: A shipped set by name; ``None``: the environment's, else ``default``.
    """
    set_name, root, error = resolve_set(name)
    found = _folder_set(model_key, root, set_name)
    if not found.detectors and not found.broken:
        own = model_detectors_dir(model_key)
        if own.is_dir():
            trained = _folder_set(model_key, own, TRAINED_SET)
            if trained.detectors or trained.broken:
                return replace(
                    trained, other_models=found.other_models, foreign=found.foreign, error=error
                )
    return replace(_with_experts(found), error=error)


def folder_set(model_key: str, root: Path) -> DetectorSet:
    """The set in folder ``root`` (``--artifacts DIR``), with the experts its
    :data:`EXPERTS_FILE` names: a shipped set's folder by its name, any other
    ``custom``."""
    found = root.resolve()
    name = CUSTOM_SET
    for candidate in (DEFAULT_SET, found.name):
        try:
            if detector_set_dir(candidate).resolve() == found:
                name = candidate
                break
        except DataError:  # not a shipped set's name
            continue
    return _with_experts(_folder_set(model_key, root, name))


def set_detector(model_key: str, name: str, set_name: str | None = None) -> Detector:
    """One fitted detector of the set that applies for ``model_key`` (what ``mitigate``,
    ``bench`` and the analysis commands judge with).

    Raises:
        DataError: The set has no such detector for the model, or its artifact is broken.
    """
    return load_set(model_key, set_name).card(name).detector
