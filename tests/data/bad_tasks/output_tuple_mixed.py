"""Bad task: forward returns a tuple holding a tensor and a python float."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2, 1.5


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
