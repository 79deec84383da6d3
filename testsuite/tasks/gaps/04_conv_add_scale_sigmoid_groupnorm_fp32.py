import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 conv (8 -> 32 channels), + bias, * scale, sigmoid, GroupNorm(8 groups), fp32."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, num_groups: int,
                 bias_shape: tuple[int, ...], scale_shape: tuple[int, ...]):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, dtype=DTYPE)
        self.bias = nn.Parameter(torch.randn(bias_shape, dtype=DTYPE) * 0.02)
        self.scale = nn.Parameter(torch.randn(scale_shape, dtype=DTYPE) * 0.02)
        self.group_norm = nn.GroupNorm(num_groups, out_channels, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = x + self.bias
        x = x * self.scale
        x = torch.sigmoid(x)
        x = self.group_norm(x)
        return x


batch = 64
in_channels = 8
out_channels = 32
height = 256
width = 256
kernel_size = 3
num_groups = 8
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, in_channels, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups, (out_channels, 1, 1), (out_channels, 1, 1)]
