import torch
import torch.nn as nn


class Model(nn.Module):
    """2-D max pooling, kernel 4, stride 1, padding 1, dilation 1, over (16, 64, 384, 384), fp32."""

    def __init__(self, kernel_size: int, stride: int, padding: int, dilation: int):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


batch = 16
channels = 64
height = 384
width = 384
kernel_size = 4
stride = 1
padding = 1
dilation = 1
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, channels, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [kernel_size, stride, padding, dilation]
