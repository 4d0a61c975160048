# family: activation  minimum bytes: 3758096384  flops: 2818572288
"""Mish of a 1.75 GiB fp32 tensor: a memory-bound kernel of about 0.9 ms on an H200 (3.5 GiB moved),
for the loop-throughput figure at the top of issue 4's 0.1-1 ms range. Not an example task."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tanh(F.softplus(x))


SHAPE = (224, 128, 128, 128)


def get_inputs():
    return [3.0 * torch.randn(*SHAPE)]


def get_init_inputs():
    return []
