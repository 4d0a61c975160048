"""Bad task: get_inputs() raises."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    raise ValueError("input factory is broken on purpose")


def get_init_inputs():
    return []
