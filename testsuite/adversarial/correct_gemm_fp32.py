"""A correct candidate (must be ACCEPTED): an fp32 GEMM with TF32 explicitly off, in full fp32.

Written against `level1/01_square_gemm_fp32`.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, A, B):
        torch.set_float32_matmul_precision("highest")
        return torch.mm(A, B)
