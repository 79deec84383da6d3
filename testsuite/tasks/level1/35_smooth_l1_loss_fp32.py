import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Smooth-L1 (Huber with delta 1) loss between two fp32 tensors, mean-reduced."""

    def __init__(self, beta: float):
        super().__init__()
        self.beta = beta

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.smooth_l1_loss(predictions, targets, beta=self.beta)


batch_size = 4096
dim = 16384
DTYPE = torch.float32


def get_inputs():
    predictions = torch.randn(batch_size, dim, dtype=DTYPE)
    targets = torch.randn(batch_size, dim, dtype=DTYPE)
    return [predictions, targets]


def get_init_inputs():
    return [1.0]
