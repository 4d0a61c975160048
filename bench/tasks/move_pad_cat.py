# family: movement  minimum bytes: 536346624
"""Padding and concatenation: x [64, 510, 1024] padded with a zero row on each side of dim 1, then y
[64, 512, 1024] after it along dim 1: a [64, 1024, 1024] fp32 result. Not an example task: the
data-movement family's figure (docs/performance.md, twelfth session). Minimum bytes: x and y read
once, the result written once."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.cat([F.pad(x, (0, 0, 1, 1)), y], dim=1)


def get_inputs():
    return [torch.randn(64, 510, 1024), torch.randn(64, 512, 1024)]


def get_init_inputs():
    return []
