# family: norm  minimum bytes: 536872960  flops: 536870912
"""GroupNorm with 32 groups over 256 channels of an fp32 feature map."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, groups: int, channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


SHAPE = (64, 256, 64, 64)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return [32, SHAPE[1]]
