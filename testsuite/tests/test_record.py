"""Launch records: the file format, and `kstrata record -- CMD` on a real program (the Triton interpreter
on the CPU here; the same hook records compiled launches on a GPU)."""

from __future__ import annotations

import json
import os
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
