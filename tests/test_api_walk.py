"""The property-based walk of the public API in the test suite: every drawn call (shapes, dtypes, flags, NaN,
frozen and shared parameters; see tests/api_walk.py) ends in a clear error or a result that passes its reference
check. Bounded and derandomized, so make test spends a few seconds per family and CI draws the same examples."""
from __future__ import annotations

import pytest
from api_walk import FAMILIES, classify
from hypothesis import HealthCheck, given, settings

FAMILY_LIST = [(sub, fam) for sub, fams in FAMILIES.items() for fam in fams]
EXAMPLES = {"losses_macro_f1": 25}      # scikit-learn's f1_score is the costly reference


@pytest.mark.parametrize("subpackage,family", FAMILY_LIST, ids=[f.__name__ for _, f in FAMILY_LIST])
def test_clear_error_or_correct_result(subpackage, family):
    @settings(max_examples=EXAMPLES.get(family.__name__, 60), deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(family())
    def walk(case):
        kind, detail = classify(case)
        assert kind in ("clear", "valid"), f"{case.subpackage}.{case.name} [{case.note}]: {kind}: {detail}"

    walk()


def test_the_classifier_tells_the_kinds_apart():
    """The oracle itself: a package validator's error is clear, a library's internal error obscure, an accepted
    invalid input or a wrong result silent."""
    import torch
    from api_walk import Case

    from taskloss.utils import check_positive
    assert classify(Case("utils", "x", lambda: check_positive("x", -1.0), True))[0] == "clear"
    assert classify(Case("utils", "x", lambda: torch.randn(2, generator=0), True))[0] == "obscure"
    assert classify(Case("utils", "x", lambda: 1.0, True))[0] == "silent"

    def wrong(r):
        assert r == 2.0
    assert classify(Case("utils", "x", lambda: 1.0, False, wrong))[0] == "silent"
    assert classify(Case("utils", "x", lambda: 2.0, False, wrong))[0] == "valid"
