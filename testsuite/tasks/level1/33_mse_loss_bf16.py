import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Mean squared error between two bf16 tensors, reduced to a scalar."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(predictions, targets, reduction="mean")


batch_size = 4096
dim = 16384
DTYPE = torch.bfloat16


def get_inputs():
    predictions = torch.randn(batch_size, dim, dtype=DTYPE)
    targets = torch.randn(batch_size, dim, dtype=DTYPE)
    return [predictions, targets]


def get_init_inputs():
    return []
