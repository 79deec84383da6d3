"""Adversarial: computes the right answer, then zeroes its input, so a reference run afterwards on the
same tensors would see zeros (and agree with a zero output later on).

Written against `level1/11_relu_fp32`. Caught by: the input hashes before and after the call differ.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.relu(x)
        x.zero_()
        return out
