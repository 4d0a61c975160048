# family: scan  minimum bytes: 4080508
"""KernelBench level 1's exclusive cumsum, as written there: a zero column concatenated in front, then
`[:-1]` (which cuts dim 0, not the scanned dim), then cumsum. Data movement before a scan; not an
example task (docs/performance.md, twelfth session). Minimum bytes: x read once, the [127, 4001]
result written once."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x):
        exclusive_cumsum = torch.cat((torch.zeros_like(x.select(self.dim, 0).unsqueeze(self.dim)), x), dim=self.dim)[:-1]
        return torch.cumsum(exclusive_cumsum, dim=self.dim)


batch_size = 128
input_shape = (4000,)
dim = 1


def get_inputs():
    return [torch.randn(batch_size, *input_shape)]


def get_init_inputs():
    return [dim]
