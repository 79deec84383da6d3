"""Launch records: the file format, and `kstrata record -- CMD` on a real program (the Triton interpreter
on the CPU here; the same hook records compiled launches on a GPU)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kstrata.ir.launch import LaunchRecord, LaunchRecordError, ScalarArg, TensorArg
from kstrata.testsuite.kernels import get_kernel
from kstrata.testsuite.kernels.build import bundle_for


def test_record_round_trips_and_checks_against_a_kernel(tmp_path: Path) -> None:
    from kstrata.ir.target import Target

    rec = LaunchRecord("vector_add_kernel", "cuda:90", (5, 1, 1), (
        TensorArg("x_ptr", "float32", (5003,), (1,), 0, 5003, False), TensorArg("y_ptr", "float32", (5003,), (1,)),
        TensorArg("out_ptr", "float32", (5003,), (1,), written=True), ScalarArg("n", "i32", 5003)), num_warps=4)
    path = rec.save(tmp_path / "r.json")
    assert LaunchRecord.load(path) == rec
    assert rec.args[0].needed_numel == 5003  # type: ignore[union-attr]
    bundle = bundle_for(get_kernel("vector_add"), Target.parse("cuda:90"))
    rec.check_against(bundle.params)
    swapped = LaunchRecord(rec.kernel, rec.target, rec.grid, (rec.args[3], *rec.args[:3]))
    with pytest.raises(LaunchRecordError, match="do not match"):
        swapped.check_against(bundle.params)
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(LaunchRecordError, match=r"bad\.json"):
        LaunchRecord.load(tmp_path / "bad.json")


def test_kstrata_record_a_program(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import torch
        from kstrata.testsuite.kernels import get_kernel
        from kstrata.testsuite.kernels.run import launch
        for name in ("vector_add", "softmax_online"):
            k = get_kernel(name)
            for seed in range(3):  # three launches each; one is recorded per kernel by default
                launch(k, k.make_args(torch.Generator().manual_seed(seed)))
    """))
    out = tmp_path / "records"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "record", "--out", str(out), "--snapshots",
                           "--json", "--", sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["records"]
    assert sorted(r["kernel"] for r in rows) == ["softmax_online_kernel", "vector_add_kernel"]
    rec = LaunchRecord.load(out / "vector_add_kernel-1.json")
    assert rec.grid == (5, 1, 1) and rec.target == "interpreter"
    assert [a.name for a in rec.args] == ["x_ptr", "y_ptr", "out_ptr", "n"]
    assert [getattr(a, "written", None) for a in rec.args[:3]] == [False, False, True]
    assert rec.args[3] == ScalarArg("n", "i32", 5003)
    assert (out / "vector_add_kernel-1.x_ptr.npy").exists()
    failing = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "record", "--out", str(out), "--",
                              sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, text=True, timeout=120,
                             check=False)
    assert failing.returncode == 3


def test_compiled_launch_hook_records_cache_and_override_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook on `CompiledKernel.launch_metadata` + launch-exit hook, driven the way Triton's launcher
    (and Inductor's generated one) drives it: arguments by position, constexprs included, then the exit
    hook with the object `launch_metadata` returned. CPU tensors stand in for device ones."""
    from collections import namedtuple
    from types import SimpleNamespace

    import torch

    from kstrata.ir.triton_layout import base32_key
    from kstrata.tools.record import LaunchRecorder

    fn = SimpleNamespace(arg_names=["in_ptr0", "out_ptr0", "xnumel", "XBLOCK"], constexprs=[3])
    src = SimpleNamespace(fn=fn, signature={"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i64",
                                            "XBLOCK": "constexpr"}, hash=lambda: "ab" * 32)
    Meta = namedtuple("Meta", "hash num_warps num_stages target")
    kernel = SimpleNamespace(name="triton_poi_fused_relu_0", src=src,
                             metadata=Meta("cd" * 32, 4, 1, SimpleNamespace(backend="cuda", arch=90)))
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/opt/torch/bin/ptxas")  # what Inductor sets
    recorder = LaunchRecorder(tmp_path, max_per_kernel=1)
    launch_metadata = recorder._wrap_launch_metadata(lambda k, grid, stream, *args: object())
    x, y = torch.randn(300), torch.zeros(300)
    for _ in range(2):  # the second launch of the same binary is not recorded
        handle = launch_metadata(kernel, (3, 1, 1), 0, x, y, 300, 128)
        y.copy_(x.relu())  # what the launch would do
        recorder._after_launch(handle)
    assert not recorder.pending
    rec = LaunchRecord.load(tmp_path / "triton_poi_fused_relu_0-1.json")
    assert not (tmp_path / "triton_poi_fused_relu_0-2.json").exists()
    assert rec.cache_key == "cd" * 32 and rec.override_key == base32_key("ab" * 32)
    assert rec.grid == (3, 1, 1) and rec.target == "cuda:90" and rec.num_warps == 4
    assert [a.name for a in rec.args] == ["in_ptr0", "out_ptr0", "xnumel"]  # the constexpr is left out
    assert [getattr(a, "written", None) for a in rec.args[:2]] == [False, True]
    assert rec.args[2] == ScalarArg("xnumel", "i64", 300)  # the compiled signature's type, not Python's guess
    assert rec.extra["TRITON_PTXAS_PATH"] == "/opt/torch/bin/ptxas"
    # where each buffer lay, so the optimizer can show that no written buffer overlaps another argument
    assert rec.extra["storage"] == {"in_ptr0": [x.untyped_storage().data_ptr(), 1200],
                                    "out_ptr0": [y.untyped_storage().data_ptr(), 1200]}
    recorder.write_counts()  # every launch is counted, recorded or not: the optimizer's time shares
    counts = json.loads((tmp_path / ".kstrata" / "launch-counts.json").read_text())["kernels"]
    assert counts == [{"kernel": kernel.name, "cache_key": base32_key("cd" * 32), "launches": 2,
                       "benchmark_launches": 0}]
    # another binary of the same kernel name (an autotuning config) is recorded too, numbered on
    other = SimpleNamespace(name=kernel.name, src=src, metadata=kernel.metadata._replace(hash="ef" * 32, num_warps=8))
    recorder._after_launch(launch_metadata(other, (3,), 0, x, y, 300, 64))
    assert LaunchRecord.load(tmp_path / "triton_poi_fused_relu_0-2.json").cache_key == "ef" * 32


def test_install_hooks_triton_launch_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from triton import knobs
    from triton.compiler.compiler import CompiledKernel

    from kstrata.tools.record import LaunchRecorder

    monkeypatch.setattr(CompiledKernel, "launch_metadata", CompiledKernel.launch_metadata)
    monkeypatch.setattr(knobs.runtime, "interpret", False)
    recorder = LaunchRecorder(tmp_path)
    recorder.install()
    try:
        assert getattr(CompiledKernel.launch_metadata, "__wrapped__", None) is not None
        assert recorder._after_launch in knobs.runtime.launch_exit_hook.calls
    finally:
        knobs.runtime.launch_exit_hook.remove(recorder._after_launch)


@pytest.mark.parametrize(("change", "message"), [
    ({"grid": "5"}, "field grid: Input should be a valid list"),
    ({"num_warps": "4"}, "field num_warps: Input should be a valid integer, got '4'"),
    ({"colour": 1}, "field colour: Extra inputs are not permitted"),
    ({"args": [{"kind": "tensor", "name": "x", "dtype": "float32", "shape": ["a"], "stride": [1]}]},
     r"field args\[0\]\.shape\[0\]: Input should be a valid integer"),
    ({"args": [{"kind": "blob", "name": "x"}]}, r"field args\[0\]: Input tag 'blob'"),
    ({"schema": "kstrata.launch/2"}, "not a launch record .schema 'kstrata.launch/2'; expected schema kstrata.launch/1"),
])
def test_launch_record_schema_errors_name_the_file_and_the_field(tmp_path: Path, change: dict[str, object],
                                                                message: str) -> None:
    rec = LaunchRecord("k", "cuda:90", (5, 1, 1), (TensorArg("x", "float32", (7,), (1,)), ScalarArg("n", "i32", 7)))
    path = tmp_path / "rec.json"
    path.write_text(json.dumps({**rec.to_json(), **change}))
    with pytest.raises(LaunchRecordError) as info:
        LaunchRecord.load(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and "\n" not in text
    assert re.search(message, text), text


def test_candidate_description_schema(tmp_path: Path) -> None:
    from kstrata.ir.candidate import CANDIDATE_FILE, CandidateInfo
    from kstrata.ir.errors import KstrataError

    info = CandidateInfo("k", "ttgir(num-stages{n=4})", None, None, {"num_stages": 4})
    (tmp_path / CANDIDATE_FILE).write_bytes(info.encode())
    assert CandidateInfo.read(tmp_path) == info
    (tmp_path / CANDIDATE_FILE).write_text('{"schema": "kstrata.candidate/1", "kernel": "k", "pipelin": "x"}')
    with pytest.raises(KstrataError, match=r"kstrata-candidate\.json: malformed candidate description: field pipelin"):
        CandidateInfo.read(tmp_path)


def test_record_does_not_change_an_interpreted_program(tmp_path: Path) -> None:
    """`kstrata record -- python -m kstrata.testsuite.kernels.run --device cpu` (which sets TRITON_INTERPRET
    itself) must run as it does alone: importing Triton in the recorder's start-up made kernels that call
    Triton's @jit library functions (tl.sum in layernorm) fail, and nothing was recorded."""
    out = tmp_path / "records"
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "record", "--out", str(out), "--",
                           sys.executable, "-m", "kstrata.testsuite.kernels.run", "--device", "cpu", "--only",
                           "vector_add", "layernorm_fwd"], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed, 0 failed" in proc.stdout
    assert sorted(p.name for p in out.glob("*.json")) == ["layernorm_fwd_kernel-1.json", "vector_add_kernel-1.json"]
    counts = json.loads((out / ".kstrata" / "launch-counts.json").read_text())["kernels"]  # written at exit
    assert {(c["kernel"], c["launches"]) for c in counts} == {("layernorm_fwd_kernel", 1), ("vector_add_kernel", 1)}


def test_launches_of_inductors_autotuner_are_counted_apart_and_channels_last_tensors_are_recorded(
        tmp_path: Path) -> None:
    """Inductor benchmarks each config of a kernel before the program runs it (on the H200 the MLP's two silu
    configs had 82 and 25 launches for 3 program calls): those launches are counted apart, so shares are the
    program's. A channels-last output (stride(-1) != 1) is recorded (it could not be viewed as bytes in place:
    every launch of the conv block's kernels went unrecorded)."""
    from collections import namedtuple
    from types import SimpleNamespace

    import torch

    from kstrata.ir.triton_layout import base32_key
    from kstrata.tools.record import LaunchRecorder

    fn = SimpleNamespace(arg_names=["in_ptr0", "out_ptr0", "xnumel"], constexprs=[])
    src = SimpleNamespace(fn=fn, signature={"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32"},
                          hash=lambda: "ab" * 32)
    Meta = namedtuple("Meta", "hash num_warps num_stages target")
    kernel = SimpleNamespace(name="triton_poi_fused_convolution_0", src=src,
                             metadata=Meta("cd" * 32, 4, 1, SimpleNamespace(backend="cuda", arch=90)))
    recorder = LaunchRecorder(tmp_path, max_per_kernel=1)
    launch_metadata = recorder._wrap_launch_metadata(lambda k, grid, stream, *args: object())
    x = torch.randn(2, 8, 5, 5).to(memory_format=torch.channels_last)
    y = torch.zeros_like(x)
    assert y.stride(-1) != 1

    def launch() -> None:
        handle = launch_metadata(kernel, (1, 1, 1), 0, x, y, x.numel())
        y.copy_(x * 2.0)
        recorder._after_launch(handle)

    # the autotuner's benchmark: a function `bench` of Inductor's heuristics module somewhere up the stack
    autotuner: dict[str, object] = {"__name__": "torch._inductor.runtime.triton_heuristics", "launch": launch}
    exec("def bench():\n    for _ in range(5):\n        launch()\n", autotuner)
    autotuner["bench"]()  # type: ignore[operator]
    launch()  # the program's own launch
    rec = LaunchRecord.load(tmp_path / "triton_poi_fused_convolution_0-1.json")
    out = next(a for a in rec.args if a.name == "out_ptr0")
    assert out.written and tuple(out.stride) == tuple(y.stride())
    recorder.write_counts()
    counts = json.loads((tmp_path / ".kstrata" / "launch-counts.json").read_text())["kernels"]
    assert counts == [{"kernel": kernel.name, "cache_key": base32_key("cd" * 32), "launches": 1,
                       "benchmark_launches": 5}]


def test_launch_counts_of_every_process_are_added_and_an_os_exit_still_writes_them(tmp_path: Path) -> None:
    """Every process of a recorded program that imports Triton has a recorder, Inductor's compile workers
    too: each wrote the whole counts file at exit, so a worker that launched nothing could replace the
    program's counts with an empty list; and the optimizer's job runner ends with `os._exit`, which skips
    the exit hook, so its counts were never written (on the H200 the ir space read an empty file). Counts
    are now added under a lock, and `kstrata.agents.leave.leave` writes them before `os._exit`."""
    out = tmp_path / "records"
    program = tmp_path / "prog.py"
    program.write_text(
        "import os, subprocess, sys\n"
        "import torch, triton, triton.language as tl\n"
        "@triton.jit\n"
        "def twice(x_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.arange(0, BLOCK)\n"
        "    m = offs < n\n"
        "    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)\n"
        "if sys.argv[1:] == ['idle']:\n"
        "    sys.exit(0)  # a process that imports Triton and launches nothing (a compile worker)\n"
        "x = torch.ones(8)\n"
        "for _ in range(3):\n"
        "    twice[(1,)](x, 8, BLOCK=8)\n"
        "subprocess.run([sys.executable, __file__, 'idle'], check=True)\n"
        "from kstrata.agents.leave import leave\n"
        "leave(0)\n")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    for _ in range(2):  # a second recording into the same directory starts its counts afresh
        proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "record", "--out", str(out), "--",
                               sys.executable, str(program)], capture_output=True, text=True, timeout=300,
                              env=env, check=False)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        counts = json.loads((out / ".kstrata" / "launch-counts.json").read_text())["kernels"]
        assert [(c["kernel"], c["launches"]) for c in counts] == [("twice", 3)]


def test_recorder_counts_written_twice_are_added_once(tmp_path: Path) -> None:
    """`leave()` before `os._exit` and the exit hook may both run: each write adds only what was counted
    since the last one."""
    from kstrata.tools.record import LaunchRecorder

    rec = LaunchRecorder(tmp_path)
    for _ in range(4):
        rec._take("k", "")
    rec.write_counts()
    rec.write_counts()
    other = LaunchRecorder(tmp_path)  # another process of the program
    other._take("k", "")
    other._take("j", "", benchmark=True)
    other.write_counts()
    rows = json.loads((tmp_path / ".kstrata" / "launch-counts.json").read_text())["kernels"]
    assert {(r["kernel"], r["launches"], r["benchmark_launches"]) for r in rows} == {("k", 5, 0), ("j", 0, 1)}


def test_a_tensor_with_an_odd_stride_on_a_size_one_dimension_is_recorded(tmp_path: Path) -> None:
    """PyTorch calls a tensor contiguous whatever the stride of a size-1 dimension, so `contiguous()` left
    Inductor's GroupNorm statistics (shape (N, G, 1), last stride 1024) as they were and viewing them as bytes
    raised: on the H200 no launch of either GroupNorm kernel was recorded, and the ir space found nothing.
    With `--snapshots` the bf16 input is saved as raw bytes."""
    out = tmp_path / "records"
    program = tmp_path / "prog.py"
    program.write_text(
        "import torch, triton, triton.language as tl\n"
        "@triton.jit\n"
        "def fill(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.arange(0, BLOCK)\n"
        "    m = offs < n\n"
        "    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m).to(tl.float32) + 1, mask=m)\n"
        "x = torch.ones(8, 1, dtype=torch.bfloat16).as_strided((8, 1), (1, 1024))\n"
        "y = torch.zeros(8, 1).as_strided((8, 1), (1, 1024))\n"
        "assert y.is_contiguous() and y.stride(-1) == 1024\n"
        "fill[(1,)](x, y, 8, BLOCK=8)\n")
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "record", "--snapshots", "--out", str(out),
                           "--", sys.executable, str(program)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "not recorded" not in proc.stderr, proc.stderr[-2000:]
    record = LaunchRecord.load(out / "fill-1.json")
    tensors = {a.name: a for a in record.args if isinstance(a, TensorArg)}
    assert tensors["y_ptr"].written and not tensors["x_ptr"].written
    assert tensors["y_ptr"].stride == (1, 1024)
    import numpy as np

    assert np.load(out / "fill-1.x_ptr.npy").tobytes() == bytes.fromhex("803f") * 8  # bf16 1.0, raw
