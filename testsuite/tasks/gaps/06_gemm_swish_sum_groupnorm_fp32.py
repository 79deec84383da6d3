import torch
import torch.nn as nn


class Model(nn.Module):
    """Linear (1024 -> 4096), Swish, + bias, GroupNorm(64 groups), batch 32768, fp32."""

    def __init__(self, in_features: int, out_features: int, num_groups: int, bias_shape: tuple[int, ...]):
        super().__init__()
        self.matmul = nn.Linear(in_features, out_features, dtype=DTYPE)
        self.bias = nn.Parameter(torch.randn(bias_shape, dtype=DTYPE) * 0.02)
        self.group_norm = nn.GroupNorm(num_groups, out_features, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.matmul(x)
        x = torch.sigmoid(x) * x
        x = x + self.bias
        x = self.group_norm(x)
        return x


batch = 32768
in_features = 1024
out_features = 4096
num_groups = 64
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, in_features, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_features, out_features, num_groups, (out_features,)]
