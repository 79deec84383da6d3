"""Adversarial: computes once, then returns the same cached output tensor on every later call.

Written against `level1/11_relu_fp32` (any single-output task). Caught by: the aliasing check (the output
shares memory with an earlier trial's output) and by the values on the next trial's new inputs.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self._cached = None

    def forward(self, x):
        if self._cached is None:
            self._cached = torch.relu(x)
        return self._cached
