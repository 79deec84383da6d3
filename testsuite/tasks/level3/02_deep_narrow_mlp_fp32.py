import torch
import torch.nn as nn


class Model(nn.Module):
    """A deep, narrow perceptron: eight hidden layers of 50, Linear + ReLU each, then a Linear; batch 1, fp32
    (KernelBench level 3's deep narrow MLP sizes: 1000 -> 50 x 8 -> 10)."""

    def __init__(self, input_size: int, layer_sizes: list[int], output_size: int):
        super().__init__()
        layers: list[nn.Module] = []
        width = input_size
        for size in layer_sizes:
            layers += [nn.Linear(width, size, dtype=DTYPE), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, output_size, dtype=DTYPE))
        self.network = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


batch_size = 1
input_size = 1000
layer_sizes = [50] * 8
DTYPE = torch.float32
output_size = 10


def get_inputs():
    return [torch.randn(batch_size, input_size, dtype=DTYPE)]


def get_init_inputs():
    return [input_size, layer_sizes, output_size]
