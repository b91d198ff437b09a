"""Issue 54, point 2: which part of the app explains a detector is the detector's trait
(``explained_on``), read through the registry; the pages and the CLI's analyses ask the
registry by role and hold no detector name of their own."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import ClassVar

import pytest

from core.detectors import DETECTORS
from core.detectors.cortex import CortexDetector
from core.detectors.registry import MEMBERS, Registry
from core.evaluation.recipe import DEFAULT_DETECTORS
from core.learning.contract import PAGE_ROLES, PageRole
from core.pipeline.sets import ANSWER_JUDGE
from core.pipeline.span_judge import span_judge

ROOT = Path(__file__).resolve().parents[2]


def test_every_role_is_explained_by_exactly_one_registered_detector() -> None:
    owners = {role: DETECTORS.explained(role) for role in PAGE_ROLES}
    for role, name in owners.items():
        assert role in DETECTORS.get(name).explained_on
    # Each claimed role is a known one; the composite explains no page of its own.
    for name in DETECTORS.names():
        assert DETECTORS.get(name).explained_on <= set(PAGE_ROLES), name
    assert not DETECTORS.get(DETECTORS.composite()).explained_on


def test_a_second_claimant_of_a_role_is_refused_by_name() -> None:
    class Rival(CortexDetector):
        name = "rival_heatmaps"

    registry = MEMBERS.extended(Rival)
    with pytest.raises(LookupError, match="2 registered detectors explain 'token-heatmaps'"):
        registry.explained("token-heatmaps")

    class Nobody(CortexDetector):
        name = "nobody"
        explained_on: ClassVar[frozenset[PageRole]] = frozenset()

    with pytest.raises(LookupError, match="0 registered detectors explain 'head-tokens'"):
        Registry([Nobody]).explained("head-tokens")


def test_a_roles_owner_moves_with_the_trait() -> None:
    class Heatmaps(CortexDetector):
        name = "heatmaps2"

    class Plain(CortexDetector):
        name = "plain_cortex"
        explained_on: ClassVar[frozenset[PageRole]] = frozenset()

    assert Registry([Plain, Heatmaps]).explained("token-heatmaps") == "heatmaps2"


def test_the_sets_judge_is_the_one_composite_detector() -> None:
    assert ANSWER_JUDGE == DETECTORS.composite()
    assert DETECTORS.get(ANSWER_JUDGE).composite
    with pytest.raises(LookupError, match="0 composite"):
        MEMBERS.composite()
    # The span judge of a set holding the composite is the composite, by its trait.
    ens = DETECTORS.make(ANSWER_JUDGE, members=["nll", "cortex"])
    ens.token_threshold_ = 0.5  # as a fitted token stacker leaves it
    assert span_judge([DETECTORS.make("cortex"), ens]) is ens


def test_what_train_trains_by_default_is_the_baselines_trait() -> None:
    assert DEFAULT_DETECTORS == DETECTORS.trained_by_default() == ("nll", "context_gain", "lexical")
    assert all(DETECTORS.get(n).trained_by_default for n in DEFAULT_DETECTORS)

    class Cheap(CortexDetector):
        name = "cheap"
        trained_by_default: ClassVar[bool] = True

    assert MEMBERS.extended(Cheap).trained_by_default()[-1] == "cheap"


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            # f-strings: their literal parts are prose, never a name looked up
            for part in node.values:
                if isinstance(part, ast.Constant):
                    part.value = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
    return out


def test_no_page_or_component_names_a_detector() -> None:
    """A string that is exactly a registered detector's name appears nowhere in app/."""
    names = set(DETECTORS.names())
    found = {
        str(p.relative_to(ROOT)): sorted(_string_constants(p) & names)
        for p in sorted((ROOT / "app").rglob("*.py"))
    }
    assert not {p: n for p, n in found.items() if n}, found
