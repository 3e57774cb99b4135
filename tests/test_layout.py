"""Token layouts by hand: where each sequence sits in the model's rows, which hidden state scores which token, and
where each log-prob goes back."""

import pytest
import torch

from pickaxe.data.layout import plan_layout, sequence_bounds

# three sequences in the collector's layout: prompt left-padded, completion right-padded (0 is padding)
IDS = torch.tensor(
    [
        [0, 0, 5, 6, 7, 8, 0],  # prompt 5 6, completion 7 8
        [0, 9, 9, 9, 4, 0, 0],  # prompt 9 9 9, completion 4
        [3, 3, 2, 2, 2, 2, 2],  # prompt 3 3, completion 2 2 2 2 2
    ]
)
ATTN = (IDS > 0).long()
SCORE = torch.tensor(
    [
        [0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 1, 0, 0],
        [0, 0, 1, 1, 1, 1, 1],
    ]
)


def test_bounds_read_each_rows_run_and_scored_columns() -> None:
    b = sequence_bounds(ATTN, SCORE)
    assert b.start == [2, 1, 0] and b.length == [4, 4, 7]
    assert b.scored == [[2, 3], [3], [2, 3, 4, 5, 6]]


def test_padded_layout_moves_rows_left_and_scores_with_the_previous_hidden_state() -> None:
    layout = plan_layout(IDS, sequence_bounds(ATTN, SCORE), [1, 0], "padded")
    assert layout.input_ids.tolist() == [[9, 9, 9, 4], [5, 6, 7, 8]]  # as wide as the longest of the two
    assert layout.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert layout.padding_mask().tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
    assert layout.segments.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0]]
    assert layout.targets.tolist() == [4, 7, 8]
    assert layout.hidden_index.tolist() == [2, 4 + 1, 4 + 2]  # the token before each target, flat in [2, 4]
    assert layout.out_index.tolist() == [0 * 7 + 4, 1 * 7 + 4, 1 * 7 + 5]  # back in the [2, 7] block, rows [1, 0]
    out = layout.scatter(torch.tensor([-1.0, -2.0, -3.0]))
    assert out.tolist() == [[0, 0, 0, 0, -1, 0, 0], [0, 0, 0, 0, -2, -3, 0]]
    assert (layout.real_tokens, layout.slots) == (8, 8)


def test_packed_layout_shares_rows_and_restarts_positions() -> None:
    layout = plan_layout(IDS, sequence_bounds(ATTN, SCORE), None, "packed")
    # rows as wide as the longest (7); first fit by decreasing length: 2, then 0; 1 (4 long) no longer fits by 0
    assert layout.input_ids.tolist() == [[3, 3, 2, 2, 2, 2, 2], [5, 6, 7, 8, 0, 0, 0], [9, 9, 9, 4, 0, 0, 0]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 0, 0, 0], [0, 1, 2, 3, 0, 0, 0]]
    assert layout.segments.tolist() == [[0] * 7, [0, 0, 0, 0, -1, -1, -1], [0, 0, 0, 0, -1, -1, -1]]
    assert layout.targets.tolist() == [2, 2, 2, 2, 2, 7, 8, 4]
    assert (layout.real_tokens, layout.slots) == (15, 21)


def test_packed_layout_puts_short_sequences_in_one_row() -> None:
    ids = torch.tensor([[0, 0, 1, 2], [0, 0, 4, 5], [6, 7, 8, 9]])
    score = torch.tensor([[0, 0, 0, 1], [0, 0, 0, 1], [0, 0, 1, 1]])
    layout = plan_layout(ids, sequence_bounds((ids > 0).long(), score), None, "packed")
    assert layout.input_ids.tolist() == [[6, 7, 8, 9], [1, 2, 4, 5]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 0, 1]]
    assert layout.segments.tolist() == [[0, 0, 0, 0], [0, 0, 1, 1]]
    mask = layout.attention_mask()[1, 0].long().tolist()  # block-diagonal and causal within each sequence
    assert mask == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    assert layout.targets.tolist() == [8, 9, 2, 5]
    assert layout.hidden_index.tolist() == [1, 2, 4, 6]  # never the last token of the sequence before
    assert layout.scatter(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [[0, 0, 0, 3], [0, 0, 0, 4], [0, 0, 1, 2]]
    assert (layout.real_tokens, layout.slots) == (8, 8)


def test_bad_layouts_are_refused() -> None:
    gap = torch.tensor([[1, 0, 1, 1]])
    with pytest.raises(ValueError, match="contiguous"):
        sequence_bounds(gap, torch.tensor([[0, 0, 0, 1]]))
    with pytest.raises(ValueError, match="after each row's first token"):
        sequence_bounds(torch.tensor([[0, 1, 1]]), torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match="must be real tokens"):
        sequence_bounds(torch.tensor([[1, 1, 0]]), torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match="choose padded or packed"):
        plan_layout(IDS, sequence_bounds(ATTN, SCORE), None, "sorted")  # type: ignore[arg-type]
