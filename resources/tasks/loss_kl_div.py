# family: loss  minimum bytes: 536870916  flops: 939524096
"""KL divergence KL(target || prediction) between row softmaxes of two fp32 logit matrices."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, pred_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
        # Both sides come in as logits, so any rescaling of the inputs keeps them valid.
        log_p = F.log_softmax(pred_logits, dim=-1)
        log_q = F.log_softmax(target_logits, dim=-1)
        return F.kl_div(log_p, log_q, reduction="batchmean", log_target=True)


BATCH, CLASSES = 16384, 4096


def get_inputs():
    return [torch.randn(BATCH, CLASSES), torch.randn(BATCH, CLASSES)]


def get_init_inputs():
    return []
