"""A table gradient's rows summed by distinct row, in torch ops: the definition."""

import torch


def row_sums(values: torch.Tensor, order: torch.Tensor, starts: torch.Tensor, k: int) -> torch.Tensor:
    """[k, D]: for each of the k distinct rows, the sum of its gradient rows of `values` [N, D], read in
    `order` (`starts` marks where each distinct row begins in that order)."""
    segment = torch.cumsum(starts, 0) - 1  # each sorted position's distinct row
    return values.new_zeros((k, values.shape[1])).index_add_(0, segment, values.index_select(0, order))
