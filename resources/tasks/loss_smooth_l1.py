# family: loss  minimum bytes: 536870916  flops: 335544320
"""Smooth L1 (Huber-like) loss with beta=0.5, mean over all elements, fp32."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, beta: float):
        super().__init__()
        self.beta = beta

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.smooth_l1_loss(predictions, targets, beta=self.beta)


ROWS, COLS = 8192, 8192


def get_inputs():
    return [torch.randn(ROWS, COLS), torch.randn(ROWS, COLS) * 0.5]


def get_init_inputs():
    return [0.5]
