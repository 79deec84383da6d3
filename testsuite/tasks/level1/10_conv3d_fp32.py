import torch
import torch.nn as nn


class Model(nn.Module):
    """A 3x3x3 volumetric convolution with same padding and bias, fp32, NCDHW."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch = 8
in_channels = 32
out_channels = 64
kernel_size = 3
depth = 16
height = 64
width = 64
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, in_channels, depth, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
