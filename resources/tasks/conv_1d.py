# family: conv  minimum bytes: 402817536  flops: 43016781824
"""1-D convolution over long sequences, 64 -> 128 channels, kernel 5, padding 2, fp32."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


BATCH, C_IN, C_OUT, LENGTH = 32, 64, 128, 16384


def get_inputs():
    return [torch.randn(BATCH, C_IN, LENGTH)]


def get_init_inputs():
    return [C_IN, C_OUT, 5]
