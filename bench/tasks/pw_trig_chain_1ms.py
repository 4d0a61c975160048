# family: pointwise  minimum bytes: 268435456
"""A compute-bound pointwise chain: three rounds of sin, cos, erf and atan on 32 M fp32 values
(256 MiB moved, 14 times fewer bytes than act_mish_1ms). Sized by estimate (about 300 fp32
instructions per element in one fused kernel) to run for the better part of a millisecond on an
H200; its real time is what bench/throughput.py reports. With act_mish_1ms it brackets issue 4's
loop-throughput figure at 1 ms: the evaluation protocol's passes over inputs and outputs cost by
the byte, the kernel by the instruction. Not an example task."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(3):
            y = torch.sin(1.3 * y + 0.1) + torch.erf(y) * torch.cos(y) + 0.5 * torch.atan(y)
        return y


SHAPE = (4096, 8192)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return []
