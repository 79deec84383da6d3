import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """sigmoid(avg_pool1d(relu(x) * scale)) over (batch, channels, length): a 1-D pooling between two
    pointwise chains, fp32; padding not counted."""

    def __init__(self, channels: int):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(1, channels, 1, dtype=DTYPE) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.avg_pool1d(torch.relu(x) * self.scale, 3, stride=2, padding=1, count_include_pad=False)
        return torch.sigmoid(y)


batch = 3
channels = 5
length = 37
DTYPE = torch.float32


def get_inputs():
    return [torch.randn(batch, channels, length, dtype=DTYPE)]


def get_init_inputs():
    return [channels]
