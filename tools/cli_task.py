"""`kstrata task`: KernelBench-format tasks, one (`show`) or a directory of them (`list`).

`task_app` is a typer sub-app; `kstrata.tools.cli` mounts it as `task`. Run on its own, this module is
the same sub-app (`python -m kstrata.tools.cli_task show TASK.py`), with the same exit codes: 0 on
success, 1 when `list` met a bad task file, 2 for a user error (one line naming the file).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from kstrata.ir.errors import KstrataError
from kstrata.tools.console import JsonFlag, emit_json, err, error_line, out

if TYPE_CHECKING:  # the task module imports torch: only when a task command runs
    from kstrata.agents.tasks import TaskSpec, TensorSpec

task_app = typer.Typer(help="KernelBench-format tasks: inputs, outputs, FLOPs, bytes and arithmetic intensity.",
                       no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

_emit_json = emit_json

DEFAULT_TIMEOUT_S = 120.0
TimeoutOption = Annotated[float, typer.Option("--timeout", help="Seconds one task file may take to load and trace.")]


@task_app.command("show")
def task_show(
    task: Annotated[Path, typer.Argument(metavar="TASK.py", help="A KernelBench-format task file (Model, get_inputs, get_init_inputs).")],
    as_json: JsonFlag = False,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> None:
    """Inputs, outputs, dtypes, parameters, FLOPs, minimum bytes and arithmetic intensity of one task."""
    from kstrata.agents.tasks import describe_task

    spec = describe_task(task, timeout_s=timeout)  # user code: in a child process, with a timeout
    if as_json:
        _emit_json(spec.to_json())
        return
    _print_spec(spec)


@task_app.command("list")
def task_list(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="A directory of task files (searched recursively).")],
    as_json: JsonFlag = False,
    timeout: TimeoutOption = DEFAULT_TIMEOUT_S,
) -> None:
    """Every task under DIRECTORY, one line each; a bad file is reported, the rest still listed (exit 1)."""
    from kstrata.agents.tasks import describe_tasks, find_tasks

    specs: list[TaskSpec] = []
    errors: list[dict[str, str]] = []
    # In child processes with a per-file timeout: a task that exits, crashes or hangs is its own error.
    for path, result in describe_tasks(find_tasks(directory), timeout_s=timeout):
        if isinstance(result, KstrataError):
            errors.append({"path": str(path), "error": str(result)})
        else:
            specs.append(result)
    if as_json:
        _emit_json({"directory": str(directory), "tasks": [s.to_json() for s in specs], "errors": errors})
    else:
        table = Table(title=f"{len(specs)} tasks under {directory}" + (f", {len(errors)} failed" if errors else ""))
        for col in ("task", "dtypes", "inputs", "FLOPs", "min bytes", "FLOP/B"):
            table.add_column(col, justify="right" if col in ("FLOPs", "min bytes", "FLOP/B") else "left")
        for s in specs:
            from kstrata.agents.tasks import TensorSpec as _TensorSpec

            shapes = ", ".join(_shape(a) for a in s.inputs if isinstance(a, _TensorSpec))
            table.add_row(_relative(s.path, directory), ",".join(_short(d) for d in s.dtypes), shapes, _flops(s.flops),
                          _bytes(s.min_bytes), f"{s.arithmetic_intensity:.2f}")
        out.print(table)
        for e in errors:
            err.print(f"[red]FAIL[/] {escape(e['error'])}", highlight=False, markup=True, soft_wrap=True)
    if errors:
        raise typer.Exit(1)


def _print_spec(s: TaskSpec) -> None:
    out.print(f"[bold]{escape(s.name)}[/]  {escape(s.path)}  [dim]sha256 {s.sha256[:16]}[/]", highlight=False)
    args = Table(title="arguments and results", title_justify="left")
    for col in ("role", "name", "shape", "dtype", "stride", "contiguous", "bytes"):
        args.add_column(col, justify="right" if col == "bytes" else "left")
    for role, items in (("init", s.init_inputs), ("input", s.inputs), ("output", s.outputs)):
        for a in items:
            from kstrata.agents.tasks import ValueSpec

            if isinstance(a, ValueSpec):
                args.add_row(role, a.name, f"= {a.value!r}", a.type, "", "", "")
            else:
                stride = "" if a.stride is None else str(list(a.stride))
                args.add_row(role, a.name, _shape(a), a.dtype, stride, "yes" if a.contiguous else "no", _bytes(a.bytes))
    out.print(args)

    cost = Table(title="cost of one forward pass", title_justify="left")
    cost.add_column("")
    cost.add_column("value", justify="right")
    cost.add_column("detail")
    p, b = s.parameters, s.buffers
    cost.add_row("parameters", _bytes(p.bytes), _state(p.count, p.numel, p.dtypes))
    cost.add_row("buffers", _bytes(b.bytes), _state(b.count, b.numel, b.dtypes))
    kinds = ", ".join(f"{k} {_flops(v)}" for k, v in s.flops_by_kind if v)
    cost.add_row("FLOPs", _flops(s.flops), f"{s.flops_source}" + (f": {kinds}" if kinds else ""))
    if s.flops_source == "declared":
        cost.add_row("counted FLOPs", _flops(s.counted_flops), "what kstrata counted")
    top = ", ".join(f"{op} {_flops(v)}" for op, v in s.flops_by_op[:4])
    if top:
        cost.add_row("largest ops", "", top)
    cost.add_row("minimum bytes", _bytes(s.min_bytes), f"{s.bytes_source}: inputs + outputs + parameters, each once")
    if s.bytes_source == "declared":
        cost.add_row("counted bytes", _bytes(s.counted_bytes), "what kstrata counted")
    cost.add_row("arithmetic intensity", f"{s.arithmetic_intensity:.2f}", "FLOP per byte")
    if s.uncounted_ops:
        cost.add_row("uncounted ops", str(len(s.uncounted_ops)), ", ".join(s.uncounted_ops))
    out.print(cost)


def _shape(a: TensorSpec) -> str:
    return "(" + ", ".join(str(d) for d in a.shape) + ")"


def _short(dtype: str) -> str:
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
            "int32": "i32"}.get(dtype, dtype)


def _state(count: int, numel: int, dtypes: tuple[tuple[str, int], ...]) -> str:
    if not count:
        return "none"
    kinds = ", ".join(f"{n}×{_short(d)}" for d, n in dtypes)
    return f"{count} tensors, {numel:,} elements ({kinds})"


def _flops(n: int) -> str:
    for scale, unit in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def _bytes(n: int) -> str:
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return path


def main() -> None:
    """Run `task_app` on its own, turning kstrata's user errors into one line and exit code 2."""
    try:
        task_app()
    except KstrataError as exc:
        error_line(exc)
        sys.exit(2)


if __name__ == "__main__":
    main()
