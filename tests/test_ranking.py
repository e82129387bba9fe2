"""Bins, ranking, ties and eligibility on hand-made numbers."""

import pytest
import torch

from captum_cw.evaluation.ranking import aopc, removal_from_ranking, top_k_count


def test_top_k_count_rounds_up_to_at_least_one():
    n = torch.tensor([0, 1, 7, 10, 100])
    assert top_k_count(n, 1).tolist() == [0, 1, 1, 1, 1]
    assert top_k_count(n, 10).tolist() == [0, 1, 1, 1, 10]
    assert top_k_count(n, 50).tolist() == [0, 1, 4, 5, 50]
    with pytest.raises(ValueError, match="percentages in"):
        top_k_count(n, 0)


def test_comprehensiveness_removes_the_top_and_sufficiency_the_rest():
    scores = torch.tensor([0.1, 0.5, -0.9, 0.3])
    eligible = torch.ones(4, dtype=torch.bool)
    assert removal_from_ranking(scores, eligible, 50, "comprehensiveness").tolist() == [False, True, False, True]
    assert removal_from_ranking(scores, eligible, 50, "sufficiency").tolist() == [True, False, True, False]
    # by absolute value -0.9 ranks first
    assert removal_from_ranking(scores, eligible, 25, "comprehensiveness", absolute=True).tolist() == [
        False, False, True, False]


def test_ties_break_by_position_and_ineligible_keys_stay():
    scores = torch.tensor([[0.2, 0.2, 0.2, 0.9]])
    eligible = torch.tensor([[True, True, True, False]])  # the 0.9 key is special (or in the future)
    removed = removal_from_ranking(scores, eligible, 34, "comprehensiveness")  # ceil(0.34 * 3) = 2
    assert removed.tolist() == [[True, True, False, False]]
    kept_only_top = removal_from_ranking(scores, eligible, 34, "sufficiency")
    assert kept_only_top.tolist() == [[False, False, True, False]]


def test_rows_are_ranked_independently_with_causal_eligibility():
    scores = torch.tensor([[5.0, 0.0, 0.0], [1.0, 2.0, 0.0], [3.0, 1.0, 2.0]])
    eligible = torch.ones(3, 3, dtype=torch.bool).tril()
    removed = removal_from_ranking(scores, eligible, 50, "comprehensiveness")
    assert removed.tolist() == [[True, False, False], [False, True, False], [True, False, True]]


def test_aopc_is_the_mean_over_bins():
    assert aopc([0.1, 0.2, 0.6]) == pytest.approx(0.3)
