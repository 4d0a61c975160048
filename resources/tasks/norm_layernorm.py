# family: norm  minimum bytes: 536903680  flops: 536870912
"""LayerNorm over the last dim (4096) of token activations, fp32, with a learned affine."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=1e-5)
        # Non-trivial affine so that skipping it is caught.
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


TOKENS, HIDDEN = 16384, 4096


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN) * 2.0 + 0.5]


def get_init_inputs():
    return [HIDDEN]
