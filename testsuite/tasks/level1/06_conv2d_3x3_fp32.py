import torch
import torch.nn as nn


class Model(nn.Module):
    """A 3x3, stride-1, same-padded 2D convolution with bias, fp32, NCHW."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=True,
                              dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch = 16
in_channels = 64
out_channels = 128
kernel_size = 3
height = 128
width = 128
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, in_channels, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
