import torch
import torch.nn as nn


class Model(nn.Module):
    """conv3x3 -> BatchNorm2d (training mode) -> ReLU, the basic block of a CNN, fp32."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False, dtype=DTYPE)
        self.bn = nn.BatchNorm2d(out_channels, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


batch = 32
in_channels = 64
out_channels = 128
height = 56
width = 56
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, in_channels, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels]
