# family: activation  minimum bytes: 536870912  flops: 402653184
"""Mish, x * tanh(softplus(x)), of a 4-D fp32 activation tensor."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tanh(F.softplus(x))


SHAPE = (32, 128, 128, 128)


def get_inputs():
    # Spread beyond [-3, 3] so both the linear and the saturated regions are exercised.
    return [3.0 * torch.randn(*SHAPE)]


def get_init_inputs():
    return []
