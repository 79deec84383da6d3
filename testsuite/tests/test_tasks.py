"""KernelBench-format tasks: the task files, the loader's contract and errors, the FLOP counter, `task show|list`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import typer
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from typer.testing import CliRunner

from kstrata.agents.tasks import (
    TASK_SPEC_SCHEMA,
    FlopCounter,
    Task,
    TaskError,
    TaskSpec,
    TensorSpec,
    ValueSpec,
    count_flops,
    find_tasks,
    load_task,
)
from kstrata.testsuite.tasks import TASKS_DIR
from kstrata.tools.cli_task import task_app

TASK_PATHS = find_tasks(TASKS_DIR)
#: Tasks that only move data: no arithmetic, so zero FLOPs is the right answer.
DATA_MOVEMENT = {"29_permute_heads_fp16", "30_embedding_gather_bf16"}
_loaded: dict[Path, Task] = {}


def task_at(path: Path) -> Task:
    if path not in _loaded:
        _loaded[path] = load_task(path)
    return _loaded[path]


def write_task(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).lstrip())
    return path


IDENTITY_TASK = textwrap.dedent("""
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x):
            return x * 2


    def get_inputs():
        return [torch.randn(4, 8)]


    def get_init_inputs():
        return []
""").lstrip()


# ---------------------------------------------------------------------------------------------------
# The task files
# ---------------------------------------------------------------------------------------------------
def test_task_files_are_named_and_grouped_like_kernelbench() -> None:
    assert len(TASK_PATHS) >= 40
    groups = {p.parent.name for p in TASK_PATHS}
    assert groups == {"level1", "level2", "level3", "models", "gaps"}
    for group in groups:
        numbers = [int(p.name.split("_")[0]) for p in TASK_PATHS if p.parent.name == group]
        assert numbers == list(range(1, len(numbers) + 1)), f"{group}: numbered 1..n without gaps"
    for p in TASK_PATHS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+_(fp32|fp16|bf16)\.py", p.name), p.name
        assert "dtype=" in p.read_text(), f"{p.name}: set the dtype of inputs and parameters explicitly"


def test_tasks_mix_precisions() -> None:
    dtypes = {task_at(p).spec.dtypes[0] for p in TASK_PATHS}
    assert {"float32", "float16", "bfloat16"} <= dtypes
    for p in TASK_PATHS:
        suffix = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[p.stem.rsplit("_", 1)[1]]
        assert task_at(p).spec.dtypes == (suffix,), f"{p.name}: its name says {suffix}"


@pytest.mark.parametrize("path", TASK_PATHS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_task_loads_with_a_complete_spec(path: Path) -> None:
    spec = task_at(path).spec
    assert spec.name == path.stem and spec.schema == TASK_SPEC_SCHEMA
    assert spec.inputs and spec.outputs
    assert all(isinstance(a, TensorSpec) and a.numel > 0 and a.bytes > 0 for a in spec.outputs)
    if spec.name in DATA_MOVEMENT:
        assert spec.flops == 0
    else:
        assert spec.flops > 0 and spec.arithmetic_intensity > 0
    assert spec.min_bytes >= sum(a.bytes for a in spec.inputs if isinstance(a, TensorSpec))
    assert spec.uncounted_ops == (), f"ops the cost model misses: {spec.uncounted_ops}"
    assert spec.traced_with == "FakeTensorMode"
    assert TaskSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


@pytest.mark.parametrize("path", TASK_PATHS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_task_runs_on_the_meta_device(path: Path) -> None:
    task = task_at(path)
    model, inputs = task.instantiate("meta")
    assert all(t.device.type == "meta" for t in [*model.parameters(), *inputs] if isinstance(t, torch.Tensor))
    with torch.no_grad():
        out = model(*inputs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    assert [(tuple(o.shape), str(o.dtype).removeprefix("torch.")) for o in outs] == [
        (a.shape, a.dtype) for a in task.spec.outputs if isinstance(a, TensorSpec)]


def test_task_show_json_for_every_task() -> None:
    """Every task's spec as the child process describes it (one child for all: each `task show` starts
    its own, 5 s of torch import apiece) equals the in-process one; `task show --json` prints it."""
    from kstrata.agents.tasks import describe_tasks

    described = describe_tasks(TASK_PATHS)
    assert [p for p, _ in described] == list(TASK_PATHS)
    for path, spec in described:
        assert not isinstance(spec, Exception), (path, spec)
        assert json.loads(json.dumps(spec.to_json())) == json.loads(json.dumps(task_at(path).spec.to_json())), path
    runner = CliRunner()
    for path in TASK_PATHS[:: max(1, len(TASK_PATHS) // 3)]:
        result = runner.invoke(task_app, ["show", str(path), "--json"])
        assert result.exit_code == 0, (path, result.output)
        shown = json.loads(result.stdout)
        assert shown == json.loads(json.dumps(task_at(path).spec.to_json()))
        for key in ("inputs", "outputs", "dtypes", "parameters", "flops", "min_bytes", "arithmetic_intensity"):
            assert key in shown


def test_task_app_mounts_as_a_subcommand() -> None:
    root = typer.Typer()
    root.add_typer(task_app, name="task")

    @root.command()
    def other() -> None:
        """A second command, so that `task` stays a group."""

    path = TASKS_DIR / "level1" / "17_softmax_fp32.py"
    result = CliRunner().invoke(root, ["task", "show", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["flops"] == 5 * 4096 * 16384


def test_task_show_table() -> None:
    result = CliRunner().invoke(task_app, ["show", str(TASKS_DIR / "level2" / "01_gemm_bias_relu_fp16.py")])
    assert result.exit_code == 0, result.output
    for text in ("01_gemm_bias_relu_fp16", "2048", "float16", "FLOPs", "137.47 G", "arithmetic intensity"):
        assert text in result.stdout


def test_task_list_cli_over_the_suite() -> None:
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli_task", "list", str(TASKS_DIR), "--json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["errors"] == []
    assert [t["name"] for t in payload["tasks"]] == [p.stem for p in TASK_PATHS]


def test_task_list_reports_a_bad_file_and_goes_on(tmp_path: Path) -> None:
    write_task(tmp_path, "1_good.py", IDENTITY_TASK)
    write_task(tmp_path, "2_bad.py", "import torch\ndef get_inputs(:\n")
    write_task(tmp_path, "10_good.py", IDENTITY_TASK)
    result = CliRunner().invoke(task_app, ["list", str(tmp_path), "--json"])
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert [t["name"] for t in payload["tasks"]] == ["1_good", "10_good"]
    assert len(payload["errors"]) == 1 and "2_bad.py:2: syntax error" in payload["errors"][0]["error"]
    table = CliRunner().invoke(task_app, ["list", str(tmp_path)])
    assert table.exit_code == 1 and "1_good" in table.stdout and "2_bad.py:2" in table.output


def test_task_show_user_error_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = write_task(tmp_path, "bad.py", "import torch\nclass Model(torch.nn.Module)\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli_task", "show", str(bad)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"error: {bad}:2: syntax error")
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------------
# The loader's errors and isolation
# ---------------------------------------------------------------------------------------------------
def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write_task(tmp_path, "t.py", "import torch\n\n\ndef get_inputs()\n    return []\n")
    with pytest.raises(TaskError, match=rf"^{re.escape(str(path))}:4: syntax error"):
        load_task(path)


def test_missing_get_inputs_is_named(tmp_path: Path) -> None:
    path = write_task(tmp_path, "t.py", IDENTITY_TASK.replace("def get_inputs", "def make_inputs"))
    with pytest.raises(TaskError, match=rf"^{re.escape(str(path))}: .*missing: get_inputs$"):
        load_task(path)


def test_get_inputs_raising_names_the_line_that_raised(tmp_path: Path) -> None:
    path = write_task(tmp_path, "t.py", IDENTITY_TASK.replace(
        "return [torch.randn(4, 8)]", "shape = (4, 8)\n    raise RuntimeError('no data')"))
    with pytest.raises(TaskError) as info:
        load_task(path)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "raise RuntimeError" in text)
    assert str(info.value) == f"{path}:{line}: get_inputs() raised RuntimeError: no data"


@pytest.mark.parametrize(("change", "message"), [
    (("class Model(nn.Module):", "class Model:"), r":5: `Model` must be a subclass of torch.nn.Module"),
    (("return [torch.randn(4, 8)]", "return torch.randn(4, 8)"), r":10: `get_inputs\(\)` must return a list"),
    (("def get_init_inputs():", "def get_init_inputs(n):"), r":14: `get_init_inputs\(\)` must take no arguments"),
    (("import torch.nn as nn", "import torch.nn as nn\nimport no_such_module"), r":3: importing the task raised"),
    (("return x * 2", "return x @ x"), r":7: Model.forward\(\*get_inputs\(\)\) raised RuntimeError"),
    (("return []\n", "return []\n\n\nFLOPS = 'many'\n"), r":18: `FLOPS` must be a non-negative number"),
])
def test_loader_errors_point_at_the_line(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    path = write_task(tmp_path, "t.py", IDENTITY_TASK.replace(*change))
    with pytest.raises(TaskError, match=re.escape(str(path)) + message):
        load_task(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="no such task file"):
        load_task(tmp_path / "nowhere.py")


def test_tasks_are_isolated_from_each_other_and_from_torch_state(tmp_path: Path) -> None:
    a = write_task(tmp_path, "a.py", IDENTITY_TASK + "\n\nSECRET = 1\n")
    b = write_task(tmp_path, "b.py", IDENTITY_TASK.replace("x * 2", "x * 3") + textwrap.dedent("""

        torch.manual_seed(1234)
        torch.set_default_dtype(torch.float64)
        torch.set_default_device("meta")

        if __name__ == "__main__":
            raise SystemExit("the main block must not run")
    """))
    rng = torch.random.get_rng_state()
    ta, tb = load_task(a), load_task(b)
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert torch.get_default_dtype() == torch.float32 and torch.get_default_device() == torch.device("cpu")
    assert torch._C._len_torch_function_stack() == 0  # no default-device mode left behind
    # While the file was described, its own default dtype held, as in KernelBench's harness.
    assert tb.spec.inputs[0] == TensorSpec("x", (4, 8), "float64", (8, 1), True, 32, 256)
    assert ta.module is not tb.module and ta.model_class is not tb.model_class
    assert "SECRET" in vars(ta.module) and "SECRET" not in vars(tb.module)
    assert ta.spec.sha256 != tb.spec.sha256


def test_a_kernelbench_style_file_with_non_tensor_inputs(tmp_path: Path) -> None:
    path = write_task(tmp_path, "7_scaled.py", """
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, dim):
                super(Model, self).__init__()
                self.dim = dim

            def forward(self, x, factor, mode):
                return torch.cumsum(x * factor, dim=self.dim), x.t()

        batch_size = 128
        dim = 1

        def get_inputs():
            return [torch.rand(batch_size, 4000), 0.5, "fast"]

        def get_init_inputs():
            return [dim]
    """)
    spec = load_task(path).spec
    assert spec.init_inputs == (ValueSpec("dim", "int", 1),)
    assert spec.inputs[1:] == (ValueSpec("factor", "float", 0.5), ValueSpec("mode", "str", "fast"))
    x, out, view = spec.inputs[0], spec.outputs[0], spec.outputs[1]
    assert isinstance(x, TensorSpec) and x.shape == (128, 4000) and x.dtype == "float32" and x.contiguous
    assert isinstance(out, TensorSpec) and out.name == "output0" and out.shape == (128, 4000)
    assert isinstance(view, TensorSpec) and view.stride == (1, 4000) and not view.contiguous
    # x is read once; the cumsum result written once; the transposed view of x adds nothing.
    assert spec.min_bytes == 2 * 128 * 4000 * 4
    assert spec.flops == 2 * 128 * 4000  # a multiply and a scan step per element


def test_gpu_sized_tasks_are_not_allocated(tmp_path: Path) -> None:
    # Three 64 GiB fp32 matrices: loading must not touch that memory.
    path = write_task(tmp_path, "huge.py", IDENTITY_TASK.replace("x * 2", "x @ x + x").replace(
        "torch.randn(4, 8)", "torch.randn(131072, 131072)"))
    spec = load_task(path).spec
    n = 131072
    assert spec.flops == 2 * n**3 + n * n
    assert spec.min_bytes == 2 * n * n * 4


def test_declared_flops_and_bytes_override(tmp_path: Path) -> None:
    path = write_task(tmp_path, "t.py", IDENTITY_TASK + "\n\nFLOPS = 1_000\nBYTES = 64.0\n")
    spec = load_task(path).spec
    assert (spec.flops, spec.flops_source, spec.counted_flops) == (1000, "declared", 32)
    assert (spec.min_bytes, spec.bytes_source, spec.counted_bytes) == (64, "declared", 2 * 32 * 4)
    assert spec.arithmetic_intensity == 1000 / 64


def test_small_value_dependent_task_runs_for_real(tmp_path: Path) -> None:
    path = write_task(tmp_path, "t.py", IDENTITY_TASK.replace("return x * 2", "return x[x > 0].sum()"))
    spec = load_task(path).spec
    assert spec.traced_with == "cpu"
    assert spec.outputs[0] == TensorSpec("output", (), "float32", (), True, 1, 4)


def test_schema_version_is_checked() -> None:
    data = task_at(TASK_PATHS[0]).spec.to_json()
    data["schema"] = "kstrata.task-spec/0"
    with pytest.raises(TaskError, match="schema"):
        TaskSpec.from_json(data)


# ---------------------------------------------------------------------------------------------------
# The FLOP counter against hand-computed values
# ---------------------------------------------------------------------------------------------------
def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype)


def test_flops_gemm() -> None:
    m, k, n = 512, 384, 256
    c = count_flops(torch.mm, meta(m, k), meta(k, n))
    assert c.total == 2 * m * k * n and dict(c.by_kind)["matmul"] == c.total
    linear = nn.Linear(k, n, device="meta")
    assert count_flops(linear, meta(m, k)).total == 2 * m * k * n + m * n  # + the bias


def test_flops_conv() -> None:
    batch, cin, cout, h, w, kh, kw = 4, 16, 32, 30, 30, 3, 5
    conv = nn.Conv2d(cin, cout, (kh, kw), stride=2, padding=1, device="meta")
    ho, wo = (h + 2 - kh) // 2 + 1, (w + 2 - kw) // 2 + 1
    c = count_flops(conv, meta(batch, cin, h, w))
    assert c.total == 2 * batch * cout * ho * wo * cin * kh * kw + batch * cout * ho * wo


def test_flops_softmax() -> None:
    rows, cols = 64, 1000
    c = count_flops(torch.softmax, meta(rows, cols), -1)
    # amax, subtract, exp, sum, divide: five per element, the exp transcendental.
    assert c.total == 5 * rows * cols
    assert c.by_kind["transcendental"] == rows * cols and c.by_kind["reduction"] == 2 * rows * cols


def test_flops_fused_chain() -> None:
    m, k = 256, 128
    linear = nn.Linear(k, k, device="meta")

    def chain(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(linear(x)) * 0.5 + x

    c = count_flops(chain, meta(m, k))
    # GEMM, bias, relu, scale, residual.
    assert c.total == 2 * m * k * k + 4 * m * k
    assert dict(c.by_op) == {"aten.addmm": 2 * m * k * k + m * k, "aten.relu": m * k, "aten.mul": m * k,
                             "aten.add": m * k}


def test_flops_attention_and_norm_on_fake_tensors() -> None:
    b, h, s, d = 2, 4, 128, 32
    with FakeTensorMode():
        q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
        c = count_flops(F.scaled_dot_product_attention, q, k, v)
        assert c.total == 4 * b * h * s * s * d
        x = torch.randn(8, 64)
        norm = count_flops(F.layer_norm, x, (64,))
        # var_mean (sum and var over the row), subtract the mean, multiply by rstd; per row: divide, +eps, rsqrt.
        assert norm.total == 4 * 8 * 64 + 3 * 8 and not norm.uncounted


def test_flops_pow_by_an_integer_is_arithmetic() -> None:
    c = count_flops(lambda x: (x**2, x**0.5), meta(10))
    assert c.by_kind["pointwise"] == 10 and c.by_kind["transcendental"] == 10


def test_flop_counter_on_real_tensors_gives_the_same_results() -> None:
    x = torch.randn(16, 32)
    with torch.no_grad(), FlopCounter() as c:
        y = torch.log_softmax(x, dim=-1)
    assert torch.allclose(y, torch.log_softmax(x, dim=-1))
    assert c.total > 5 * x.numel() - 1
