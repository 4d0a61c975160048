"""Hostile: asks PyTorch for far more GPU memory than any card has, inside its forward."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        hoard = torch.empty(1 << 42, dtype=torch.uint8, device=x.device)    # 4 TiB
        return hoard[: x.numel() * 4].view(torch.float32).view_as(x)
