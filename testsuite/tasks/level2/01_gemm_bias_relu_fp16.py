import torch
import torch.nn as nn


class Model(nn.Module):
    """y = relu(x @ W.T + b): a linear layer with its bias and activation as the GEMM's epilogue, fp16."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=True, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


batch = 2048
in_features = 4096
out_features = 8192
DTYPE = torch.float16


def get_inputs():
    x = torch.randn(batch, in_features, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [in_features, out_features]
