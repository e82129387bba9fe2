"""Positions: one meaning of an index under no, left and right padding (docs/DESIGN.md, "Positions")."""

import pytest
import torch

from captum_cw.errors import InputError
from captum_cw.positions import Positions

LEFT = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)  # example 1: real tokens 2..3
RIGHT = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)  # example 1: real tokens 0..1


@pytest.mark.parametrize("padding, last", [(None, [3, 3]), (LEFT, [3, 3]), (RIGHT, [3, 1])])
def test_a_negative_index_counts_back_from_each_examples_last_real_token(padding, last):
    rows = Positions.shared([-1]).rows(padding, 2, 4)
    assert rows[:, 0].tolist() == last
    assert Positions.one_per_example(-1).rows(padding, 2, 4)[:, 0].tolist() == last


def test_a_non_negative_index_is_the_padded_row_and_padding_is_refused_unless_allowed():
    assert Positions.shared([3, 0]).rows(None, 2, 4).tolist() == [[3, 0], [3, 0]]
    with pytest.raises(InputError, match="query position 0 is padding in example 1 .*positions 2 to 3"):
        Positions.shared([0]).rows(LEFT, 2, 4)
    assert Positions.shared([0], allow_padding=True).rows(LEFT, 2, 4).tolist() == [[0], [0]]
    with pytest.raises(InputError, match="position 3 of example 1 is not one of its real tokens \\(0..1\\)"):
        Positions.one_per_example([3, 3]).rows(RIGHT, 2, 4)
    with pytest.raises(InputError, match="query_positions -4 is outside example 1's 4 positions"):
        Positions.shared([-4]).rows(RIGHT, 2, 4)


def test_the_layout_computes_shared_rows_in_order_and_a_union_otherwise():
    shared = Positions.shared([2, -1]).layout(LEFT, 2, 4)
    assert shared.computed.tolist() == [2, 3] and shared.slots is None
    own = Positions.shared([-2, -1]).layout(RIGHT, 2, 4)
    assert own.computed.tolist() == [0, 1, 2, 3] and own.slots.tolist() == [[2, 3], [0, 1]]
