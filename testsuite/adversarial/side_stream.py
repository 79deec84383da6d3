"""Adversarial: does the work on a side stream and returns without making the current stream wait, so a
timer that records its end event on the current stream measures almost nothing.

Written against `level1/11_relu_fp32` (GPU only). Caught by: the output is copied on the current stream
the moment forward returns; that copy still holds the poisoned (NaN) memory and differs from the output
after a device-wide synchronize.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self._stream = None

    def forward(self, x):
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        out = torch.empty_like(x)
        with torch.cuda.stream(self._stream):
            torch.cuda._sleep(20_000_000)  # keep the side stream busy well past the return
            out.copy_(torch.relu(x))
        return out
