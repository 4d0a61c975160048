"""Bad task: Model is a plain function, not an nn.Module subclass."""
import torch


def Model():
    return None


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
