"""The detector registry: detector classes by name, listed by explicit import.

:data:`MEMBERS` holds every single detector; :mod:`core.detectors` adds the ensemble,
which builds its members through :data:`MEMBERS` (no detector imports another).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from core.base.errors import DataError
from core.detectors.baselines import ContextGainDetector, LexicalDetector, NLLDetector
from core.detectors.cortex import CortexDetector
from core.detectors.interpdetect import InterpDetectDetector
from core.detectors.lookback_lens import LookbackLensDetector
from core.detectors.raglens import RaglensDetector
from core.detectors.redeep import RedeepChunkDetector, RedeepTokenDetector
from core.detectors.saplma import SaplmaDetector
from core.detectors.spad import SpadDetector
from core.engine.model import LoadedModel
from core.learning.contract import Detector, DetectorClass, PageRole


def _qualname(cls: DetectorClass) -> str:
    """The class's qualified name, for messages."""
    return str(getattr(cls, "__qualname__", cls))


class Registry:
    """Detector classes by their ``name``; a second class under a taken name is refused."""

    def __init__(self, classes: Iterable[DetectorClass] = ()) -> None:
        self._classes: dict[str, DetectorClass] = {}
        for cls in classes:
            self.add(cls)

    def add(self, cls: DetectorClass) -> DetectorClass:
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{_qualname(cls)} needs a non-empty class attribute `name`")
        have = self._classes.get(name)
        if have is not None and have is not cls:
            raise ValueError(f"a detector named {name!r} is already registered ({_qualname(have)})")
        self._classes[name] = cls
        return cls

    def extended(self, *classes: DetectorClass) -> Registry:
        """A new registry with this one's classes and ``classes``."""
        return Registry([*self._classes.values(), *classes])

    def get(self, name: str) -> DetectorClass:
        """The class registered as ``name``.

        Raises:
            DataError: No detector of that name (the message lists those there are).
        """
        if name not in self._classes:
            raise DataError(f"unknown detector {name!r}; available: {', '.join(self.names())}")
        return self._classes[name]

    def names(self) -> list[str]:
        return sorted(self._classes)

    def stacked(self) -> tuple[str, ...]:
        """What an ensemble stacks when given no member list: every class whose
        ``stacked_by_default`` trait says so, in the order they were registered."""
        return tuple(n for n, c in self._classes.items() if c.stacked_by_default)

    def trained_by_default(self) -> tuple[str, ...]:
        """What ``ragscope train`` trains when no detector is named: every class whose
        ``trained_by_default`` trait says so, in the order they were registered."""
        return tuple(n for n, c in self._classes.items() if c.trained_by_default)

    def composite(self) -> str:
        """The one registered detector that combines the others (a set's judge when the
        set holds it).

        Raises:
            LookupError: None, or more than one, is composite.
        """
        names = [n for n, c in self._classes.items() if c.composite]
        if len(names) != 1:
            raise LookupError(f"{len(names)} composite detectors registered ({', '.join(names)})")
        return names[0]

    def explained(self, role: PageRole) -> str:
        """The detector whose mechanism the app's ``role`` part explains (its
        ``explained_on`` trait names the role).

        Raises:
            LookupError: No registered detector, or more than one, claims the role.
        """
        names = [n for n, c in self._classes.items() if role in c.explained_on]
        if len(names) != 1:
            raise LookupError(
                f"{len(names)} registered detectors explain {role!r} ({', '.join(names) or 'none'}); "
                "exactly one must list it in its `explained_on` trait"
            )
        return names[0]

    def make(self, name: str, **config: Any) -> Detector:
        """A fresh, unfitted detector with ``config`` overriding the defaults."""
        cls = self.get(name)
        return cls(cls.Config.from_dict(config) if config else cls.Config())

    def runnable(self, model: LoadedModel) -> list[str]:
        """The detectors that can read ``model`` with their default config (a detector
        says why not through :meth:`~core.learning.contract.Detector.unavailable`, e.g. RAGLens
        without an SAE for that model)."""
        return [n for n in self.names() if self.make(n).unavailable(model.info) is None]


MEMBERS = Registry(
    [
        NLLDetector,
        ContextGainDetector,
        LexicalDetector,
        RedeepTokenDetector,
        RedeepChunkDetector,
        InterpDetectDetector,
        SpadDetector,
        RaglensDetector,
        CortexDetector,
        SaplmaDetector,
        LookbackLensDetector,
    ]
)
"""Every single (non-composite) detector: what an ensemble may combine."""
