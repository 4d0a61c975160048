# family: norm  minimum bytes: 536871944  flops: 268435456
"""BatchNorm2d in inference form: normalise with stored running statistics, fp32 NCHW."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)
        # Random statistics and affine: the defaults (0, 1, 1, 0) would make this an identity.
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # training=False whatever mode the module is in: the running statistics are used.
        return F.batch_norm(x, self.bn.running_mean, self.bn.running_var, self.bn.weight,
                            self.bn.bias, training=False, eps=self.bn.eps)


SHAPE = (64, 64, 128, 128)


def get_inputs():
    return [torch.randn(*SHAPE)]


def get_init_inputs():
    return [SHAPE[1]]
