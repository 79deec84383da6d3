import torch
import torch.nn as nn


class Model(nn.Module):
    """tanh(MaxPool3d(x) - 0.5) over (batch, channels, depth, height, width), fp16: a 3-D window with stride
    and padding in every dim."""

    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool3d(kernel_size=(2, 3, 3), stride=(2, 1, 2), padding=(1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.pool(x) - 0.5)


batch = 1
channels = 2
depth = 4
height = 6
width = 7
DTYPE = torch.float16


def get_inputs():
    return [torch.randn(batch, channels, depth, height, width, dtype=DTYPE)]


def get_init_inputs():
    return []
