"""Adversarial: correct for its first calls (the correctness trials), then a cheap wrong answer.

Written against `level1/11_relu_fp32` (any single-output task). The trials see six right answers; from
the eighth call on it returns zeros, which is fast. Caught by: judging the outputs of the last timed call
and of one drawn at random (`correct-after-timing`), not only the trials' (it used to be rejected only
because it then ran faster than the speed of light).
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls <= 7:
            return torch.relu(x)
        return torch.zeros_like(x)
