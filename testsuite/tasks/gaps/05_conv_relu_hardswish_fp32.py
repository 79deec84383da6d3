import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 conv (8 -> 32 channels), ReLU, HardSwish written out as x * clamp((x + 3) / 6, 0, 1), fp32."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = torch.relu(x)
        x = x * torch.clamp((x + 3) / 6, 0, 1)
        return x


batch = 64
in_channels = 8
out_channels = 32
height = 256
width = 256
kernel_size = 3
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, in_channels, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
