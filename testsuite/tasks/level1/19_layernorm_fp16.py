import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the hidden dimension of (batch, seq, hidden) activations, with affine weight and bias, fp16."""

    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=1e-5, elementwise_affine=True, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


batch = 32
seq = 2048
hidden = 4096
DTYPE = torch.float16


def get_inputs():
    x = torch.randn(batch, seq, hidden, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [hidden]
