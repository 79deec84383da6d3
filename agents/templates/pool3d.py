"""3-D max and average pooling of (N, C, D, H, W) or (C, D, H, W) (kernel, stride, padding, dilation,
count_include_pad), with pointwise ops before and after: `pool`'s kernels run per output depth (a program
per plane and output depth, BLOCK_H x BLOCK_W outputs of it), the depth window unrolled around the 2-D
one; `rows` (stride 1 and dilation 1 along H) keeps a rolling window of depth-and-width results."""

from __future__ import annotations

from kstrata.agents.templates import pool

NAME = "pool3d"
applies, kernel = pool.for_rank(3, NAME)
space, valid, description = pool.space, pool.valid, pool.description
