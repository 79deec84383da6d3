import torch
import torch.nn as nn


class Model(nn.Module):
    """A degenerate task on purpose: the output does not depend on the input (clamped far below its range)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=1e6, max=2e6)


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return []
