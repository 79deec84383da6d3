"""Adversarial: an fp32 GEMM computed in bf16 and cast back to fp32.

Written against `level1/01_square_gemm_fp32` (CPU and GPU). Caught by the `strict` policy (and, at this
size, by KernelBench's tolerance too).
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, A, B):
        return torch.matmul(A.bfloat16(), B.bfloat16()).float()
