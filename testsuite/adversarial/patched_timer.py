"""Adversarial: computes correctly but patches the timers (CUDA events' `elapsed_time`, `time.perf_counter`)
to report a tenth of the time.

Written against `level1/11_relu_fp32` (CPU and GPU). Caught by: the harness holds references to the timer
functions taken before importing the candidate, checks them after the import and every call, and times
only through them.
"""

import time

import torch
import torch.nn as nn

_real_elapsed = torch.cuda.Event.elapsed_time
_real_perf = time.perf_counter


def _fast_elapsed(self, end):
    return _real_elapsed(self, end) / 10.0


torch.cuda.Event.elapsed_time = _fast_elapsed
time.perf_counter = lambda: _real_perf() / 10.0


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
