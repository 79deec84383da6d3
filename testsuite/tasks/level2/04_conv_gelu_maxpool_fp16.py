import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """conv3x3 (bias) -> GELU -> 2x2 max pooling, fp16."""

    def __init__(self, in_channels: int, out_channels: int, pool: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, dtype=DTYPE)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(F.gelu(self.conv(x)), kernel_size=self.pool)


batch = 32
in_channels = 64
out_channels = 128
height = 112
width = 112
pool = 2
DTYPE = torch.float16


def get_inputs():
    x = torch.randn(batch, in_channels, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, pool]
