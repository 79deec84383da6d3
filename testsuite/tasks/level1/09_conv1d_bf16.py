import torch
import torch.nn as nn


class Model(nn.Module):
    """A 1D convolution over a long sequence (kernel 5, same padding, bias), bf16, NCL layout."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


batch = 32
in_channels = 256
out_channels = 512
kernel_size = 5
length = 4096
DTYPE = torch.bfloat16


def get_inputs():
    x = torch.randn(batch, in_channels, length, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
