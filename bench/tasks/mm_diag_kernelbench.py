# family: matmul  minimum bytes: 134234112
"""KernelBench level 1's "Matmul with diagonal matrices": diag(A) @ B for A [4096], B [4096, 4096] fp32.
The code generators rewrite the product with a diagonal matrix as A[:, None] * B (one elementwise pass);
not an example task (docs/performance.md, twelfth session). Minimum bytes: A and B read once, the result
written once."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.diag(A) @ B


M = 4096
N = 4096


def get_inputs():
    return [torch.randn(N), torch.randn(N, M)]


def get_init_inputs():
    return []
