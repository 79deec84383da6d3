"""Level 2: fused chains of a few operations (GEMM or convolution with an epilogue, attention with a norm)."""
