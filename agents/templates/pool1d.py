"""1-D max and average pooling of (N, C, L) or (C, L) (kernel, stride, padding, dilation, count_include_pad),
with pointwise ops before and after: `pool`'s direct kernel on the (planes, L) matrix with a (1, k)
window, a tile spanning BLOCK_H planes and BLOCK_W outputs along L."""

from __future__ import annotations

from kstrata.agents.templates import pool

NAME = "pool1d"
applies, kernel = pool.for_rank(1, NAME)
space, valid, description = pool.space, pool.valid, pool.description
