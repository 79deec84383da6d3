import torch
import torch.nn as nn


class Model(nn.Module):
    """A stride-2 transposed convolution (2x upsampling), plus a per-channel bias, then tanh, fp32."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(in_channels, out_channels, kernel_size=4, stride=2, padding=1, bias=False,
                                         dtype=DTYPE)
        self.bias = nn.Parameter(0.1 * torch.randn(out_channels, 1, 1, dtype=DTYPE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.deconv(x) + self.bias)


batch = 16
in_channels = 128
out_channels = 64
height = 64
width = 64
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, in_channels, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels]
