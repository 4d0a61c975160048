# family: conv  minimum bytes: 402948608  flops: 77376520192
"""2-D convolution, 64 -> 128 channels, 3x3 kernel, padding 1, with bias, fp32 NCHW."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


BATCH, C_IN, C_OUT, H, W = 32, 64, 128, 128, 128


def get_inputs():
    return [torch.randn(BATCH, C_IN, H, W)]


def get_init_inputs():
    return [C_IN, C_OUT, 3]
