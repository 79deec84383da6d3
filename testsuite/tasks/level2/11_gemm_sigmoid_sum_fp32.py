import torch
import torch.nn as nn


class Model(nn.Module):
    """Row sums of sigmoid(x @ W.T + b): GEMM, pointwise and reduction in one chain, fp32."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(x)).sum(dim=1, keepdim=True)


batch = 8192
in_features = 2048
out_features = 4096
DTYPE = torch.float32


def get_inputs():
    x = torch.randn(batch, in_features, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_features, out_features]
