import torch
import torch.nn as nn


class Model(nn.Module):
    """BatchNorm2d in training mode (batch statistics, running statistics updated), fp32."""

    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


batch = 32
channels = 128
height = 112
width = 112
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, channels, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [channels]
