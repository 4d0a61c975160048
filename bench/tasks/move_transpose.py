# family: movement  minimum bytes: 536870912
"""A transpose copy of an 8192 x 8192 fp32 matrix (256 MiB read, 256 MiB written). Not an example
task: the data-movement family's figure (docs/performance.md, twelfth session)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.t().contiguous()


def get_inputs():
    return [torch.randn(8192, 8192)]


def get_init_inputs():
    return []
