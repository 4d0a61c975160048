# family: reduction  minimum bytes: 268451840  flops: 134217728
"""Euclidean (L2) norm of each row of an fp32 matrix."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x, ord=2, dim=1)


ROWS, COLS = 4096, 16384


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
