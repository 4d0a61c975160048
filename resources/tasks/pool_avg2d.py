# family: pool  minimum bytes: 671088640  flops: 335544320
"""2-D average pooling, 3x3 window, stride 2, padding 1, padding excluded from the count, fp32."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size, stride=stride, padding=padding,
                                 count_include_pad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


SHAPE = (32, 64, 256, 256)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return [3, 2, 1]
