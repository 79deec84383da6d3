import torch
import torch.nn as nn


class Model(nn.Module):
    """Token embedding lookup: gather one bf16 row of a (vocab, hidden) table per token id."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.table = nn.Embedding(vocab, hidden, dtype=DTYPE)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.table(token_ids)


batch = 16
seq = 2048
vocab = 50304
hidden = 4096
DTYPE = torch.bfloat16


def get_inputs():
    token_ids = torch.randint(0, vocab, (batch, seq), dtype=torch.int64)
    return [token_ids]


def get_init_inputs():
    return [vocab, hidden]
