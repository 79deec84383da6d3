import torch
import torch.nn as nn


class Model(nn.Module):
    """logsumexp over the output features of a linear layer: a GEMM with a row-reduction epilogue, bf16."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(self.linear(x), dim=1)


batch = 4096
in_features = 4096
out_features = 8192
DTYPE = torch.bfloat16


def get_inputs():
    x = torch.randn(batch, in_features, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_features, out_features]
