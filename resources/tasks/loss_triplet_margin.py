# family: loss  minimum bytes: 402653188  flops: 268435456
"""Triplet margin loss (L2 distance, margin 1) over anchor/positive/negative embeddings, fp32."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, margin: float):
        super().__init__()
        self.margin = margin

    def forward(self, anchor: torch.Tensor, positive: torch.Tensor,
                negative: torch.Tensor) -> torch.Tensor:
        return F.triplet_margin_loss(anchor, positive, negative, margin=self.margin, p=2.0)


BATCH, DIM = 8192, 4096


def get_inputs():
    anchor = torch.randn(BATCH, DIM)
    positive = anchor + 0.7 * torch.randn(BATCH, DIM)
    negative = anchor + 0.7 * torch.randn(BATCH, DIM)
    return [anchor, positive, negative]


def get_init_inputs():
    return [1.0]
