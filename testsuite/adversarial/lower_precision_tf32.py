"""Adversarial: an fp32 GEMM computed with TF32 tensor cores (10-bit mantissa inputs), several times faster.

Written against `level1/01_square_gemm_fp32` (GPU only: TF32 needs tensor cores). Caught by the `strict`
policy: its error against a float64 reference is far above PyTorch's own fp32 error (issue 7 quotes
2.8e-5 against 8.4e-7; kstrata measured relative L2 errors of 2.9e-4 against 1.15e-6 on an H200, where
KernelBench's elementwise 1e-4 rejects it too).
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, A, B):
        torch.set_float32_matmul_precision("high")  # TF32 tensor cores for fp32 matmuls
        return torch.matmul(A, B)
