"""Adversarial: a constant-output shortcut. For softmax-normalized rows of standard normal logits the
batch-mean KL divergence is close to 1.0 whatever the values, so `1.0` may pass on the task's own inputs.

Written against `level1/34_kl_div_fp32`. Caught by: the later trials use other distributions (shifted,
uniform, heavy-tailed, with exact zeros), where the divergence is far from 1.0.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        return torch.tensor(1.0, dtype=predictions.dtype, device=predictions.device)
