"""Bad task: no Model class and no get_init_inputs()."""
import torch


class Modle(torch.nn.Module):  # misspelt
    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(4, 4)]
