import torch
import torch.nn as nn


class Model(nn.Module):
    """An image-stem convolution: 3 -> 64 channels, 7x7 kernel, stride 2, padding 3, no bias, fp16."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=7, stride=2, padding=3, bias=False,
                              dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch = 32
in_channels = 3
out_channels = 64
image_size = 224
DTYPE = torch.float16


def get_inputs():
    x = torch.randn(batch, in_channels, image_size, image_size, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels]
