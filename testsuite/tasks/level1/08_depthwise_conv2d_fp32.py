import torch
import torch.nn as nn


class Model(nn.Module):
    """A depthwise 3x3 convolution (one filter per channel, groups = channels), fp32."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels,
                              bias=False, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch = 16
channels = 256
kernel_size = 3
height = 112
width = 112
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, channels, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [channels, kernel_size]
