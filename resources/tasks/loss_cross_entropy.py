# family: loss  minimum bytes: 268566532  flops: 268435456
"""Cross-entropy loss (mean over the batch) of fp32 logits against int64 class targets."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets)


BATCH, CLASSES = 16384, 4096


def get_inputs():
    logits = torch.randn(BATCH, CLASSES) * 3.0
    targets = torch.randint(0, CLASSES, (BATCH,))
    return [logits, targets]


def get_init_inputs():
    return []
