# family: loss  minimum bytes: 536870916  flops: 402653184
"""Cosine similarity loss: mean over rows of 1 - cos(a_i, b_i), fp32."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.mean(1.0 - F.cosine_similarity(a, b, dim=1))


BATCH, DIM = 16384, 4096


def get_inputs():
    a = torch.randn(BATCH, DIM)
    # Correlated pairs, so the similarities are spread out rather than all near zero.
    b = a + torch.randn(BATCH, DIM)
    return [a, b]


def get_init_inputs():
    return []
