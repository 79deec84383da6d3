import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A pre-norm transformer MLP block: x + W2 @ gelu_tanh(W1 @ LayerNorm(x)), bf16."""

    def __init__(self, hidden: int, expansion: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, dtype=DTYPE)
        self.fc1 = nn.Linear(hidden, expansion * hidden, dtype=DTYPE)
        self.fc2 = nn.Linear(expansion * hidden, hidden, dtype=DTYPE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(self.norm(x)), approximate="tanh")
        return x + self.fc2(h)


batch = 8
seq = 1024
hidden = 2048
expansion = 4
DTYPE = torch.bfloat16


def get_inputs():
    x = torch.randn(batch, seq, hidden, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [hidden, expansion]
