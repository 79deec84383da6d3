import torch
import torch.nn as nn


class Model(nn.Module):
    """GroupNorm with 32 groups over NCHW activations, with affine weight and bias, fp16."""

    def __init__(self, groups: int, channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=1e-5, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


batch = 32
groups = 32
channels = 256
height = 64
width = 64
DTYPE = torch.float16


def get_inputs():
    x = torch.randn(batch, channels, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [groups, channels]
