# family: norm  minimum bytes: 536871424  flops: 536870912
"""BatchNorm2d in training form: per-channel batch mean/variance over N, H, W, then affine; fp32."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        # No running statistics: forward always uses the batch statistics and has no side effect.
        self.bn = nn.BatchNorm2d(channels, track_running_stats=False)
        with torch.no_grad():
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


SHAPE = (64, 64, 128, 128)


def get_inputs():
    return [torch.randn(*SHAPE) * 1.5 + 0.3]


def get_init_inputs():
    return [SHAPE[1]]
