# family: fused  minimum bytes: 201326592  flops: 549957140480
"""SwiGLU feed-forward gate in bf16: silu(x @ W_gate.T) * (x @ W_up.T)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False, dtype=torch.bfloat16)
        self.up = nn.Linear(hidden, intermediate, bias=False, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.gate(x)) * self.up(x)


TOKENS, HIDDEN, INTERMEDIATE = 8192, 4096, 4096


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, INTERMEDIATE]
