"""Bad task: executing the module fails (an import that does not exist)."""
import torch
import torch.nn as nn
import no_such_module_for_cuda_agent_tests  # noqa: F401


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
