"""Adversarial: returns the reference's own result instead of computing one: looks through the process's
live tensors (and any files a harness left behind) for a tensor of the right shape that is not an input.

Written against `level1/11_relu_fp32`. In KernelBench the reference's output lives in the same process.
Caught by: the reference runs in another process whose result files are deleted before the candidate
starts; nothing is found, and what is returned is poisoned, uninitialized memory.
"""

import gc
import glob
import os

import torch
import torch.nn as nn


def _find(shape, dtype, exclude):
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and tuple(obj.shape) == shape and obj.dtype == dtype \
                    and all(obj.data_ptr() != e.data_ptr() for e in exclude):
                return obj
        except Exception:
            continue
    for path in glob.glob(os.path.join("/tmp", "**", "*.pt"), recursive=True) + \
            glob.glob(os.path.join("/dev/shm", "**", "*.pt"), recursive=True):
        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
            for t in data.get("outputs", []):
                if isinstance(t, torch.Tensor) and tuple(t.shape) == shape:
                    return t
        except Exception:
            continue
    return None


class ModelNew(nn.Module):
    def forward(self, x):
        found = _find(tuple(x.shape), x.dtype, [x])
        return found.to(x.device) if found is not None else torch.empty_like(x)
