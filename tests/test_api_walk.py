"""The property-based walk of the public API in the test suite: every drawn call (shapes, dtypes, flags, NaN,
frozen and shared parameters, and the poisons of the entry families; see tests/api_walk.py) ends in a clear error
or a result that passes its reference check, and every public callable of every subpackage is reached by some
family. Bounded and derandomized, so make test spends a few seconds per family and CI draws the same examples."""
from __future__ import annotations

import pytest
from api_walk import EXEMPT, FAMILIES, POISONS, classify, covered, public_callables
from hypothesis import HealthCheck, given, settings

FAMILY_LIST = [(sub, fam) for sub, fams in FAMILIES.items() for fam in fams]
EXAMPLES = {"losses_macro_f1": 25}      # scikit-learn's f1_score is the costly reference
ENTRY_EXAMPLES = 30                     # the entry families: a sample of (name, poison) per subpackage


@pytest.mark.parametrize("subpackage,family", FAMILY_LIST, ids=[f.__name__ for _, f in FAMILY_LIST])
def test_clear_error_or_correct_result(subpackage, family):
    n = ENTRY_EXAMPLES if family.__name__.endswith("_entry") else EXAMPLES.get(family.__name__, 60)

    @settings(max_examples=n, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(family())
    def walk(case):
        kind, detail = classify(case)
        assert kind in ("clear", "valid"), f"{case.subpackage}.{case.name} [{case.note}]: {kind}: {detail}"

    walk()


def test_every_public_callable_has_a_family():
    """The walk cannot miss a name: each callable in a subpackage's __all__ (and utils') is reached by a family,
    or is a record / signal exempted with its reason; an exemption for a name that is not public (or is walked
    anyway) is stale."""
    public = set(public_callables())
    missing = sorted(public - covered() - set(EXEMPT))
    assert not missing, f"public callables without a family: {missing}"
    stale = sorted(set(EXEMPT) - public) + sorted(set(EXEMPT) & covered())
    assert not stale, f"stale exemptions: {stale}"
    assert all(isinstance(r, str) and len(r) > 10 for r in EXEMPT.values()), "every exemption gives its reason"


def test_the_coverage_check_can_fail(monkeypatch):
    """Remove one family's names: the coverage test must then report them."""
    import api_walk
    fam = next(f for fams in FAMILIES.values() for f in fams if getattr(f, "covers", None))
    monkeypatch.setattr(fam, "covers", set())
    assert set(public_callables()) - api_walk.covered() - set(EXEMPT)


def test_the_poisons_include_the_kinds_of_issue_42():
    kinds = " ".join(POISONS)
    for k in ("meta", "complex", "empty", "0-d", "NaN", "non-contiguous", "float16", "string", "None", "numpy",
              "ModelOutput", "huge", "train-mode"):
        assert k in kinds, k


def test_the_classifier_tells_the_kinds_apart():
    """The oracle itself: a package validator's error is clear, a library's internal error obscure, an accepted
    invalid input or a wrong result silent."""
    import torch
    from api_walk import Case

    from taskloss.validation import check_positive
    assert classify(Case("utils", "x", lambda: check_positive("x", -1.0), True))[0] == "clear"
    assert classify(Case("utils", "x", lambda: torch.randn(2, generator=0), True))[0] == "obscure"
    assert classify(Case("utils", "x", lambda: 1.0, True))[0] == "silent"

    def wrong(r):
        assert r == 2.0
    assert classify(Case("utils", "x", lambda: 1.0, False, wrong))[0] == "silent"
    assert classify(Case("utils", "x", lambda: 2.0, False, wrong))[0] == "valid"
