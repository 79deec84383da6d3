"""Level 1: single operations (GEMM, convolution, activations, norms, reductions, scans, losses)."""
