# family: conv  minimum bytes: 201457792  flops: 17213423616
"""Transposed 2-D convolution (2x upsampling), 64 -> 32 channels, kernel 4, stride 2, padding 1."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(in_channels, out_channels, kernel_size=4, stride=2,
                                         padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.deconv(x)


BATCH, C_IN, C_OUT, H, W = 16, 64, 32, 128, 128


def get_inputs():
    return [torch.randn(BATCH, C_IN, H, W)]


def get_init_inputs():
    return [C_IN, C_OUT]
