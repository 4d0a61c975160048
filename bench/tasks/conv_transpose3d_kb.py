# family: conv  minimum bytes: 41998400  flops: 1811939328
"""KernelBench-style transposed 3-D convolution: 32 -> 16 channels, kernel 3, stride 2, padding 1,
output_padding 1 (2x upsampling of a 16x32x32 volume), fp32."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.ConvTranspose3d(in_channels, out_channels, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(4, 32, 16, 32, 32)]


def get_init_inputs():
    return [32, 16]
