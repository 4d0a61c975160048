"""Bad task: forward fails (the Linear expects 16 features, the input has 8)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 4)

    def forward(self, x):
        return self.linear(x)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
