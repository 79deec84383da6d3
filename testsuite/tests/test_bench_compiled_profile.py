"""Launch records' buffer sizes (ir/launch.py), which the compiled bench's %SOL reads: a launch record as
`kstrata record` writes it, with the figures of the H200's `mlp_fp16` silu (2026-12-04)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kstrata.ir.launch import LaunchRecord, LaunchRecordError, ScalarArg, TensorArg

SILU = "triton_poi_fused_silu_0"


def _silu_record(tmp_path: Path, *args: Any, storage: dict[str, list[int]] | None = None) -> str:
    record = LaunchRecord(SILU, "cuda:90", (32768, 1, 1),
                          (TensorArg("in_out_ptr0", "float16", (8192, 4096), (4096, 1), 0, 33554432, True),
                           *args, ScalarArg("xnumel", "i32", 33554432)),
                          num_warps=4, extra={"storage": storage or {"in_out_ptr0": [139741490053120, 67108864]}})
    return str(record.save(tmp_path / f"{SILU}-{len(args)}.json"))


def test_buffer_bytes_counts_each_buffer_once_and_names_an_unknown_size(tmp_path: Path) -> None:
    silu = 1 << 26
    # the same view of the same storage passed twice counts once; another storage counts; a broadcast bias
    # (stride 0 over the rows) counts its 4096 elements once
    same = TensorArg("in_ptr0", "float16", (8192, 4096), (4096, 1), 0, 33554432, False)
    other = TensorArg("in_ptr1", "float32", (16,), (1,), 0, 16, False)
    bias = TensorArg("in_ptr2", "float16", (8192, 4096), (0, 1), 0, 4096, False)
    storage = {"in_out_ptr0": [100, silu], "in_ptr0": [100, silu], "in_ptr1": [900, 64], "in_ptr2": [5000, 8192]}
    record = LaunchRecord.load(_silu_record(tmp_path, same, other, bias, storage=storage))
    assert record.buffer_bytes() == silu + 16 * 4 + 4096 * 2
    # without recorded addresses each argument is a buffer of its own
    assert LaunchRecord.load(_silu_record(tmp_path, same, storage={"x": [1, 1]})).buffer_bytes() == 2 * silu
    odd = TensorArg("in_ptr0", "float4_e2m1", (16,), (1,), 0, 16, False)
    with pytest.raises(LaunchRecordError, match="argument in_ptr0: 'float4_e2m1' is not a torch dtype"):
        LaunchRecord.load(_silu_record(tmp_path, odd)).buffer_bytes()
    scalars = LaunchRecord("k", "cuda:90", (1, 1, 1), (ScalarArg("n", "i32", 3),))
    with pytest.raises(LaunchRecordError, match="no tensor argument"):
        scalars.buffer_bytes()
