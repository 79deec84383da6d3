"""The compiled bench's in-program check and %SOL (tools/bench_compiled.py, backends/device_profile.py), on the CPU:
profiler events built as torch's own parser builds them (`FunctionEvent`, the objects `prof.events()` holds), a
launch record as `kstrata record` writes it, and the markdown written from rows shaped as the run makes them. The
figures are those of the H200's `mlp_fp16` run (2026-12-04): the silu's isolated A/B 68.2 -> 47.3 us."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from kstrata.backends.device_profile import DeviceProfile, KernelTime, device_profile
from kstrata.ir.launch import LaunchRecord, LaunchRecordError, ScalarArg, TensorArg
from kstrata.tools import bench_compiled

from .conftest import has_cuda

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


def _profiles(silu_tuned_us: float) -> tuple[DeviceProfile, DeviceProfile]:
    inductor = DeviceProfile(5, (KernelTime(GEMM, 100.0, 2.0), KernelTime(SILU, 62.0, 1.0),
                                 KernelTime(NORM, 30.0, 1.0)), busy_us=190.0, span_us=200.0)
    tuned = DeviceProfile(5, (KernelTime(GEMM, 101.0, 2.0), KernelTime(SILU, silu_tuned_us, 1.0),
                              KernelTime(NORM, 30.0, 1.0)), busy_us=188.0, span_us=199.0)
    return inductor, tuned


def _row(silu_tuned_us: float) -> dict[str, Any]:
    inductor, tuned = _profiles(silu_tuned_us)
    ip = bench_compiled.in_program(inductor, tuned, {SILU: "config(5AODIZKJTAWE)"}, {"inductor": 262.2, "tuned": 264.4})
    return {"model": "mlp_fp16", "share_source": "measured",
            "kernels": [{"kernel": SILU, "key": "ZJFZBYHFS7MF", "share": "68.7%", "trials": 5, "space": "config",
                         "edit": "config(5AODIZKJTAWE)", "speedup": 1.442, "range": [1.430, 1.451],
                         "time_before_us": 68.19, "time_after_us": 47.28, "verdicts": {},
                         "sol": {"bytes": 1 << 26, "before": 0.246, "after": 0.355,
                                 "sol_us": (1 << 26) / 4.075e12 * 1e6}},
                        {"kernel": NORM, "key": "645KPEVZU7P7", "share": "31.3%", "trials": 2, "verdicts": {},
                         "result": "no candidate beat the original beyond the noise",
                         "sol": {"reason": "kernel x: argument in_ptr0: 'float4' is not a torch dtype"}}],
            "recheck": [],
            "end_to_end": {"speedup": 0.991, "tuned_kernels": 1, "untouched_kernels": 2, "bitwise_equal": True,
                           "max_abs_diff": 0.0, "timing": {"speedup_range": [0.978, 1.036]}, "inductor_us": 262.2,
                           "launched": [{"kernel": SILU, "binary": "7956", "launches_per_call": 1.0, "tuned": True,
                                         "edit": "config(5AODIZKJTAWE)", "num_warps": 4, "num_stages": 1,
                                         "grid": [32768, 1, 1]}],
                           "inductor_launched": [{"kernel": SILU, "binary": "a1b2", "launches_per_call": 1.0,
                                                  "tuned": False, "edit": None, "num_warps": 8, "num_stages": 1,
                                                  "grid": [65536, 1, 1]}],
                           "expected": 1.087, "in_program": ip}}


def test_in_program_figures_put_each_tuned_kernels_device_time_beside_its_isolated_ab() -> None:
    row = _row(58.0)
    ip = row["end_to_end"]["in_program"]
    by = {k["kernel"]: k for k in ip["kernels"]}
    assert [k["kernel"] for k in ip["kernels"]] == [GEMM, SILU, NORM]
    assert (by[SILU]["inductor_us"], by[SILU]["tuned_us"], by[SILU]["tuned"]) == (62.0, 58.0, True)
    assert by[SILU]["in_program_ratio"] == pytest.approx(62 / 58) and "in_program_ratio" not in by[GEMM]
    assert by[GEMM]["inductor_launches"] == 2.0 and not by[GEMM]["tuned"]
    assert ip["busy_us"] == {"inductor": 190.0, "tuned": 188.0} and ip["wall_us"]["inductor"] == 262.2
    assert ip["reason"] is None and ip["calls"] == 5
    bench_compiled.attach_isolated(row)
    assert by[SILU]["isolated_ratio"] == pytest.approx(68.19 / 47.28) and by[SILU]["isolated_before_us"] == 68.19
    assert "isolated_ratio" not in by[NORM]
    lines = bench_compiled.in_program_lines("mlp_fp16", ip)
    assert lines[0].startswith(f"- mlp_fp16 `{SILU}` (config(5AODIZKJTAWE)): isolated A/B 68.2 -> 47.3 us (1.442x); "
                               "in the program 62.0 -> 58.0 us (1.069x)")
    assert lines[1].startswith("- mlp_fp16 device busy per call of the wall time per call: Inductor 190.0 us of "
                               "262.2 us (72%), tuned 188.0 us of 264.4 us (71%)")


def test_a_kernel_missing_from_one_profile_has_no_ratio_and_a_failed_profile_says_why() -> None:
    inductor, _ = _profiles(58.0)
    failed = DeviceProfile(5, reason="profiling failed: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED")
    ip = bench_compiled.in_program(inductor, failed, {SILU: "e"}, {"inductor": 262.2, "tuned": 264.4})
    silu = next(k for k in ip["kernels"] if k["kernel"] == SILU)
    assert silu["tuned_us"] is None and silu["in_program_ratio"] is None
    assert ip["reason"] == "tuned: profiling failed: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"
    lines = bench_compiled.in_program_lines("m", ip)
    assert "in the program 62.0 -> ? us (device time" in lines[0] and "no isolated A/B of this edit" in lines[0]
    assert lines[1].endswith("; tuned: profiling failed: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED")
    nothing = bench_compiled.in_program(failed, failed, {}, {})
    assert bench_compiled.in_program_lines("m", nothing) == [f"- m in the program: no figures: {nothing['reason']}"]


def test_the_profile_failing_inside_the_bench_is_a_reason_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kw: Any) -> DeviceProfile:
        raise RuntimeError("CUPTI could not be loaded")

    monkeypatch.setattr(bench_compiled, "profile_calls", boom)
    p = bench_compiled._profile(lambda: None, None)
    assert p.kernels == () and p.reason == "profiling failed: RuntimeError: CUPTI could not be loaded"


def _silu_record(tmp_path: Path, *args: Any, storage: dict[str, list[int]] | None = None) -> str:
    record = LaunchRecord(SILU, "cuda:90", (32768, 1, 1),
                          (TensorArg("in_out_ptr0", "float16", (8192, 4096), (4096, 1), 0, 33554432, True),
                           *args, ScalarArg("xnumel", "i32", 33554432)),
                          num_warps=4, extra={"storage": storage or {"in_out_ptr0": [139741490053120, 67108864]}})
    return str(record.save(tmp_path / f"{SILU}-{len(args)}.json"))


def test_sol_is_the_bytes_of_the_records_buffers_over_the_bandwidth_against_the_times_before_and_after(
        tmp_path: Path) -> None:
    path = _silu_record(tmp_path)
    sol = bench_compiled.buffer_sol(path, 4.0e12, 68.19, 47.28)
    # the silu's in-out buffer, read and written: twice 8192 x 4096 halves, 128 MiB, 33.6 us at 4 TB/s
    assert sol["bytes"] == 1 << 27 and sol["sol_us"] == pytest.approx((1 << 27) / 4.0e12 * 1e6)
    assert sol["before"] == pytest.approx(sol["sol_us"] / 68.19)
    assert sol["after"] == pytest.approx(sol["sol_us"] / 47.28)
    assert bench_compiled.buffer_sol(path, 4.0e12, 31.5, None)["after"] is None
    assert bench_compiled.buffer_sol(path, None, 68.19, 47.28, "no bandwidth: boom") == {"bytes": 1 << 27,
                                                                                         "reason": "no bandwidth: boom"}
    assert bench_compiled.buffer_sol(None, 4.0e12, 1.0, 1.0) == {"reason": "no launch record"}


def test_buffer_bytes_counts_each_buffer_once_and_names_an_unknown_size(tmp_path: Path) -> None:
    silu = 1 << 26
    # the same view of the same storage passed twice counts once; another storage counts; a broadcast bias
    # (stride 0 over the rows) counts its 4096 elements once
    same = TensorArg("in_ptr0", "float16", (8192, 4096), (4096, 1), 0, 33554432, False)
    other = TensorArg("in_ptr1", "float32", (16,), (1,), 0, 16, False)
    bias = TensorArg("in_ptr2", "float16", (8192, 4096), (0, 1), 0, 4096, False)
    storage = {"in_out_ptr0": [100, silu], "in_ptr0": [100, silu], "in_ptr1": [900, 64], "in_ptr2": [5000, 8192]}
    # (the record's in-place `in_out_ptr0`, written, is read and written: twice its bytes; `in_ptr0` is the same
    # view of it and adds nothing)
    record = LaunchRecord.load(_silu_record(tmp_path, same, other, bias, storage=storage))
    assert record.buffer_bytes() == 2 * silu + 16 * 4 + 4096 * 2
    # without recorded addresses each argument is a buffer of its own
    assert LaunchRecord.load(_silu_record(tmp_path, same, storage={"x": [1, 1]})).buffer_bytes() == 3 * silu
    # an in-out buffer the kernel did not write counts once
    kept = TensorArg("in_out_ptr0", "float16", (8192, 4096), (4096, 1), 0, 33554432, False)
    assert LaunchRecord(SILU, "cuda:90", (1, 1, 1), (kept,)).buffer_bytes() == silu
    odd = TensorArg("in_ptr0", "float4_e2m1", (16,), (1,), 0, 16, False)
    with pytest.raises(LaunchRecordError, match="argument in_ptr0: 'float4_e2m1' is not a torch dtype"):
        LaunchRecord.load(_silu_record(tmp_path, odd)).buffer_bytes()
    sol = bench_compiled.buffer_sol(_silu_record(tmp_path, odd), 4.0e12, 68.19, 47.28)
    assert "bytes" not in sol and "'float4_e2m1' is not a torch dtype" in sol["reason"]
    scalars = LaunchRecord("k", "cuda:90", (1, 1, 1), (ScalarArg("n", "i32", 3),))
    with pytest.raises(LaunchRecordError, match="no tensor argument"):
        scalars.buffer_bytes()


def test_the_markdown_shows_sol_in_the_kernel_table_and_the_in_program_check_under_the_prediction(
        tmp_path: Path) -> None:
    row = _row(58.0)
    bench_compiled.attach_isolated(row)
    row["minutes"] = {"record": 0.35, "search_slice": 0.5, "search": 0.55, "outside_search": 0.74}
    env = {"date": "2026-12-04T00:00:00+00:00", "device": "NVIDIA H200", "torch": "t", "triton": "t", "cuda": "t",
           "bandwidth": {"bytes_per_s": 4.075e12, "source": "the roofline's measured copy bandwidth, ceilings.json"}}
    bench_compiled._write(tmp_path, env, [row, {"model": "conv_block_fp32", "error": "RuntimeError: boom"}],
                          final=True, seconds=60.0)
    md = (tmp_path / "compiled-bench-2026-12-04.md").read_text()
    # where the model's minutes went (what the next run's split of its time is estimated from)
    assert f"- {row['model']} took 0.35 min to record, 0.55 min to optimize (a slice of 0.5), 0.74 min outside the " \
           "search in all" in md
    header = next(line for line in md.splitlines() if line.startswith("| model |"))
    assert header.endswith("| %SOL (bytes of its buffers / peak bandwidth) before -> after |")
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1  # every row has the header's columns
    assert any(f"| {SILU} |" in line and line.endswith("| 24.6% -> 35.5% |") for line in table)
    assert any(f"| {NORM} |" in line and "| ? (kernel x: argument in_ptr0: 'float4' is not a torch dtype) |" in line
               for line in table)
    assert ("- %SOL (bytes of its buffers / peak bandwidth): the bytes of the kernel's buffers (each tensor argument "
            "of its launch record once, read or written; twice for Inductor's in-place `in_out_ptr`) / peak bandwidth "
            "(4.08 TB/s, the roofline's measured copy bandwidth, ceilings.json), over its measured time before -> after "
            "the search: an estimate from buffer sizes, not measured traffic") in md
    assert ("the kernels' own A/B predicts 1.087x (from isolated, L2-flushed kernel timings, device span; the in-program device "
            "times are the check)") in md
    assert "isolated A/B 68.2 -> 47.3 us (1.442x); in the program 62.0 -> 58.0 us (1.069x)" in md
    # which config each build ran: the tuned backend's, and plain Inductor's autotuner's choice in its build
    assert (f"- mlp_fp16 end to end ran: `{SILU}` tuned (config(5AODIZKJTAWE)) 1/call (num_warps 4, num_stages 1, "
            "grid [32768, 1, 1])") in md
    assert (f"- mlp_fp16 plain Inductor's build ran (its autotuner's choice in this build): `{SILU}` (num_warps 8, "
            "num_stages 1, grid [65536, 1, 1]) 1/call") in md
    # without plain Inductor's census the tuned line stands alone (it is not a model that "ran no binary")
    alone = _row(58.0)
    del alone["end_to_end"]["inductor_launched"]
    bench_compiled._write(tmp_path / "alone", env, [alone], final=True, seconds=60.0)
    md_alone = (tmp_path / "alone" / "compiled-bench-2026-12-04.md").read_text()
    assert "- mlp_fp16 end to end ran: " in md_alone and "ran no binary" not in md_alone
    assert "plain Inductor's build ran" not in md_alone
    assert "device busy per call of the wall time per call: Inductor 190.0 us of 262.2 us (72%)" in md
    # where the search's time went: the winner's acceptance check by kind, and the re-check's
    timed = _row(58.0)
    timed["kernels"][0].update({"search_seconds": 205.0, "acceptance_seconds": {
        "sanitize": 193.9, "sanitize/interpreter": 140.1, "sanitize/compute-sanitizer": 38.2}})
    timed["recheck"] = [{"kernel": SILU, "verdict": "equivalent", "seconds": 21.5}]
    bench_compiled._write(tmp_path / "timed", env, [timed], final=True, seconds=60.0)
    md_timed = (tmp_path / "timed" / "compiled-bench-2026-12-04.md").read_text()
    assert (f"- mlp_fp16 `{SILU}`: its search took 205.0 s, of which the winner's acceptance check 193.9 s "
            "(interpreter 140.1 s, compute-sanitizer 38.2 s)") in md_timed
    assert (f"- mlp_fp16 `{SILU}`: re-check on 3 random seeds, 2 new to the gate (GPU differential) 21.5 s, "
            "equivalent") in md_timed
    assert "acceptance check" not in md  # a row without the figures says nothing of them
    assert "0.991x (0.978-1.036; 1 tuned / 2 as Inductor made them)" in md  # the existing end-to-end cell
    assert "| conv_block_fp32 | error: RuntimeError: boom |" in md
    # the targets for this call's models: the silu at 25% of its memory bound gives the MLP headroom
    assert "- geomean of the changed kernels 1.442x, target 1.15x: met" in md
    assert ("- changed kernels: 1, geomean speedup 1.442x; of them 1 a config choice (one of the configs Inductor's "
            "autotuner compiled) and 0 a code edit") in md
    assert "- wrong results 0, target 0: met" in md
    assert ("- mlp_fp16 (a kernel at 27% of its memory bound inside the program (Inductor's build, torch.profiler), "
            "25% isolated; at most 1.210x with every searched kernel at its memory bound inside the program): "
            "end to end 0.991x, target 1.05x: **not met** "
            f"(`{SILU}`'s config choice: plain Inductor's autotuner ran another in this build (num_warps 8, "
            "num_stages 1, grid [65536, 1, 1]), and may choose the tuned one on another)") in md
    # inside the program the same kernel at its bound (its input in L2): the profile decides, no headroom there
    fast = _row(16.5)
    fast["end_to_end"]["in_program"]["kernels"] = [
        {**k, "inductor_us": 16.5} if k["kernel"] == SILU else k for k in fast["end_to_end"]["in_program"]["kernels"]]
    assert bench_compiled.in_program_sol(fast)[SILU] == pytest.approx(0.998, abs=0.01)
    lines = bench_compiled.target_lines([fast], {"geomean_changed": 1.442, "wrong_results": 0, "seconds": 60.0})
    assert ("- mlp_fp16: no headroom for the end-to-end target: with every searched kernel at its memory bound "
            "inside the program a call would save at most 0.0 us of its 262.2 us, at most 1.000x end to end, under "
            "1.05x (lowest kernel 100% of its memory bound inside the program (Inductor's build, torch.profiler), "
            "25% isolated); end to end 0.991x") in lines, lines
    # Amdahl over the profile: a kernel far from its bound in a call the library's kernels dominate has no room
    # for the target (the transformer block's kernels, H200 2026-12-04: about 8 us of a 403 us call)
    small = _row(58.0)
    small["end_to_end"]["timing"]["time_before_us"] = 1000.0
    b = bench_compiled.end_to_end_bound(small)
    assert b is not None and b["saved_us"] == pytest.approx(62.0 - (1 << 26) / 4.075e12 * 1e6)
    assert b["bound"] == pytest.approx(1000.0 / (1000.0 - b["saved_us"])) and b["bound"] < 1.05
    assert any(x.startswith("- mlp_fp16: no headroom for the end-to-end target: ") and "of its 1000.0 us, at most "
               "1.048x end to end" in x for x in bench_compiled.target_lines([small], {
                   "geomean_changed": 1.442, "wrong_results": 0, "seconds": 60.0}))
    # a kernel that runs only in the autotuner (not in the profile) and a profile without a kernel's estimate
    # count nothing; no profile: no bound (the isolated 80% rule decides)
    assert bench_compiled.end_to_end_bound({"kernels": small["kernels"], "end_to_end": {"timing": {}}}) is None
    # the same launch configuration in both builds: the choice gained nothing there
    fast["end_to_end"]["inductor_launched"] = [{**x, "num_warps": 4, "grid": [32768, 1, 1]}
                                               for x in fast["end_to_end"]["inductor_launched"]]
    assert bench_compiled.config_lottery(fast) == (f" (`{SILU}`'s config choice: plain Inductor's autotuner ran the "
                                                   "same configuration in this build)")
    near = {"model": "task:softmax", "kernels": [{"kernel": "k", "sol": {"before": 0.86, "after": 0.9}}],
            "end_to_end": {"speedup": 1.034}}
    lines = bench_compiled.target_lines([near], {"geomean_changed": None, "wrong_results": 1, "seconds": 60.0})
    assert "- task:softmax: every searched kernel at 80% or more of its memory bound before the search (lowest 86%): " \
           "no headroom by that estimate" in lines
    assert "- geomean of the changed kernels: no kernel changed (**not met**)" in lines
    assert "- wrong results 1, target 0: **not met**" in lines


def _e2e(speedup: float, rng: tuple[float, float], busy: tuple[float, float], wall: tuple[float, float]) -> dict[str, Any]:
    """`_row`'s MLP (a kernel with headroom) with the end-to-end figures given."""
    row = _row(58.0)
    e = row["end_to_end"]
    e["speedup"], e["timing"]["speedup_range"] = speedup, list(rng)
    e["in_program"]["busy_us"] = {"inductor": busy[0], "tuned": busy[1]}
    e["in_program"]["wall_us"] = {"inductor": wall[0], "tuned": wall[1]}
    return row


def test_an_end_to_end_gain_counts_only_when_its_range_and_the_device_time_show_it(tmp_path: Path) -> None:
    """conv_block on the H200 (2026-12-04): 1.132x end to end, range 0.906-1.218 over the A/B rounds, device busy
    129.0 -> 128.4 us a call, wall 390.3 -> 344.9 us: the host's time, not the tuned kernel's; the targets line
    says so and does not call it met. A gain whose range excludes 1 and whose device time fell with the wall time
    counts; one whose range excludes 1 but whose device time did not move is still the host's."""
    summary = {"geomean_changed": 1.2, "wrong_results": 0, "seconds": 60.0}
    noisy = _e2e(1.132, (0.906, 1.218), (129.0, 128.4), (390.3, 344.9))
    assert bench_compiled.unattributed(noisy) == "its range over the A/B rounds (0.906-1.218) includes no change"
    line = next(x for x in bench_compiled.target_lines([noisy], summary) if x.startswith("- mlp_fp16"))
    assert ("end to end 1.132x, not a measured gain: its range over the A/B rounds (0.906-1.218) includes no change "
            "(**not met**)") in line, line
    host = _e2e(1.132, (1.08, 1.2), (129.0, 128.4), (390.3, 344.9))
    assert bench_compiled.unattributed(host) == ("the device's busy time a call moved 129.0 -> 128.4 us, under half the "
                                                 "wall time's 390.3 -> 344.9 us: the host's time, not the kernels'")
    real = _e2e(1.132, (1.08, 1.2), (300.0, 258.0), (390.3, 344.9))
    assert bench_compiled.unattributed(real) is None
    line = next(x for x in bench_compiled.target_lines([real], summary) if x.startswith("- mlp_fp16"))
    assert "end to end 1.132x, target 1.05x: met" in line, line
    assert "is above that" not in line
    # above what the kernels can give (gap 01 on the H100, 2026-12-07: 1.322x against a bound of 1.263x): said
    above = _e2e(1.3, (1.18, 1.4), (300.0, 258.0), (390.3, 320.0))
    line = next(x for x in bench_compiled.target_lines([above], summary) if x.startswith("- mlp_fp16"))
    assert ("at most 1.132x with every searched kernel at its memory bound inside the program; the A/B's 1.300x is "
            "above that: its wall time moved more than the searched kernels can take off it") in line, line
    assert bench_compiled._measured_line([noisy, real]) == (
        "1 of the 2 above 1.0 a measured gain (mlp_fp16) (the A/B's range excludes no change and the "
        "device's busy time dropped with the wall time)")
    # the report of a results file written again with this version's reading; a file that is not one: exit 2
    env = {"date": "2026-12-04T00:00:00+00:00", "device": "NVIDIA H200", "torch": "t", "triton": "t", "cuda": "t"}
    bench_compiled._write(tmp_path / "old", env, [noisy], final=True, seconds=60.0, tag="models-c")
    src = tmp_path / "old" / "compiled-bench-2026-12-04-models-c.json"
    assert bench_compiled.main(["--rerender", str(src), "--results", str(tmp_path / "new")]) == 0
    md = (tmp_path / "new" / "compiled-bench-2026-12-04-models-c.md").read_text()
    assert "geomean: 1.132x; 0 of the 1 above 1.0 a measured gain" in md and "not a measured gain" in md
    bad = tmp_path / "compiled-bench-2026-12-04.json"
    bad.write_text("{}")
    assert bench_compiled.main(["--rerender", str(bad), "--results", str(tmp_path / "new")]) == 2


def test_expected_end_to_end_says_its_timings_are_isolated_and_names_the_check() -> None:
    doc = bench_compiled.expected_end_to_end.__doc__ or ""
    assert "isolated and L2-flushed" in doc and "`in_program`" in doc


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_on_a_gpu_the_end_to_end_profiles_both_programs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny MLP through `_end_to_end` with an empty tuned database: both programs run the same kernels, and the
    profile gives each Inductor kernel's device time in both, and a busy time within the wall time."""
    import torch
    from torch import nn

    def tiny(name: str, all_tasks: bool) -> tuple[Any, tuple[Any, ...]]:
        model = nn.Sequential(nn.Linear(256, 1024), nn.SiLU(), nn.Linear(1024, 256), nn.LayerNorm(256))
        return model.cuda().half(), (torch.randn(512, 256, device="cuda", dtype=torch.half),)

    monkeypatch.setattr(bench_compiled, "_model", tiny)
    e = bench_compiled._end_to_end("tiny", False, tmp_path / "tuned", tmp_path)
    ip = e["in_program"]
    assert ip["reason"] is None, ip
    triton = [k for k in ip["kernels"] if k["kernel"].startswith("triton_")]
    assert triton and all(k["inductor_us"] > 0 and k["tuned_us"] > 0 and not k["tuned"] for k in triton)
    for side in ("inductor", "tuned"):
        assert 0 < ip["busy_us"][side] <= ip["span_us"][side] + 1e-6
        assert ip["busy_us"][side] < ip["wall_us"][side]


def test_the_optimizers_profile_counts_kernels_not_the_graph_calls_annotation() -> None:
    """The optimizer's profile job (`worker.profile`, read by the launch-bound finding) summed every CUDA event,
    Inductor's graph-call range over the GPU timeline among them: its kernels counted twice."""
    from kstrata.agents.optimize.worker import kernel_rows

    events = _call(0.0, 68.0) + _call(1000.0, 68.0)
    rows = kernel_rows(events, 2)
    assert {r["name"] for r in rows["kernels"]} == {GEMM, SILU, NORM}
    assert rows["kernel_us_per_call"] == pytest.approx(50 + 68 + 50 + 30) and rows["launches_per_call"] == 4
    assert rows["kernels"][0]["name"] == GEMM and rows["kernels"][0]["launches_per_call"] == 2


def test_a_task_model_instantiates_that_task_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--models task:gaps/...` loads the one task file it names (instantiating every task at its published size
    allocated GBs it never used); a name with no task behind it is one clear error naming the path."""
    import kstrata.agents.tasks as tasks

    loaded: list[Path] = []

    def fake_load(path: Path) -> Any:
        loaded.append(Path(path))
        return SimpleNamespace(instantiate=lambda device: (f"model on {device}", ["x"]))

    monkeypatch.setattr(tasks, "load_task", fake_load)
    model, inputs = bench_compiled._model("task:gaps/01_layernorm_three_dims_fp32", False)
    assert (model, inputs) == ("model on cuda", ("x",))
    assert [p.relative_to(bench_compiled.ROOT).as_posix() for p in loaded] == [
        "testsuite/tasks/gaps/01_layernorm_three_dims_fp32.py"]
    with pytest.raises(ValueError, match=r"task:gaps/nope: no task testsuite/tasks/gaps/nope\.py"):
        bench_compiled._model("task:gaps/nope", False)


def test_an_unknown_model_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A `--models` name that is neither a project model nor a task file stops the run before anything starts."""
    assert bench_compiled._unknown_model(["mlp_fp16", "task:gaps/01_layernorm_three_dims_fp32"]) is None
    assert bench_compiled.main(["--results", "/tmp/unused", "--models", "mlp_fp16,task:gaps/nope"]) == 2
    assert "error: --models: task:gaps/nope: no task testsuite/tasks/gaps/nope.py" in capsys.readouterr().err
    assert bench_compiled.main(["--results", "/tmp/unused", "--models", "mpl_fp16"]) == 2
    err = capsys.readouterr().err
    assert "mpl_fp16: not a model" in err and len(err.strip().splitlines()) == 1


def test_a_models_search_leaves_room_for_its_own_end_to_end_and_the_models_after_it() -> None:
    """The search's share of the run: after the recording, less this model's re-check and end to end (at least
    3 times its recording) and each later model's steps outside its search (the most measured on the models
    before; 1.2 minutes while none was)."""
    minutes = bench_compiled._search_minutes
    assert bench_compiled.OVERHEAD_PER_RECORD == 3.0 and bench_compiled.FIRST_OVERHEAD_MIN == 1.2
    # one model, a quick recording: the first-model reserve (1.2 minutes, less the 0.1 already spent recording)
    assert minutes(5.9, 1, 0.1, []) == pytest.approx(5.9 - 1.1)
    # a published-size model: 1.5 minutes to record, so 4.5 outside the search, 3 of them still to come
    assert minutes(10.0, 1, 1.5, []) == pytest.approx(10.0 - 3.0)
    # three models left, the ones before took 2 minutes outside their search, this one 0.5 to record: 2 minutes
    # outside its search (more than 3 times 0.5), 1.5 still to come, then 2 for each later model
    assert minutes(12.0, 3, 0.5, [2.0, 1.0]) == pytest.approx((12.0 - 1.5 - 4.0) / 3)
    assert minutes(12.0, 3, 0.1, [2.0, 1.0]) == pytest.approx((12.0 - 1.9 - 4.0) / 3)
    # small tasks (H100, 2026-12-08: about 0.75 minutes outside each search): once one was measured, the first-model
    # reserve no longer holds back every later model's share
    assert minutes(4.0, 2, 0.2, [0.75]) == pytest.approx((4.0 - 0.55 - 0.75) / 2)
    # a larger recording than the models before took outside their search: 3 times it
    assert minutes(8.0, 2, 1.0, [0.75]) == pytest.approx((8.0 - 2.0 - 3.0) / 2)
    # never less than half a minute, even when the run is already over its time
    assert minutes(1.0, 2, 1.0, [3.0]) == 0.5


def test_a_row_written_before_its_end_to_end_says_so_instead_of_a_target_not_met() -> None:
    row = {"model": "task:gaps/01", "pending": bench_compiled.PENDING,
           "kernels": [{"kernel": "k", "speedup": 1.627, "sol": {"before": 0.557}}]}
    summary = {"geomean_changed": 1.627, "wrong_results": 0, "seconds": 300.0}
    lines = bench_compiled.target_lines([row], summary)
    mine = [ln for ln in lines if "task:gaps/01" in ln]
    assert mine == [f"- task:gaps/01: end to end not measured ({bench_compiled.PENDING})"]
    assert not any("not met" in ln and "gaps/01" in ln for ln in lines)


def test_a_row_written_after_its_recheck_counts_its_wrong_results(tmp_path: Path) -> None:
    """Written again once its re-check ends (a call cut during the end to end keeps the re-check): the row says
    the end to end is what is missing, and a `different` re-check is a wrong result in the summary."""
    row = {**_row(58.0), "pending": bench_compiled.PENDING_END_TO_END,
           "recheck": [{"kernel": SILU, "verdict": "different", "seconds": 12.0}]}
    del row["end_to_end"]
    env = {"date": "2026-12-07T00:00:00+00:00", "device": "NVIDIA H100", "torch": "t", "triton": "t", "cuda": "t"}
    summary = bench_compiled._write(tmp_path, env, [row], final=False, seconds=400.0)
    assert summary["wrong_results"] == 1 and summary["complete"] is False
    md = (tmp_path / "compiled-bench-2026-12-07.md").read_text()
    assert f"- {row['model']}: end to end not measured ({bench_compiled.PENDING_END_TO_END})" in md
    assert "written after its re-check" in bench_compiled.PENDING_END_TO_END


def test_an_end_to_end_cut_after_its_ab_keeps_its_figure_marked_partial(tmp_path: Path) -> None:
    """The results written when the end to end's A/B ends (`partial_writer`), before its census and profiles: the
    model's row has the speedup, says it is partial, and the run is marked incomplete."""
    row = _row(58.0)
    partial = {k: v for k, v in row["end_to_end"].items()
               if k not in ("launched", "inductor_launched", "in_program", "expected")}
    partial["partial"] = "its launch census and in-program profiles had not ended"
    del row["end_to_end"]
    env = {"date": "2026-12-07T00:00:00+00:00", "device": "NVIDIA H100", "torch": "t", "triton": "t", "cuda": "t"}
    done = {"model": "conv_block_fp32", "kernels": [], "recheck": []}
    bench_compiled.partial_writer(tmp_path, env, [done], row, time.perf_counter(), "gap01")(partial)
    md = (tmp_path / "compiled-bench-2026-12-07-gap01.md").read_text()
    data = json.loads((tmp_path / "compiled-bench-2026-12-07-gap01.json").read_text())
    assert [r["model"] for r in data["models"]] == ["conv_block_fp32", "mlp_fp16"]
    assert data["summary"]["complete"] is False and data["summary"]["geomean_end_to_end"] == pytest.approx(0.991)
    assert ("0.991x (0.978-1.036; 1 tuned / 2 as Inductor made them; partial: its launch census and in-program "
            "profiles had not ended)") in md
    assert "**Incomplete run" in md and "end to end ran:" not in md


def test_rerender_of_a_file_that_is_not_a_results_file_is_one_line(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`--rerender`: a JSON list, models of the wrong type, a row of another shape, or `--results` that is a file:
    one `error:` line naming the file, exit 2 (each was a traceback)."""
    good = {"environment": {"date": "2026-12-07T00:00:00+00:00", "device": "d", "torch": "t", "triton": "t",
                            "cuda": "c"}, "summary": {"seconds": 1.0, "complete": True}, "models": []}
    cases = {"list.json": [1, 2], "models.json": {**good, "models": {"a": 1}},
             "row.json": {**good, "models": [{"model": "m", "kernels": "not a list"}]}}
    for name, data in cases.items():
        path = tmp_path / name
        path.write_text(json.dumps(data))
        assert bench_compiled.main(["--results", str(tmp_path / "out"), "--rerender", str(path)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"error: {path}: ") and err.count("\n") == 1, err
    ok = tmp_path / "compiled-bench-2026-12-07-x.json"
    ok.write_text(json.dumps(good))
    (tmp_path / "afile").write_text("")
    assert bench_compiled.main(["--results", str(tmp_path / "afile"), "--rerender", str(ok)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'afile'}: ") and "is a file" in err and err.count("\n") == 1, err
    assert bench_compiled.main(["--results", str(tmp_path / "out"), "--rerender", str(ok)]) == 0
    assert (tmp_path / "out" / "compiled-bench-2026-12-07-x.md").is_file()
