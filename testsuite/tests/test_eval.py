"""The hardened evaluator, the roofline and the bench report.

CPU tests (CI): the policy arithmetic and KernelBench's tolerances, output comparison, the trial input
distributions, storage checks, process isolation and timeouts, and every adversarial candidate that can
be shown on a CPU, against small copies of the suite's tasks (the same `Model`, smaller sizes). GPU
tests (`gpu` marker): every adversarial candidate against the suite's tasks on the GPU, correct
candidates accepted, timing and the roofline.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from kstrata.agents import bench, roofline
from kstrata.agents.eval_worker import _overlaps, _same_bits, digest, make_inputs, reshape_values
from kstrata.agents.evaluate import (
    DISTRIBUTIONS,
    KERNELBENCH_TOLERANCE,
    STRICT_FACTOR,
    STRICT_FLOOR_EPS_REL_L2,
    EvalError,
    compare_output,
    evaluate,
    kernelbench_tolerance,
    strict_bounds,
)
from kstrata.agents.tasks import import_task_module
from kstrata.testsuite.tasks import TASKS_DIR

from .conftest import has_cuda

ADVERSARIAL = Path(__file__).resolve().parents[1] / "adversarial"
gpu = pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")


def shrunk_task(tmp_path: Path, task: str, sizes: dict[str, int]) -> Path:
    """A copy of a suite task with its module-level size constants replaced (same Model, smaller inputs)."""
    src = (TASKS_DIR / task).read_text()
    for name, value in sizes.items():
        src, n = re.subn(rf"^{name} = \d+$", f"{name} = {value}", src, flags=re.M)
        assert n == 1, f"{task} has no line `{name} = <int>`"
    path = tmp_path / Path(task).name
    path.write_text(src)
    return path


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).lstrip())
    return path


# ---------------------------------------------------------------------------------------------------
# Tolerances and the strict policy
# ---------------------------------------------------------------------------------------------------
def test_kernelbench_tolerances_are_kernelbenchs() -> None:
    assert KERNELBENCH_TOLERANCE == {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}
    assert kernelbench_tolerance(torch.float32) == 1e-4
    assert kernelbench_tolerance("bfloat16") == 1e-2
    assert kernelbench_tolerance(torch.int64) is None


def test_strict_rejects_tf32_and_bf16_on_the_h200_gemm_figures() -> None:
    # Relative errors against float64 of a 4096^3 fp32 GEMM measured on an H200 (issue 7).
    fp32, tf32, bf16 = 8.4e-7, 2.8e-5, 1.8e-3
    _, bound = strict_bounds(torch.float32, 0.0, fp32, 1.0)
    assert fp32 <= bound < tf32 < bf16
    assert bound == pytest.approx(STRICT_FACTOR * fp32 + STRICT_FLOOR_EPS_REL_L2 * torch.finfo(torch.float32).eps)
    # KernelBench's fp32 tolerance would admit TF32 there: 1e-4 relative is above TF32's error.
    assert tf32 < KERNELBENCH_TOLERANCE["float32"]


LOGSUMEXP_TASK = TASKS_DIR.parent / "template_tasks" / "08_linear_sigmoid_logsumexp_fp16.py"
LOGSUMEXP_CANDIDATE = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, dtype=torch.float16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(self.linear(x).float()) * 4.0  # in fp32, rounded once at the end
        return (torch.logsumexp(y[:, :COLUMNS], dim=1) + 1.0).half()
"""


@pytest.mark.parametrize(("columns", "accepted"), [("150", True), ("-6", False)])
def test_strict_at_fp16_rejects_a_reduction_that_leaves_out_a_few_columns(tmp_path: Path, columns: str,
                                                                          accepted: bool) -> None:
    # Found writing the GEMM + logsumexp template: under the old relative-L2 floor (8 eps, 7.8e-3 at fp16) a
    # logsumexp over 144 of its 150 columns passed (relative L2 5.0e-3 against float64; PyTorch's own 3.1e-4).
    # The same computation in fp32, rounded once, is more exact than PyTorch's and passes.
    cand = tmp_path / "model_new.py"
    cand.write_text(LOGSUMEXP_CANDIDATE.replace("COLUMNS", columns))
    v = evaluate(LOGSUMEXP_TASK, cand, device="cpu", timing=False, trials=5)
    assert v.accepted is accepted and v.correct_strict is accepted, v.reason


def test_compare_output_strict_versus_kernelbench() -> None:
    g = torch.Generator().manual_seed(0)
    truth = torch.randn(256, 256, dtype=torch.float64, generator=g) * 50
    noise = torch.randn(256, 256, dtype=torch.float64, generator=g).clamp(-4, 4)
    ref = (truth * (1 + 1e-7 * noise)).float()
    close = (truth * (1 + 2e-7 * noise)).float()  # within 4x the reference's own error
    lowp = (truth * (1 + 2e-5 * noise)).float()  # TF32-like: far above it, inside KernelBench's 1e-4
    ok = compare_output("o", ref, close, truth)
    assert ok.strict_ok and ok.kernelbench_ok and ok.strict_basis == "float64"
    bad = compare_output("o", ref, lowp, truth)
    assert bad.kernelbench_ok and not bad.strict_ok
    assert "error against float64" in bad.detail
    # Without a float64 reference, strict falls back to KernelBench's check and says why.
    fb = compare_output("o", ref, lowp, None, fp64_note="the float64 reference failed: X")
    assert fb.strict_ok == fb.kernelbench_ok and "float64 reference failed" in fb.strict_basis


def test_compare_output_integers_nonfinite_and_values() -> None:
    a = torch.tensor([1, 2, 3])
    assert compare_output("i", a, a.clone(), None).strict_ok
    r = compare_output("i", a, torch.tensor([1, 2, 4]), None)
    assert not r.strict_ok and not r.kernelbench_ok and "1 of 3" in r.detail
    x = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare_output("f", x, x.clone(), x.double()).strict_ok
    y = compare_output("f", x, torch.tensor([1.0, 0.0, float("inf")]), x.double())
    assert not y.strict_ok and y.nonfinite_mismatches == 1
    assert compare_output("v", 3, 3, None).strict_ok and not compare_output("v", 3, 4, None).strict_ok


# ---------------------------------------------------------------------------------------------------
# Trial inputs and storage checks
# ---------------------------------------------------------------------------------------------------
def test_trial_inputs_keep_shapes_dtypes_domains_and_are_seeded(tmp_path: Path) -> None:
    task = write(tmp_path, "t.py", """
        import torch
        import torch.nn as nn
        class Model(nn.Module):
            def forward(self, x, p, idx):
                return x
        def get_inputs():
            return [torch.randn(64, 32, dtype=torch.bfloat16), torch.rand(64, 32).softmax(-1),
                    torch.randint(0, 10, (64,))]
        def get_init_inputs():
            return []
    """)
    module = import_task_module(task)
    assert len(DISTRIBUTIONS) >= 5 and DISTRIBUTIONS[0] == "task"
    seen = set()
    for trial in range(len(DISTRIBUTIONS)):
        x, p, idx = make_inputs(module, trial, 42, "cpu")
        assert x.shape == (64, 32) and x.dtype == torch.bfloat16 and p.dtype == torch.float32
        assert idx.dtype == torch.int64 and int(idx.max()) < 10
        assert bool((p >= 0).all()), "a non-negative input stays non-negative"
        again = make_inputs(module, trial, 42, "cpu")
        assert digest([x, p, idx]) == digest(again), "inputs are a function of (task, trial, seed)"
        seen.add(digest([x]))
    assert len(seen) == len(DISTRIBUTIONS)
    zeros = make_inputs(module, DISTRIBUTIONS.index("zeros-negatives"), 42, "cpu")[0].float()
    assert int((zeros == 0).sum()) > 0 and int((zeros < 0).sum()) > 0
    shifted = reshape_values(torch.randn(10000), "shifted-scaled", torch.Generator().manual_seed(1))
    assert float(shifted.mean()) > 0.5 and float(shifted.std()) > 1.2


def test_reshaped_inputs_are_built_in_chunks_with_the_same_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Published-size inputs are reshaped chunk by chunk (bounded temporaries); the finite statistics merge
    exactly, the values do not depend on anything but the generator, and the input's layout is kept."""
    from kstrata.agents import eval_worker

    monkeypatch.setattr(eval_worker, "RESHAPE_CHUNK", 1000)
    x = torch.randn(64, 97) * 3 + 2
    x[3, 5], x[7, 1] = float("inf"), float("nan")
    m, s, nonneg, n = eval_worker._finite_stats(x.reshape(-1))
    fin = x[x.isfinite()].double()
    assert n == fin.numel() and not nonneg
    assert abs(m - float(fin.mean())) < 1e-12 and abs(s - float(fin.std())) < 1e-12
    for dist in ("shifted-scaled", "uniform-offset", "heavy-tailed", "zeros-negatives"):
        a = reshape_values(x, dist, torch.Generator().manual_seed(5))
        assert torch.equal(a, reshape_values(x, dist, torch.Generator().manual_seed(5)))
        assert a.shape == x.shape and a.dtype == x.dtype
    t = x.t()  # a transposed input stays transposed, with the values of its contiguous copy
    r = reshape_values(t, "heavy-tailed", torch.Generator().manual_seed(5))
    assert r.stride() == t.stride()
    assert torch.equal(r, reshape_values(t.contiguous(), "heavy-tailed", torch.Generator().manual_seed(5)))


def test_storage_overlap_and_bitwise_equality() -> None:
    assert _overlaps((0, 10), (5, 20)) and not _overlaps((0, 10), (10, 20)) and not _overlaps((0, 0), (0, 5))
    nan = torch.tensor([float("nan"), 1.0])
    assert _same_bits(nan, nan.clone())
    assert not _same_bits(nan, torch.tensor([float("nan"), 2.0]))


# ---------------------------------------------------------------------------------------------------
# Isolation: crashes, hangs, exits and import errors are verdicts, not harness failures
# ---------------------------------------------------------------------------------------------------
TINY_TASK = """
    import torch
    import torch.nn as nn
    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x)
    def get_inputs():
        return [torch.randn(32, 64)]
    def get_init_inputs():
        return []
"""


@pytest.mark.parametrize(("body", "failure", "words"), [
    ("import os\nclass ModelNew:\n    def __init__(self):\n        os.abort()\n", "crash", "SIGABRT"),
    ("import time, torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        time.sleep(1000)\n",
     "timeout", "timed out"),
    ("import sys, torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        sys.exit(0)\n",
     "crash", "SystemExit"),
    ("import torch\nclass Model(torch.nn.Module):\n    pass\n", "import", "no `ModelNew`"),
    ("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x[:, :3].relu()\n",
     "shape", "expected shape"),
])
def test_candidate_failures_are_verdicts(tmp_path: Path, body: str, failure: str, words: str) -> None:
    task = write(tmp_path, "task.py", TINY_TASK)
    cand = tmp_path / "cand.py"
    cand.write_text(body)
    # The hang is cut at 6 s (wherever the worker is by then, the verdict is a timeout); the others finish.
    v = evaluate(task, cand, device="cpu", timeout_s=6 if failure == "timeout" else 120, trials=5)
    assert not v.accepted and v.failure == failure, v.reason
    assert words in v.reason
    assert json.loads(json.dumps(v.to_json()))["accepted"] is False


def test_harness_errors_are_raised(tmp_path: Path) -> None:
    task = write(tmp_path, "task.py", TINY_TASK)
    with pytest.raises(EvalError, match="no such candidate"):
        evaluate(task, tmp_path / "missing.py", device="cpu")
    with pytest.raises(EvalError, match="at least 5 trials"):
        evaluate(task, task, device="cpu", trials=3)
    with pytest.raises(EvalError, match="unknown policy"):
        evaluate(task, task, device="cpu", policy="lenient")


# ---------------------------------------------------------------------------------------------------
# Adversarial candidates on the CPU (small copies of the suite's tasks)
# ---------------------------------------------------------------------------------------------------
RELU = ("level1/11_relu_fp32.py", {"batch_size": 64, "dim": 512})
GEMM = ("level1/01_square_gemm_fp32.py", {"N": 192})
KL = ("level1/34_kl_div_fp32.py", {"batch_size": 128, "num_classes": 1024})

CPU_ADVERSARIAL = [
    ("cached_output", RELU, "no-aliasing"),
    ("empty_output_reuse", RELU, None),
    ("input_zeroing", RELU, "inputs-unchanged"),
    ("background_thread", RELU, "no-background-threads"),
    ("lower_precision_bf16", GEMM, None),
    ("pointer_cache", RELU, None),
    ("patched_timer", RELU, "timer-integrity"),
    ("reference_result", RELU, None),
    ("constant_output", KL, None),
]


@pytest.mark.parametrize(("name", "task", "check"), CPU_ADVERSARIAL, ids=[c[0] for c in CPU_ADVERSARIAL])
def test_adversarial_candidates_are_rejected_on_cpu(tmp_path: Path, name: str, task: tuple[str, dict[str, int]],
                                                    check: str | None) -> None:
    path = shrunk_task(tmp_path, *task)
    v = evaluate(path, ADVERSARIAL / f"{name}.py", device="cpu", timeout_s=60, trials=5)
    assert not v.accepted, f"{name} was accepted: {v.reason}"
    assert not v.correct_strict
    if check:
        assert check in v.reason, v.reason
    if name == "constant_output":  # off the task's own distribution the shortcut fails under either policy
        assert not any(t.passes("kernelbench") for t in v.trials if t.distribution != "task")


def test_correct_candidates_are_accepted_on_cpu(tmp_path: Path) -> None:
    relu = shrunk_task(tmp_path, *RELU)
    v = evaluate(relu, ADVERSARIAL / "correct_torch_ops.py", device="cpu", timeout_s=60)
    assert v.accepted and v.correct_strict and v.correct_kernelbench, v.reason
    assert len(v.trials) == 6 and {t.distribution for t in v.trials} == set(DISTRIBUTIONS)
    # no timing on the CPU, said as such; precision switches and peak memory of every process reported
    assert v.candidate_timing is None and v.timing_note == "skipped: --device cpu (timing needs a GPU)"
    assert v.to_json()["timing_note"] == v.timing_note and v.memory["plan"]["mode"] == "all-trials"
    assert v.memory["reference"]["peak_host_bytes"] > 0 and v.memory["candidate"]["peak_host_bytes"] > 0
    assert {"matmul_allow_tf32", "cudnn_allow_tf32", "matmul_fp16_reduced_precision_reduction"} <= \
        set(v.precision["reference"]) and v.precision["candidate"]
    gemm = shrunk_task(tmp_path, *GEMM)
    v = evaluate(gemm, ADVERSARIAL / "correct_gemm_fp32.py", device="cpu", timeout_s=60, policy="kernelbench")
    assert v.accepted and v.correct_strict, v.reason


def test_lockstep_trials_judge_one_trial_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # outputs too large to keep every trial are judged trial by trial: forced here on a small task
    from kstrata.agents import evaluate as ev

    real = ev.memory_plan

    def lockstep(spec: object, device: str, trials: int) -> ev.MemoryPlan:
        import dataclasses

        return dataclasses.replace(real(spec, device, trials), mode="lockstep")

    monkeypatch.setattr(ev, "memory_plan", lockstep)
    # and every output tensor through the raw trial files of published-size tasks (trial_io)
    from kstrata.agents import trial_io

    monkeypatch.setenv("KSTRATA_RAW_TRIAL_BYTES", "64")
    mapped: list[int] = []
    real_from_file = trial_io._from_file

    def from_file(*a: object, **kw: object) -> torch.Tensor:
        mapped.append(1)
        return real_from_file(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(trial_io, "_from_file", from_file)
    relu = shrunk_task(tmp_path, *RELU)
    seen: list[tuple[str, int]] = []
    v = ev.evaluate(relu, ADVERSARIAL / "correct_torch_ops.py", device="cpu", timeout_s=120, trials=5,
                    on_progress=lambda role, done, total, s: seen.append((role, done)))
    assert v.accepted and len(v.trials) == 5 and v.memory["plan"]["mode"] == "lockstep", v.reason
    assert len(mapped) >= 3 * 5, mapped  # per trial: the reference's output and float64 copy, the candidate's
    # the two processes alternate: reference trial i, then candidate trial i
    assert seen == [(role, i) for i in range(1, 6) for role in ("reference", "candidate")], seen
    wrong = write(tmp_path, "identity.py", "import torch\nclass ModelNew(torch.nn.Module):\n"
                                           "    def forward(self, x):\n        return x.clone()\n")
    v = ev.evaluate(relu, wrong, device="cpu", timeout_s=120, trials=5)
    assert not v.accepted and v.failure == "mismatch" and len(v.trials) == 5, v.reason


def test_a_task_too_large_for_the_machine_says_so_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    from kstrata.agents import evaluate as ev
    from kstrata.agents.tasks import load_task

    spec = load_task(TASKS_DIR.parent / "tasks_published" / "level1" / "19_ReLU.py").spec
    assert spec.inputs[0].shape == (4096, 393216) and spec.outputs[0].bytes == 4096 * 393216 * 4
    monkeypatch.setattr(ev, "host_available_memory", lambda: 32 << 30)
    with pytest.raises(EvalError, match=r"too large for the CPU: .*6\.0 GiB.*32\.0 GiB available"):
        ev.memory_plan(spec, "cpu", 6)
    # on a GPU host with 128 GB: every trial's outputs and float64 copies (2 x 6 x 18 GiB) do not fit, one does
    monkeypatch.setattr(ev, "host_available_memory", lambda: 128 << 30)
    assert ev.memory_plan(spec, "cuda", 6).mode == "lockstep"
    monkeypatch.setattr(ev, "host_available_memory", lambda: 40 << 30)
    with pytest.raises(EvalError, match="does not fit in host memory"):
        ev.memory_plan(spec, "cuda", 6)


def test_eval_cli_exit_codes_and_json(tmp_path: Path) -> None:
    relu = shrunk_task(tmp_path, *RELU)
    cmd = [sys.executable, "-m", "kstrata.tools.cli_eval", "eval", str(relu), str(ADVERSARIAL / "input_zeroing.py"),
           "--json", "--device", "cpu", "--trials", "5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["accepted"] is False and "inputs-unchanged" in data["reason"] and len(data["trials"]) == 5
    proc = subprocess.run([*cmd[:4], str(tmp_path / "nope.py"), *cmd[5:]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "nope.py" in proc.stderr


# ---------------------------------------------------------------------------------------------------
# Roofline and the bench report
# ---------------------------------------------------------------------------------------------------
CEILINGS = roofline.Ceilings(device="Test GPU", date="2026-11-30", copy_bytes_per_s=4.0e12,
                             matmul_flops_per_s={"float32": 50e12, "tf32": 400e12, "float16": 700e12,
                                                 "bfloat16": 700e12})


class _Spec:
    def __init__(self, flops: int, min_bytes: int, dtype: str = "float32", matmul: int | None = None) -> None:
        self.flops, self.min_bytes, self.dtypes, self.flops_source = flops, min_bytes, (dtype,), "counted"
        self.flops_by_kind = (("matmul", flops if matmul is None else matmul),)


def test_speed_of_light_and_flags() -> None:
    gemm = _Spec(2 * 4096**3, 3 * 4096 * 4096 * 4)
    # strict fp32: the faster of the fp32 rate and the bf16 rate over the six products of a split (700e12 / 6)
    sol, compute, memory = roofline.speed_of_light(gemm, CEILINGS)
    assert sol == compute == pytest.approx(2 * 4096**3 / (700e12 / 6)) and memory < compute
    slow_bf16 = roofline.Ceilings(**{**CEILINGS.to_json(), "matmul_flops_per_s": {"float32": 50e12, "bfloat16": 240e12}})
    assert roofline.speed_of_light(gemm, slow_bf16)[1] == pytest.approx(2 * 4096**3 / 50e12)  # 240 / 6 < 50
    half = roofline.assess(gemm, CEILINGS, 2 * sol, speedup=1.2)
    assert half.fraction == pytest.approx(0.5) and half.bound == "compute" and not half.flags
    fast = roofline.assess(gemm, CEILINGS, 0.5 * sol, speedup=11.0)
    assert len(fast.flags) == 2 and "speed of light" in fast.flags[0] and "above 10x" in fast.flags[1]
    copy = _Spec(0, 8 << 30, matmul=0)
    assert roofline.assess(copy, CEILINGS, (8 << 30) / 2e12).bound == "memory"
    assert roofline.Ceilings.from_json(json.loads(json.dumps(CEILINGS.to_json()))) == CEILINGS


def test_speed_of_light_under_a_tf32_policy_bounds_matmuls_by_the_tensor_cores() -> None:
    """Gap task 06 (GEMM 32768x1024x4096 + Swish + sum + GroupNorm, fp32; 2.75e11 of its 2.76e11 FLOPs a GEMM)
    as the H200 measured it on 2026-12-03 (its ceilings' fp32 and TF32 rates): the tf32 table's template at
    1152 us was flagged 4.76x faster than light because the fp32 SIMT rate bounded its GEMM; under `tf32`
    the TF32 rate does and it is 66% of SOL, unflagged. `strict` bounds it by the bf16 rate over the split's six
    products (126 TFLOP/s), so 1152 us is still flagged there (1.9x faster than light)."""
    h200 = roofline.Ceilings(device="NVIDIA H200", date="2026-12-03", copy_bytes_per_s=4.075e12,
                             matmul_flops_per_s={"float32": 50.38e12, "tf32": 376.0e12, "float16": 677.8e12,
                                                 "bfloat16": 756.6e12})
    task06 = _Spec(276362690560, 687931392, matmul=275012124672)
    strict = roofline.assess(task06, h200, 1152e-6, 1475 / 1152, baseline_seconds=1475e-6)
    assert strict.fraction == pytest.approx(1.92, abs=0.01) and "faster than speed of light" in strict.flags[0]
    tf32 = roofline.assess(task06, h200, 1152e-6, 1475 / 1152, baseline_seconds=1475e-6, policy="tf32")
    assert tf32.fraction == pytest.approx(0.658, abs=0.002) and not tf32.flags and tf32.bound == "compute"
    other = (276362690560 - 275012124672) / 50.38e12  # pointwise, reductions: still at the fp32 rate
    assert tf32.compute_seconds == pytest.approx(275012124672 / 376.0e12 + other)
    assert roofline.speed_of_light(task06, h200, "bf16")[1] == pytest.approx(275012124672 / 756.6e12 + other)
    # which rate a policy takes: fp16/bf16 tasks keep their own; without a measured TF32 rate the datasheet's
    # dense peak where it is known (the H200's 494 TFLOP/s), else fp32's
    assert roofline.matmul_precision("float32", "tf32") == "tf32" and roofline.matmul_precision("float16", "tf32") == "float16"
    assert roofline.matmul_precision("float32", "strict") == "float32"
    old = roofline.Ceilings(device="NVIDIA H200", date="2026-11-01", copy_bytes_per_s=4e12,
                            matmul_flops_per_s={"float32": 50e12})
    assert old.matmul_rate("float32", "tf32") == 494e12 and old.matmul_rate("float32") == 50e12
    assert roofline.Ceilings(**{**old.to_json(), "device": "Other GPU"}).matmul_rate("float32", "tf32") == 50e12


def test_fast_p_and_geomean_follow_kernelbench() -> None:
    correct = [True, True, False, True]
    speed = [2.0, 0.5, 3.0, 1.2]
    assert bench.fast_p(correct, speed, 0.0) == 0.75
    assert bench.fast_p(correct, speed, 1.0) == 0.5
    assert bench.fast_p(correct, speed, 1.5) == 0.25
    assert bench.geomean([2.0, 0.5]) == pytest.approx(1.0) and bench.geomean([]) is None


def _fake_results() -> dict[str, object]:
    def entry(t: float, s: float | None, ok: bool = True) -> dict[str, object]:
        return {"ok": True, "correct": ok, "timing": {"median_us": t, "p10_us": t * 0.9, "p90_us": t * 1.1, "min_us": t,
                                                      "runs": 100}, "speedup_vs_eager": s, "sol_fraction": 0.5,
                "roofline": {"sol_seconds": t * 0.5e-6, "bound": "memory"}, "flags": []}

    return {"suite": "testsuite/tasks", "device": "Test GPU", "versions": {"torch": "x"}, "runs": 100, "seed": 42,
            "baselines": ["eager", "compile"], "ceilings": CEILINGS.to_json(),
            "tasks": {f"level1/{i}_t.py": {"dtypes": ["float32"], "flops": 1e9 * (i + 1), "min_bytes": 1e8,
                                           "arithmetic_intensity": 10.0 * (i + 1),
                                           "baselines": {"eager": entry(100.0, 1.0), "compile": entry(50.0 + 40 * i, 100 / (50 + 40 * i), i != 2)}}
                      for i in range(4)}}


def test_bench_report_markdown_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    results = _fake_results()
    results["summary"] = bench.summarize(results)
    s = results["summary"]["compile"]
    assert s["correct"] == 3 and s["fast_p"]["fast_1"] == 0.5 and s["fast_p"]["fast_0"] == 0.75
    md = bench.render_markdown(results)
    assert "fast_1.5" in md and "level1/3_t.py" in md and "| compile | 4 | 3 | 0 |" in md
    assert s["fast_p_unflagged"] == s["fast_p"]
    written = bench.write_report(results, tmp_path)
    assert {p.name for p in written} == {"bench-report.md", "bench-speedup.png", "bench-roofline.png",
                                         "bench-sol-fraction.png"}
    assert all(p.stat().st_size > 1000 for p in written)


@pytest.mark.slow  # about 25 s on the 2-core machine: two evaluator processes, five bench runs
def test_bench_goes_through_the_engine_resumes_and_answers_from_its_cache(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """bench's baselines are engine candidates: the first run evaluates (the hardened evaluator, strict
    against float64 with eager's own error as the scale), a resumed run skips what its results file holds, a
    fresh run on the same engine cache answers from it with identical rows, and --no-cache evaluates again."""
    pytest.importorskip("matplotlib")
    suite = tmp_path / "suite"
    suite.mkdir()
    write(suite, "1_relu.py", TINY_TASK)
    write(suite, "2_broken.py", "import torch\nclass Model(torch.nn.Module):\n    pass\n")
    cache = tmp_path / "engine"
    lines: list[str] = []

    def run(out: str, **kw: Any) -> dict[str, Any]:
        return bench.run_bench(suite, ["eager"], tmp_path / out, runs=5, device="cpu", ceilings=CEILINGS,
                               on_progress=lines.append, engine_cache=cache, **kw)

    first = run("a")
    row = first["tasks"]["1_relu.py"]["baselines"]["eager"]
    assert row["ok"] and row["correct"] and row["kernelbench_vs_eager"] and row["trials"] >= 5, row
    # judged against float64 (eager's own error is the scale), with the precision switches it ran under
    assert row["errors"][0]["judged_by"] == "float64" and row["errors"][0]["bound_rel_l2"] > 0
    assert row["precision"]["cudnn_allow_tf32"] is True  # PyTorch's defaults: bench's baselines as users run them
    assert row["memory"]["peak_host_bytes"] > 0
    assert row["timing"] is None and "GPU" in row["timing_note"]  # nothing timed without a GPU, and it says so
    assert row["engine"]["cached"] is False and first["engine"]["evaluated"] == 1
    assert not first["tasks"]["2_broken.py"]["baselines"]["eager"]["ok"]
    out = tmp_path / "a"
    assert (out / "bench-report.md").exists() and (out / "bench-sol-fraction.png").exists()
    again = run("a")
    assert "2 tasks, 2 already in" in " ".join(lines) and again["tasks"].keys() == first["tasks"].keys()

    cached = run("b")  # a new results file, the same engine cache
    hit = cached["tasks"]["1_relu.py"]["baselines"]["eager"]
    assert hit["engine"]["cached"] is True and cached["engine"]["cached"] == 1
    assert "1 baseline results answered from it, 0 evaluated" in lines[-1]
    assert "(engine cache)" in lines[-2]
    strip = ("engine",)
    assert {k: v for k, v in hit.items() if k not in strip} == {k: v for k, v in row.items() if k not in strip}
    assert hit["engine"]["candidate"] == row["engine"]["candidate"]

    # --no-cache: the evaluator is asked again (here it refuses, so the row shows it was asked)
    from kstrata.agents import evaluate as evaluate_module

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise evaluate_module.EvalError("evaluated again")

    monkeypatch.setattr(evaluate_module, "evaluate", refuse)
    fresh = run("c", use_cache=False)
    assert fresh["tasks"]["1_relu.py"]["baselines"]["eager"] == {"ok": False, "error": "evaluated again"}


def test_bench_has_no_timer_of_its_own() -> None:
    """Timing is the engine's (backends/timing.py): agents/bench.py reads no clock and starts no process."""
    import ast

    tree = ast.parse(Path(bench.__file__).read_text())
    names = {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(tree)
             if isinstance(n, (ast.Attribute, ast.Name))}
    imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    clocks = {"perf_counter", "monotonic", "time_ns", "Event", "elapsed_time", "time_gpu", "time_cuda",
              "interleaved_ab", "Popen", "ChildStream", "spawn", "call_in_child"}
    assert not (names | imported) & clocks, (names | imported) & clocks
    assert "time" not in imported and "subprocess" not in imported


# ---------------------------------------------------------------------------------------------------
# On the GPU
# ---------------------------------------------------------------------------------------------------
RELU_GPU = ("level1/11_relu_fp32.py", {"batch_size": 2048, "dim": 4096})
GPU_ADVERSARIAL = [
    ("cached_output", RELU_GPU, "no-aliasing"),
    ("empty_output_reuse", RELU_GPU, None),
    ("input_zeroing", RELU_GPU, "inputs-unchanged"),
    ("side_stream", RELU_GPU, None),
    ("background_thread", RELU_GPU, None),
    ("lower_precision_tf32", ("level1/01_square_gemm_fp32.py", {}), None),
    ("lower_precision_bf16", ("level1/01_square_gemm_fp32.py", {}), None),
    ("pointer_cache", RELU_GPU, None),
    ("patched_timer", RELU_GPU, "timer-integrity"),
    ("reference_result", RELU_GPU, None),
    ("constant_output", ("level1/34_kl_div_fp32.py", {}), None),
    ("wrong_after_warmup", RELU_GPU, "correct-after-timing"),
]


def _gpu_task(tmp_path: Path, task: tuple[str, dict[str, int]]) -> Path:
    return shrunk_task(tmp_path, *task) if task[1] else TASKS_DIR / task[0]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(("name", "task", "check"), GPU_ADVERSARIAL, ids=[c[0] for c in GPU_ADVERSARIAL])
def test_adversarial_candidates_are_rejected_on_gpu(tmp_path: Path, name: str, task: tuple[str, dict[str, int]],
                                                    check: str | None) -> None:
    v = evaluate(_gpu_task(tmp_path, task), ADVERSARIAL / f"{name}.py", device="cuda", timeout_s=300,
                 timing=name in ("patched_timer", "wrong_after_warmup"), runs=100)
    print(f"VERDICT {name}: accepted={v.accepted} strict={v.correct_strict} kernelbench={v.correct_kernelbench} "
          f"kernelbench_task_inputs={v.correct_kernelbench_task_inputs} failure={v.failure} reason={v.reason}")
    assert not v.accepted and not v.correct_strict, v.reason
    if name == "lower_precision_tf32":  # the verdict names the error against float64 and PyTorch's own
        assert "error against float64" in v.reason and "PyTorch's own float32 error" in v.reason, v.reason
    if check:
        assert check in v.reason, v.reason


@pytest.fixture(scope="module")
def gpu_ceilings(tmp_path_factory: pytest.TempPathFactory) -> roofline.Ceilings:
    return roofline.load_or_measure(tmp_path_factory.mktemp("ceilings"))[0]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(("name", "task"), [
    ("correct_torch_ops", RELU_GPU), ("correct_triton_relu", RELU_GPU),
    ("correct_gemm_fp32", ("level1/01_square_gemm_fp32.py", {})),
])
def test_correct_candidates_are_accepted_on_gpu(tmp_path: Path, name: str, task: tuple[str, dict[str, int]],
                                                gpu_ceilings: roofline.Ceilings) -> None:
    v = evaluate(_gpu_task(tmp_path, task), ADVERSARIAL / f"{name}.py", device="cuda", timeout_s=300, timing=True,
                 ceilings=gpu_ceilings)
    print(f"VERDICT {name}: accepted={v.accepted} reason={v.reason} speedup={v.speedup} "
          f"cand={v.candidate_timing} ref={v.reference_timing} roofline={v.roofline}")
    assert v.correct_strict and v.correct_kernelbench, v.reason
    assert v.candidate_timing is not None and v.candidate_timing.runs >= 100
    assert v.speedup is not None and math.isfinite(v.speedup)
    assert v.accepted, v.reason


def test_device_hash_sees_every_word_and_position() -> None:
    """The hash that replaces host sha256 for large GPU inputs (13 s per 6.4 GB input, twice per trial):
    exact integer arithmetic, so equal bytes give equal values in any process; one changed bit, two
    swapped elements or a trailing byte change it."""
    from kstrata.agents.eval_worker import device_hash

    x = torch.randn(100_003)
    h = device_hash(x)
    assert h == device_hash(x.clone()) and h.startswith("dev:") and len(h) == 20
    flipped = x.clone()
    flipped.view(torch.int32)[777] ^= 1
    swapped = x.clone()
    swapped[[5, 6]] = x[[6, 5]]
    assert len({h, device_hash(flipped), device_hash(swapped)}) == 3
    b = torch.arange(7, dtype=torch.uint8)
    b2 = b.clone()
    b2[6] = 9
    assert device_hash(b) != device_hash(b2)  # the padded last word counts


@gpu
def test_device_hash_is_the_same_on_the_gpu_and_the_cpu() -> None:
    from kstrata.agents.eval_worker import DEVICE_HASH_BYTES, device_hash

    x = torch.randn(DEVICE_HASH_BYTES // 4 + 5)
    assert device_hash(x) == device_hash(x.cuda())
    assert digest([x.cuda()]) == digest([x.cuda().clone()]) != digest([x])  # large GPU tensors: device hash


@pytest.mark.slow
def test_eval_goes_through_the_engine_with_its_options(tmp_path: Path) -> None:
    """`kstrata eval`'s path: the candidate as `Candidate.task`, checked by the engine with the evaluator's
    options, the verdict and its report carried back, never served from the cache (it holds this run's
    memory peaks); `measure` has nothing to reuse on the CPU."""
    from kstrata.agents.engine import Candidate, Engine, TaskOptions, Verdict

    relu = shrunk_task(tmp_path, *RELU)
    seen: list[tuple[str, int]] = []
    options = TaskOptions(trials=5, seed=3, on_progress=lambda role, done, total, s: seen.append((role, done)))
    with Engine(tmp_path / "engine") as engine:
        base = engine.add_task(relu)
        built = engine.adopt_task(base, ADVERSARIAL / "correct_torch_ops.py")
        assert built.key == Candidate.task(base, (ADVERSARIAL / "correct_torch_ops.py").read_text()).key
        first = engine.check(base, built, device="cpu", timeout=60, task=options)
        assert first.verdict is Verdict.EQUIVALENT and first.task_verdict.accepted, first.reason
        assert first.report == first.task_verdict.to_json() and len(first.report["trials"]) == 5
        assert first.task_verdict.candidate == str(ADVERSARIAL / "correct_torch_ops.py")  # evaluated in place
        assert ("candidate", 5) in seen and ("reference", 5) in seen
        wrong = engine.check(base, engine.adopt_task(base, ADVERSARIAL / "input_zeroing.py"), device="cpu",
                             timeout=60, task=options)
        assert wrong.verdict is Verdict.DIFFERENT and "inputs-unchanged" in wrong.reason and not wrong.cached
        assert engine.stats.checks == 2 and engine.stats.check_cache_hits == 0
        if not has_cuda():
            assert engine.measure(base, built).status == "skipped"  # nothing timed on the CPU, nothing to reuse


def test_a_cached_output_is_rejected_when_earlier_outputs_were_released(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """At published sizes the candidate's process keeps only the newest outputs (a share of the device's
    memory); the alias check then cannot see a result cached from a released trial, the trial's values
    must still reject it, and the check says which trials it did not compare with."""
    monkeypatch.setenv("KSTRATA_KEEP_OUTPUT_BYTES", "0")
    path = shrunk_task(tmp_path, *RELU)
    v = evaluate(path, ADVERSARIAL / "cached_output.py", device="cpu", timeout_s=60, trials=5)
    assert not v.accepted and not v.correct_strict
    assert "no-aliasing" not in v.reason, v.reason
    details = [c.detail for t in v.trials for c in t.checks if c.name == "no-aliasing"]
    assert any("released before this trial" in d for d in details), details


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_bench_on_the_gpu_is_timed_by_the_engine_and_answered_from_its_cache(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    write(suite, "1_relu.py", TINY_TASK.replace("torch.randn(32, 64)", "torch.randn(4096, 4096, device='cuda')"))

    def run(out: str, **kw: Any) -> dict[str, Any]:
        return bench.run_bench(suite, ["eager", "compile"], tmp_path / out, runs=20, ceilings=CEILINGS,
                               on_progress=lambda m: None, engine_cache=tmp_path / "engine", **kw)["tasks"]["1_relu.py"]

    first = run("a")["baselines"]
    for b in ("eager", "compile"):
        assert first[b]["ok"] and first[b]["correct"] and first[b]["timing"]["runs"] == 20, first[b]
        assert first[b]["memory"]["peak_gpu_bytes"] > 0 and first[b]["engine"]["cached"] is False
    assert first["compile"]["speedup_vs_eager"] > 0
    again = run("b")["baselines"]
    assert all(again[b]["engine"]["cached"] for b in again)
    assert again["compile"]["timing"] == first["compile"]["timing"]  # the kept measurement, not a new one
    fresh = run("c", use_cache=False)["baselines"]
    assert not fresh["compile"]["engine"]["cached"] and fresh["compile"]["timing"] != first["compile"]["timing"]


# ---------------------------------------------------------------------------------------------------
# What PyTorch's precision settings admit: TF32 convolutions (cudnn.allow_tf32, True by default)
# ---------------------------------------------------------------------------------------------------
CONV_TASK = """import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 8, 3, padding=1)
    def forward(self, x):
        return torch.relu(self.conv(x))
def get_inputs():
    return [torch.randn(2, 16, 12, 12)]
def get_init_inputs():
    return []
"""

TF32_CANDIDATE = """import torch
def tf32(t):  # what a TF32 convolution does to its operands (10 mantissa bits, to nearest)
    return ((t.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)
class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 8, 3, padding=1)
    def forward(self, x):
        w, b = self.conv.weight, self.conv.bias
        return torch.relu(torch.nn.functional.conv2d(tf32(x), tf32(w), b * SCALE, padding=1) * SCALE)
SCALE = 1.0
"""


def test_tf32_convolutions_that_pytorchs_settings_allow_are_the_scale_and_nothing_more(tmp_path: Path) -> None:
    """A candidate whose convolution is TF32 (as torch.compile's cuDNN convolutions are at PyTorch's
    defaults, measured on the H200) is correct against float64 when the reference's settings allow TF32
    convolutions (the bench baselines' `kernelbench` policy), with the TF32 rounding's error as the
    scale; not under `strict` (TF32 off) nor when nothing allows it; a wrong one is wrong either way."""
    import os

    task = tmp_path / "conv.py"
    task.write_text(CONV_TASK)
    tf32 = tmp_path / "tf32.py"
    tf32.write_text(TF32_CANDIDATE)
    wrong = tmp_path / "wrong.py"
    wrong.write_text(TF32_CANDIDATE.replace("SCALE = 1.0", "SCALE = 1.003"))
    forced = {**os.environ, "KSTRATA_TF32_ALLOWANCE": "force"}  # the GPU's setting, on the CPU

    v = evaluate(task, tf32, policy="kernelbench", device="cpu", trials=5, env=forced)
    out = v.trials[0].outputs[0]
    assert v.correct_strict and out.strict_scale == "tf32", out
    assert out.allowance_rel_l2 is not None and out.reference_rel_l2 is not None
    assert out.allowance_rel_l2 > 50 * out.reference_rel_l2  # TF32 is far coarser than fp32
    assert out.candidate_rel_l2 is not None and out.candidate_rel_l2 <= out.strict_bound_rel_l2  # type: ignore[operator]
    assert "TF32 rounding" in bench._strict_reason(v.to_json())

    from kstrata.agents.eval_worker import tf32_allowed_ops

    assert tf32_allowed_ops("cpu") == ()  # CPU convolutions are never TF32
    assert ("convolution" in tf32_allowed_ops("cuda")) == torch.backends.cudnn.allow_tf32
    strict = evaluate(task, tf32, policy="strict", device="cpu", trials=5, env=forced)  # strict: TF32 off
    assert not strict.accepted and strict.trials[0].outputs[0].allowance_rel_l2 is None
    bad = evaluate(task, wrong, policy="kernelbench", device="cpu", trials=5, env=forced)
    assert not bad.correct_strict and "TF32 rounding, which its settings allow" in bad.trials[0].outputs[0].detail


def test_outputs_after_timing_are_judged_with_the_same_tf32_allowance(tmp_path: Path) -> None:
    """Measured on the H200: torch.compile's TF32 convolution passed every trial with the allowance and was
    then called wrong by the after-timing check, which compared without it. Both use one comparison now."""
    from kstrata.agents.eval_worker import _tf32_round
    from kstrata.agents.evaluate import WorkerRun, _after_timing
    from kstrata.agents.trial_io import save_trial

    torch.manual_seed(0)
    x, w = torch.randn(2, 16, 12, 12), torch.randn(8, 16, 3, 3)
    ref = torch.nn.functional.conv2d(x, w)
    ref64 = torch.nn.functional.conv2d(x.double(), w.double())
    tf32_out = torch.nn.functional.conv2d(_tf32_round(x), _tf32_round(w))
    emulated = torch.nn.functional.conv2d(_tf32_round(x.double()), _tf32_round(w.double()))
    d = (emulated - ref64).abs()
    allowance = {"max_abs": float(d.max()), "rel_l2": float(d.norm() / ref64.norm())}

    def check(last_ref: dict[str, Any]) -> list[Any]:
        save_trial({"last": [tf32_out], "random": [tf32_out], "random_call": 3, "calls": 12}, tmp_path / "timed.pt")
        run = WorkerRun("candidate", {}, 0, False, "", tmp_path, 0.0)
        return _after_timing(run, last_ref)

    plain = check({"outputs": [ref], "outputs64": [ref64]})
    assert [c.ok for c in plain] == [False, False] and "bound" in plain[0].detail
    allowed = check({"outputs": [ref], "outputs64": [ref64], "tf32_allowance": [allowance]})
    assert [c.ok for c in allowed] == [True, True], allowed
