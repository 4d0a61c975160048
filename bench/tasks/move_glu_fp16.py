# family: activation  minimum bytes: 402653184
"""GLU written with chunk: a * sigmoid(b) for the two halves of the last dim of an [8192, 16384] fp16
tensor (256 MiB read, 128 MiB written). Not an example task: the data-movement family's figure
(docs/performance.md, twelfth session)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        a, b = x.chunk(2, dim=-1)
        return a * torch.sigmoid(b)


def get_inputs():
    return [torch.randn(8192, 16384).half()]


def get_init_inputs():
    return []
