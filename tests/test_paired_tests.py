"""The paired tests of captum_cw.statistics against scipy.stats and a brute-force enumeration."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from captum_cw.errors import InputError
from captum_cw.statistics import paired_comparison, sign_test, wilcoxon_signed_rank, wilson_interval


@pytest.mark.parametrize("wins, losses", [(0, 0), (1, 0), (3, 3), (7, 2), (0, 12), (25, 75), (40, 41)])
def test_sign_test_is_scipy_binomial_test(wins, losses):
    expected = 1.0 if wins + losses == 0 else stats.binomtest(wins, wins + losses, 0.5).pvalue
    assert sign_test(wins, losses) == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_sign_test_counts_every_split_at_least_as_uneven():
    n, wins = 9, 2
    splits = list(itertools.product((0, 1), repeat=n))  # every outcome of n fair coins
    extreme = sum(min(sum(s), n - sum(s)) <= min(wins, n - wins) for s in splits)
    assert sign_test(wins, n - wins) == pytest.approx(extreme / 2 ** n)


@pytest.mark.parametrize("seed", range(6))
def test_wilcoxon_is_scipy_normal_approximation(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 80))
    differences = rng.normal(0.3 * (seed - 2), 1, n)
    if seed % 2:  # zeros and tied absolute values, which the zero and tie corrections handle
        differences = np.round(differences, 1)
        differences[: n // 5] = 0.0
    expected = stats.wilcoxon(differences, zero_method="wilcox", correction=False, method="approx").pvalue
    assert wilcoxon_signed_rank(differences) == pytest.approx(expected, rel=1e-9)


def test_wilcoxon_of_no_nonzero_difference_is_nan():
    assert math.isnan(wilcoxon_signed_rank([0.0, 0.0]))


def test_paired_comparison_counts_wins_by_direction():
    first, second = [3.0, 1.0, 2.0, 5.0, 4.0], [1.0, 1.0, 3.0, 2.0, 0.0]
    higher = paired_comparison(first, second)
    assert (higher["n"], higher["wins"], higher["ties"]) == (5, 3, 1)
    assert higher["win_rate"] == 3 / 5 and (higher["win_low"], higher["win_high"]) == wilson_interval(3, 5)
    assert higher["sign_p"] == pytest.approx(stats.binomtest(3, 4).pvalue)
    differences = np.subtract(first, second)
    assert higher["wilcoxon_p"] == pytest.approx(stats.wilcoxon(differences, method="approx").pvalue)
    assert higher["mean_difference"] == pytest.approx(differences.mean())
    lower = paired_comparison(first, second, higher_is_better=False)
    assert (lower["wins"], lower["ties"], lower["mean_difference"]) == (1, 1, pytest.approx(-differences.mean()))


def test_paired_comparison_refuses_unpaired_values():
    with pytest.raises(InputError, match="same length"):
        paired_comparison([1.0, 2.0], [1.0])
