import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the last three dims of (batch, features, dim1, dim2): 16 rows of 4M elements, fp32."""

    def __init__(self, normalized_shape: tuple[int, ...]):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


batch = 16
features = 64
dim1 = 256
dim2 = 256
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, features, dim1, dim2, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [(features, dim1, dim2)]
