"""explr.book.verdicts: plan v3's decision rule -- the paired one-sided and equivalence tests against scipy, and
Holm's adjustment."""
import numpy as np
import pytest
from scipy import stats

import explr.book.verdicts as rule
from explr.book.verdicts import holm


def test_holm_adjustment_over_the_last_axis():
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    p = np.random.default_rng(1).uniform(0, 0.2, size=(3, 9))
    adjusted = holm(p)
    assert (adjusted >= p).all() and (adjusted <= np.minimum(1, 9 * p) + 1e-15).all()
    np.testing.assert_array_equal(adjusted[1], holm(p[1]))  # rows adjusted one by one
    assert holm([0.5]).tolist() == [0.5]


def test_the_paired_tests_match_scipy_and_a_two_sided_rule_would_not():
    rng = np.random.default_rng(0)
    two_sided_differs = False
    for _ in range(60):
        n = int(rng.integers(2, 12))
        b = rng.normal(0.82, 0.004, n)
        a = b + rng.normal(rng.uniform(-0.005, 0.005), 0.003, n)
        p = rule.paired_p(a - b, "a better", 0.00384)
        assert p == pytest.approx(stats.ttest_rel(a, b, alternative="greater").pvalue, rel=1e-9, abs=1e-15)
        two_sided_differs |= abs(p - stats.ttest_rel(a, b).pvalue) > 1e-3
        d = a - b
        half90 = stats.t.ppf(0.95, n - 1) * d.std(ddof=1) / np.sqrt(n)
        inside = -0.00384 < d.mean() - half90 and d.mean() + half90 < 0.00384
        assert (rule.paired_p(d, "equivalent", 0.00384) < 0.05) == inside
    assert two_sided_differs
    flat = [float(rule.paired_p(np.full(3, x), h, 0.004)) for x, h in
            [(0.0, "a better"), (0.001, "a better"), (0.001, "equivalent"), (0.005, "equivalent")]]
    assert flat == [1.0, 0.0, 0.0, 1.0]
    for bad in [dict(differences=[0.1]), dict(hypothesis="none")]:
        with pytest.raises(ValueError, match="needs >= 2 pairs"):
            rule.paired_p(**{"differences": [0.1, 0.2], "hypothesis": "a better", "margin": 0.004, **bad})
