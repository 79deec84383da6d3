"""Adversarial: memoizes results by the inputs' data pointers and shapes, so a benchmark that calls it
repeatedly on the same tensors measures a dictionary lookup.

Written against `level1/11_relu_fp32`. Caught by: every trial writes new values into the same input
tensors in place, so the cached (stale) result is wrong from the second trial on.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self._memo = {}

    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape), x.dtype)
        if key not in self._memo:
            self._memo[key] = torch.relu(x)
        return self._memo[key].clone()
