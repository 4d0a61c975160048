"""Hostile: does the work through tensor methods, hiding the call in arithmetic."""
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        y = x.mul(0.7071067811865476).erf()
        return x * 0.5 * (y + 1)
