# family: norm  minimum bytes: 536871424  flops: 536870912
"""InstanceNorm2d with a learned affine: per-sample, per-channel statistics over H, W; fp32."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.InstanceNorm2d(channels, affine=True)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


SHAPE = (64, 64, 128, 128)


def get_inputs():
    return [torch.randn(*SHAPE) * 2.0 - 1.0]


def get_init_inputs():
    return [SHAPE[1]]
