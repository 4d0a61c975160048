# family: reduction  minimum bytes: 269221888  flops: 67108864
"""Max over the last dim of a 3-D fp32 tensor, returning the values and their int64 indices."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = torch.max(x, dim=-1)
        return values, indices


SHAPE = (64, 1024, 1024)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return []
