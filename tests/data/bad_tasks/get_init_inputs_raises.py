"""Bad task: get_init_inputs() raises."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x):
        return x * self.n


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return [1 / 0]
