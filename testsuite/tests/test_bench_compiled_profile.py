"""Device time per call from profiler events (backends/device_profile.py) and launch records' buffer sizes
(ir/launch.py), on the CPU: profiler events built as torch's own parser builds them (`FunctionEvent`, the
objects `prof.events()` holds) and a launch record as `kstrata record` writes it. The figures are those of the
H200's `mlp_fp16` run (2026-12-04)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from kstrata.backends.device_profile import device_profile
from kstrata.ir.launch import LaunchRecord, LaunchRecordError, ScalarArg, TensorArg

SILU = "triton_poi_fused_silu_0"
NORM = "triton_per_fused_native_layer_norm_1"
GEMM = "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64"


def _event(name: str, start: float, end: float, activity: str = "kernel", device: Any = DeviceType.CUDA) -> Any:
    """A device event as `_parse_kineto_results` makes it from a kineto event (times in us from the trace start)."""
    return FunctionEvent(id=1, name=name, thread=7, start_us=start, end_us=end, device_type=device,
                         activity_type=activity, use_device="cuda", linked_correlation_id=1)


def _call(offset: float, silu_us: float) -> list[Any]:
    """One call of the MLP as the profiler sees it: a CPU op, Inductor's graph call projected onto the GPU timeline
    (a user annotation over the whole call), a GEMM, the silu, a second GEMM overlapping the silu by 1 us, the
    layer norm, and the synchronize's wait."""
    t = offset
    return [_event("aten::mm", t, t + 5, "cpu_op", DeviceType.CPU),
            _event("## Call CompiledFxGraph fabc ##", t, t + 300, "gpu_user_annotation"),
            _event(GEMM, t + 10, t + 60),
            _event(SILU, t + 60, t + 60 + silu_us),
            _event(GEMM, t + 59 + silu_us, t + 109 + silu_us),
            _event(NORM, t + 120 + silu_us, t + 150 + silu_us),
            _event("Context Sync", t + 150 + silu_us, t + 400, "cuda_sync")]


def test_device_time_per_call_sums_a_names_launches_and_leaves_out_annotations_and_waits() -> None:
    p = device_profile([_call(0.0, 60.0), _call(1000.0, 64.0)])
    times = {k.name: (k.us_per_call, k.launches_per_call) for k in p.kernels}
    assert times == {GEMM: pytest.approx((100.0, 2.0)), SILU: pytest.approx((62.0, 1.0)), NORM: (30.0, 1.0)}
    assert p.kernels[0].name == GEMM  # longest first
    # busy: the union of the kernels' intervals (the 1 us where the GEMM overlaps the silu counts once), not the
    # annotation over the whole call nor the synchronize's wait; span: first start to last end
    assert p.busy_us == pytest.approx((50 + 60 + 49 + 30 + 50 + 64 + 49 + 30) / 2)
    assert p.span_us == pytest.approx(((210 - 10) + (214 - 10)) / 2)
    assert p.reason is None


def test_events_without_an_activity_type_drop_annotations_and_synchronizations_by_their_flags() -> None:
    """An older torch's `FunctionEvent` has no `activity_type`: a user annotation says so by `is_user_annotation`."""

    def old(name: str, start: float, end: float, annotation: bool = False) -> Any:
        return SimpleNamespace(name=name, device_type=DeviceType.CUDA, time_range=SimpleNamespace(start=start, end=end),
                               is_user_annotation=annotation, is_async=False)

    p = device_profile([[old("CompiledFxGraph", 0, 100, annotation=True), old(SILU, 10, 40),
                         old("Context Sync", 40, 90)]])
    assert [(k.name, k.us_per_call) for k in p.kernels] == [(SILU, 30.0)] and p.busy_us == 30.0


def test_a_profile_without_device_work_says_why_instead_of_figures() -> None:
    none = device_profile([[_event("aten::mm", 0, 5, "cpu_op", DeviceType.CPU)]] * 3)
    assert none.kernels == () and none.busy_us is None
    assert none.reason is not None and "no CUDA events in 3 calls" in none.reason
    only_waits = device_profile([[_event("graph", 0, 9, "gpu_user_annotation"),
                                  _event("Context Sync", 0, 9, "cuda_sync")]])
    assert only_waits.reason is not None and "2 CUDA events in 1 calls, none a kernel" in only_waits.reason
    assert "gpu_user_annotation x 1" in only_waits.reason
    assert device_profile([]).reason == "no call was profiled"


def test_the_events_torch_profiler_gives_have_what_the_aggregation_reads() -> None:
    """A real profile on the CPU (no CUDA activity here): its events carry the attributes `device_profile` reads, and
    with no CUDA event among them the profile says so instead of giving figures."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(64).add_(1)
    events = list(prof.events())
    assert events and all(e.device_type == DeviceType.CPU for e in events)
    e = events[0]
    assert isinstance(e.name, str) and e.time_range.end >= e.time_range.start and e.device_type.name == "CPU"
    assert hasattr(e, "activity_type") and hasattr(e, "is_user_annotation")
    p = device_profile([events])
    assert p.kernels == () and p.reason is not None and "no CUDA events" in p.reason


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
