# family: pointwise  minimum bytes: 268435456
"""A compute-bound pointwise chain sized to about 1 ms: nine rounds of sin, cos, erf and atan on
32 M fp32 values (256 MiB moved, as pw_trig_chain_1ms, which has three rounds and runs at 0.36 ms on
an H200). With act_mish_1ms (3.5 GiB moved) it brackets issue 4's loop-throughput figure at 1 ms:
the evaluation protocol's passes over inputs and outputs cost by the byte, the kernel by the
instruction. Not an example task."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(9):
            y = torch.sin(1.3 * y + 0.1) + torch.erf(y) * torch.cos(y) + 0.5 * torch.atan(y)
        return y


SHAPE = (4096, 8192)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return []
