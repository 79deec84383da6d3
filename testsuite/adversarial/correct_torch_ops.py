"""A correct candidate (must be ACCEPTED): ReLU written with other PyTorch ops.

Written against `level1/11_relu_fp32`.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.clamp_min(x, 0.0)
