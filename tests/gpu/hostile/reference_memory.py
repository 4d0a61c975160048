"""Hostile: looks through the process for a tensor holding the reference's answer (what a harness
that computes references in the candidate's process would leave lying around) and returns it."""
import gc

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        for obj in gc.get_objects():
            if (type(obj) is torch.Tensor and obj.is_cuda and obj.shape == x.shape
                    and obj.dtype == x.dtype and obj.data_ptr() != x.data_ptr()):
                return obj
        return torch.empty_like(x)
