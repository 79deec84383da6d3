import torch
import torch.nn as nn


class Model(nn.Module):
    """conv3d -> GroupNorm -> mean over everything but the batch: one number per sample, fp32."""

    def __init__(self, in_channels: int, out_channels: int, groups: int):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, 3, padding=1, dtype=DTYPE)
        self.norm = nn.GroupNorm(groups, out_channels, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.conv(x))
        return y.mean(dim=(1, 2, 3, 4))


batch = 8
in_channels = 16
out_channels = 32
groups = 8
depth = 16
height = 32
width = 32
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, in_channels, depth, height, width, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_channels, out_channels, groups]
