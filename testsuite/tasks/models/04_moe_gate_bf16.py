import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """A mixture-of-experts layer with a top-2 softmax gate, bf16.

    The router scores every token against every expert; each token keeps its two best experts, with
    weights renormalized by a softmax over those two. The experts (SiLU MLPs) are evaluated densely, on
    every token, and combined with the gate weights (zero for the experts a token did not pick), so
    every shape is static.
    """

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(hidden, experts, bias=False, dtype=DTYPE)
        self.w_in = nn.Parameter(torch.randn(experts, hidden, ffn, dtype=DTYPE) * hidden**-0.5)
        self.w_out = nn.Parameter(torch.randn(experts, ffn, hidden, dtype=DTYPE) * ffn**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        top_values, top_index = torch.topk(logits, self.top_k, dim=-1)
        gate = torch.zeros_like(logits).scatter(-1, top_index, F.softmax(top_values.float(), dim=-1).to(x.dtype))
        hidden = F.silu(torch.einsum("td,edf->tef", x, self.w_in))
        expert_out = torch.einsum("tef,efd->ted", hidden, self.w_out)
        return torch.einsum("te,ted->td", gate, expert_out)


tokens = 4096
hidden = 1024
ffn = 2048
experts = 8
top_k = 2
DTYPE = torch.bfloat16


def get_inputs():
    x = torch.randn(tokens, hidden, dtype=DTYPE)
    return [x]


def get_init_inputs():
    return [hidden, ffn, experts, top_k]
