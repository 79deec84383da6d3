"""Tasks with the shapes where torch.compile is far from speed of light on the H200 (issue 19): LayerNorm over
several trailing dims with few rows, 2-D max pooling with a 4x4 window at stride 1, softmax over very wide
rows, convolution + epilogue chains, a GEMM + GroupNorm chain. All fp32; GPU-sized (gigabytes): describe
them with `kstrata task show` (fake tensors), run them on a GPU."""
