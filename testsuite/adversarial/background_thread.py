"""Adversarial: returns an uninitialized output at once and fills it from a background thread later, so
the call looks instant.

Written against `level1/11_relu_fp32` (CPU and GPU). Caught by: the copy taken when forward returns differs
from the output a moment later, and a thread started by the candidate is still running.
"""

import threading
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)

        def fill():
            time.sleep(0.01)
            out.copy_(torch.relu(x))
            time.sleep(0.5)  # linger, as a worker pool would

        threading.Thread(target=fill, name="adversarial-filler", daemon=True).start()
        return out
