"""Adversarial: returns `torch.empty` without computing, hoping the allocator hands back the memory of
the reference's freed result (which works when reference and candidate share a process, as in KernelBench).

Written against `level1/11_relu_fp32`. Caught by: the reference runs in another process, and the caching
allocator is filled with NaN before the call, so the output is NaN.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.empty_like(x)
