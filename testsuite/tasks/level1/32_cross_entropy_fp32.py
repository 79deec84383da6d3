import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Mean cross-entropy of fp32 logits over a 32768-class vocabulary against int64 class targets."""

    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets)


batch_size = 4096
num_classes = 32768
DTYPE = torch.float32


def get_inputs():
    logits = torch.randn(batch_size, num_classes, dtype=DTYPE)
    targets = torch.randint(0, num_classes, (batch_size,), dtype=torch.int64)
    return [logits, targets]


def get_init_inputs():
    return []
