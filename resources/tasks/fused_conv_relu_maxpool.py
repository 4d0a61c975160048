# family: fused  minimum bytes: 100737280  flops: 19419627520
"""Conv2d 3x3 (32 -> 64, bias) then ReLU then 2x2 max pooling, fp32 NCHW."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(torch.relu(self.conv(x)), kernel_size=2)


BATCH, C_IN, C_OUT, H, W = 32, 32, 64, 128, 128


def get_inputs():
    return [torch.randn(BATCH, C_IN, H, W)]


def get_init_inputs():
    return [C_IN, C_OUT]
