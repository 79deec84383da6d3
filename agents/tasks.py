"""KernelBench-format tasks: the loader and the task contract (`TaskSpec`).

A *task file* is a KernelBench problem: a standalone Python file that defines

- `class Model(nn.Module)`, the reference computation;
- `get_init_inputs()`, the list of arguments of `Model(...)`;
- `get_inputs()`, the list of arguments of `Model.forward`, created on the CPU (a harness moves them to
  the device).

Nothing else is required, so a problem file from KernelBench's own repository loads as it is. A task
may also set two module-level numbers, which replace what kstrata would compute:

- `FLOPS`: the floating-point operations of one forward pass (for work the counter cannot see, or a
  convention of its own, e.g. half the score matrix of causal attention);
- `BYTES`: the minimum bytes one forward pass must move.

`load_task(path)` imports the file in a fresh module namespace (its `if __name__ == "__main__":` block
does not run, `sys.path` is not touched, and torch's global RNG, default dtype and default device are
restored afterwards), checks the three names, and describes the task as a `TaskSpec` without allocating
its tensors: `get_init_inputs`, `Model(...)`, `get_inputs` and `forward` run under `FakeTensorMode`, so
a GPU-sized task is described in milliseconds on a small CPU. (Fake tensors have shapes but no values:
a forward pass whose shapes or control flow depend on values is run for real on the CPU instead when
its inputs and model fit in `REAL_RUN_LIMIT_BYTES`, and is an error otherwise.) A syntax error, a
missing or mistyped name, and an exception raised while building the model or its inputs become a
`TaskError` that names the file and the line. `find_tasks(dir)` lists the task files of a directory
in KernelBench's order; `Task.instantiate(device)` builds the model and inputs on a device (`meta`
for shape checks).

Cost model (`FlopCounter`, a `TorchDispatchMode`): every ATen op the forward pass dispatches is counted
once, by the first rule that applies:

1. matmul-like ops (`mm`, `addmm`, `bmm`, `baddbmm`, convolutions, transposed convolutions, and the
   fused scaled-dot-product-attention kernels) count as `torch.utils.flop_counter` counts them: 2 FLOPs
   per multiply-add, attention as its two GEMMs over the full score matrix (causal masking is not
   subtracted; the softmax inside a fused attention kernel is not counted). The bias of `addmm`,
   `baddbmm` and a biased convolution adds 1 FLOP per output element;
2. data movement is free: views, copies and dtype casts, concatenation, indexing, gathers and
   embeddings, padding, factories and random number generation;
3. a pointwise op (ATen's `pointwise` tag) costs 1 FLOP per output element. Transcendental functions
   (exp, log, tanh, sigmoid, erf, sqrt, rsqrt, pow, sin/cos, and the activations built on them: gelu,
   silu, softplus, mish, elu, …) also cost 1 FLOP per element, and are tallied apart as
   `transcendental` so a planner can weigh them against the special-function units;
4. a reduction (`sum`, `mean`, `amax`, `max`, `argmax`, `prod`, …), a scan (`cumsum`, `cumprod`, …)
   and `topk` cost 1 FLOP per *input* element; a pooling window costs 1 FLOP per output element per
   window element (adaptive pooling: 1 per input element);
5. any other op with a decomposition in `torch._decomp` is counted as its decomposition (softmax:
   amax + subtract + exp + sum + divide = 5 FLOPs per element, one of them transcendental; layer,
   group, batch and RMS norms, losses and the like likewise);
6. what is left is reported in `TaskSpec.uncounted_ops` and counts 0.

Minimum bytes: every distinct tensor the forward pass must read or write — the inputs, the outputs,
the model's parameters and buffers — counted once, each storage once (an output that is a view of an
input adds nothing; a broadcast (stride-0) input counts the elements it really spans). Arithmetic
intensity is FLOPs per minimum byte.

`TaskSpec.to_json()` is versioned by `TASK_SPEC_SCHEMA`; `TaskSpec.from_json` reads it back.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import itertools
import json
import math
import re
import sys
import traceback
import types
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from kstrata.ir.errors import KstrataError, cut_text

#: The version of `TaskSpec.to_json()`'s layout; bump it when a field changes meaning or goes away.
TASK_SPEC_SCHEMA = "kstrata.task-spec/1"

#: The three names every KernelBench problem defines.
REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")

#: The kinds a FLOP is tallied under (`TaskSpec.flops_by_kind`).
FLOP_KINDS = ("matmul", "pointwise", "transcendental", "reduction")


#: A task whose forward pass needs tensor values (data-dependent shapes or control flow) cannot be
#: traced on fake tensors; it is run for real on the CPU when its inputs and model fit in this many bytes.
REAL_RUN_LIMIT_BYTES = 256 * 2**20


class TaskError(KstrataError):
    """A task file that does not import, lacks a required name, or fails while building its model or inputs."""


class _ValueDependentError(TaskError):
    """Tracing failed because fake tensors have no values."""


# ---------------------------------------------------------------------------------------------------
# The contract
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument or result: its layout and size, not its values."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch's name without the `torch.` prefix: float32, float16, bfloat16, int64, …
    stride: tuple[int, ...] | None  # None for a non-strided layout (sparse, nested)
    contiguous: bool
    numel: int
    bytes: int  # numel × element size: what a dense copy of the tensor holds

    kind = "tensor"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "shape": list(self.shape), "dtype": self.dtype,
                "stride": None if self.stride is None else list(self.stride), "contiguous": self.contiguous,
                "numel": self.numel, "bytes": self.bytes}


@dataclass(frozen=True)
class ValueSpec:
    """A non-tensor argument or result (an int, a float, a dim, None, …), recorded by value."""

    name: str
    type: str
    value: Any  # JSON-safe: numbers, strings, booleans, None, lists of them; `repr` for anything else

    kind = "value"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "type": self.type, "value": self.value}


ArgSpec = TensorSpec | ValueSpec


@dataclass(frozen=True)
class StateSpec:
    """The parameters (or the buffers) of a model, summed: how many tensors, elements and bytes, by dtype."""

    count: int
    numel: int
    bytes: int
    dtypes: tuple[tuple[str, int], ...]  # (dtype, number of tensors), most common first

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "numel": self.numel, "bytes": self.bytes, "dtypes": dict(self.dtypes)}


@dataclass(frozen=True)
class TaskSpec:
    """What a task computes and what it costs: the contract a candidate and a harness rely on.

    `flops` and `min_bytes` are what a roofline uses: the task file's `FLOPS`/`BYTES` when it declares
    them (`flops_source`/`bytes_source` say `declared`), otherwise what kstrata counted (`counted`);
    `counted_flops` and `counted_bytes` always hold kstrata's own figures.
    """

    path: str
    name: str
    sha256: str  # of the file's bytes
    inputs: tuple[ArgSpec, ...]
    init_inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    parameters: StateSpec
    buffers: StateSpec
    flops: int
    counted_flops: int
    flops_source: str
    flops_by_kind: tuple[tuple[str, int], ...]
    flops_by_op: tuple[tuple[str, int], ...]  # ATen op → FLOPs, largest first
    uncounted_ops: tuple[str, ...]
    min_bytes: int
    counted_bytes: int
    bytes_source: str
    traced_with: str = "FakeTensorMode"
    schema: str = field(default=TASK_SPEC_SCHEMA)

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per minimum byte moved (0 when nothing need move)."""
        return self.flops / self.min_bytes if self.min_bytes else 0.0

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes of the floating-point inputs and parameters, the task's precision(s)."""
        seen = [a.dtype for a in self.inputs if isinstance(a, TensorSpec)] + [d for d, _ in self.parameters.dtypes]
        floating = [d for d in seen if _is_floating(d)]
        return tuple(dict.fromkeys(floating or seen))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema, "name": self.name, "path": self.path, "sha256": self.sha256,
            "dtypes": list(self.dtypes),
            "inputs": [a.to_json() for a in self.inputs],
            "init_inputs": [a.to_json() for a in self.init_inputs],
            "outputs": [a.to_json() for a in self.outputs],
            "parameters": self.parameters.to_json(), "buffers": self.buffers.to_json(),
            "flops": self.flops, "counted_flops": self.counted_flops, "flops_source": self.flops_source,
            "flops_by_kind": dict(self.flops_by_kind), "flops_by_op": dict(self.flops_by_op),
            "uncounted_ops": list(self.uncounted_ops),
            "min_bytes": self.min_bytes, "counted_bytes": self.counted_bytes, "bytes_source": self.bytes_source,
            "arithmetic_intensity": self.arithmetic_intensity, "traced_with": self.traced_with,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskSpec:
        """Read back what `to_json` wrote; a different schema version is an error."""
        if data.get("schema") != TASK_SPEC_SCHEMA:
            raise TaskError(f"task spec schema {data.get('schema')!r} is not {TASK_SPEC_SCHEMA!r}",
                            path=data.get("path"))

        def args(items: list[dict[str, Any]]) -> tuple[ArgSpec, ...]:
            return tuple(_arg_from_json(item) for item in items)

        def state(item: dict[str, Any]) -> StateSpec:
            return StateSpec(item["count"], item["numel"], item["bytes"], tuple(item["dtypes"].items()))

        return cls(path=data["path"], name=data["name"], sha256=data["sha256"], inputs=args(data["inputs"]),
                   init_inputs=args(data["init_inputs"]), outputs=args(data["outputs"]),
                   parameters=state(data["parameters"]), buffers=state(data["buffers"]), flops=data["flops"],
                   counted_flops=data["counted_flops"], flops_source=data["flops_source"],
                   flops_by_kind=tuple(data["flops_by_kind"].items()), flops_by_op=tuple(data["flops_by_op"].items()),
                   uncounted_ops=tuple(data["uncounted_ops"]), min_bytes=data["min_bytes"],
                   counted_bytes=data["counted_bytes"], bytes_source=data["bytes_source"],
                   traced_with=data["traced_with"])


def _arg_from_json(item: dict[str, Any]) -> ArgSpec:
    if item["kind"] == "tensor":
        stride = None if item["stride"] is None else tuple(item["stride"])
        return TensorSpec(item["name"], tuple(item["shape"]), item["dtype"], stride, item["contiguous"],
                          item["numel"], item["bytes"])
    return ValueSpec(item["name"], item["type"], item["value"])


@dataclass(frozen=True)
class Task:
    """A loaded task file: its module, its three names, and its `TaskSpec`."""

    path: Path
    module: types.ModuleType = field(repr=False)
    model_class: type[nn.Module]
    get_inputs: Callable[[], Sequence[Any]] = field(repr=False)
    get_init_inputs: Callable[[], Sequence[Any]] = field(repr=False)
    spec: TaskSpec

    @property
    def name(self) -> str:
        return self.spec.name

    def instantiate(self, device: str | torch.device = "meta") -> tuple[nn.Module, list[Any]]:
        """`Model(*get_init_inputs())` and `get_inputs()`, with tensors created directly on `device`.

        For shape checks (`meta`) and quick runs. The values differ from KernelBench's protocol
        (create on the CPU under a seed, then move), which a harness comparing against KernelBench
        results must follow instead.
        """
        with torch.device(device):
            init = _call_in_task(self.path, self.module, self.get_init_inputs, "get_init_inputs()")
            model = _call_in_task(self.path, self.module, lambda: self.model_class(*init), "Model(*get_init_inputs())")
            inputs = list(_call_in_task(self.path, self.module, self.get_inputs, "get_inputs()"))
        return model, inputs


# ---------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------
_module_serial = itertools.count()


def find_tasks(root: str | Path) -> list[Path]:
    """Every task file under `root` (recursively; `_*.py`, hidden and `__*` folders skipped), in KernelBench order.

    Files sort by folder, then by their leading number (`2_x.py` before `10_x.py`), then by name.
    """
    root = Path(root)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise TaskError("no such task directory", path=root)

    def key(p: Path) -> tuple[Any, ...]:
        m = re.match(r"(\d+)", p.name)
        return (p.parent.parts, int(m.group(1)) if m else math.inf, p.name)

    found = (p for p in root.rglob("*.py")
             if not p.name.startswith("_") and not any(part.startswith((".", "__")) for part in p.relative_to(root).parts))
    return sorted(found, key=key)


def load_task(path: str | Path) -> Task:
    """Import a KernelBench problem file, check its three names, and describe it without allocating it."""
    path = Path(path)
    # The file's own changes to torch's global state (a default dtype, a seed) hold while it is
    # described, as they would in KernelBench's harness, and are undone afterwards.
    saved = _GlobalTorchState()
    resident: list[int] = []
    try:
        module, source, digest = _import_isolated(path)
        lines = _definition_lines(source)
        values = _check_names(path, module, lines)
        try:
            spec = _describe(path, module, digest, values, lines, fake=True, resident=resident)
        except _ValueDependentError:
            # Fake tensors carry no values; a small task whose forward needs them runs for real.
            if not resident or resident[-1] > REAL_RUN_LIMIT_BYTES:
                raise
            torch.manual_seed(0)
            spec = _describe(path, module, digest, values, lines, fake=False, resident=resident)
    finally:
        saved.restore()
    return Task(path=path, module=module, model_class=values["Model"], get_inputs=values["get_inputs"],
                get_init_inputs=values["get_init_inputs"], spec=spec)


#: Seconds one task file may take to import and be described in its child process before it is killed.
DESCRIBE_TIMEOUT_S = 120.0
#: Seconds the loader process may take to start (import torch) before its first task file.
_LOADER_START_S = 300.0


def describe_task(path: str | Path, *, timeout_s: float = DESCRIBE_TIMEOUT_S, cached: bool = True) -> TaskSpec:
    """`load_task(path).spec`, computed in a child process with a timeout; a bad task raises `TaskError`.

    A task file is user code: it may exit, crash, loop, fork or leave threads behind. None of that
    reaches the caller's process; each becomes a `TaskError` naming the file. A task described before
    (same bytes, local imports, versions and environment) is answered from `kstrata.agents.reference_cache`
    unless `cached` is False.
    """
    ((_, result),) = describe_tasks([path], timeout_s=timeout_s, cached=cached)
    if isinstance(result, TaskError):
        raise result
    return result


def describe_tasks(paths: Sequence[str | Path], *, timeout_s: float = DESCRIBE_TIMEOUT_S, cached: bool = True,
                   ) -> list[tuple[Path, TaskSpec | TaskError]]:
    """Describe each task file in a child process (one for all of them, restarted after a file kills it).

    Returns `(path, spec or error)` per file, in order: one bad file (an exception, `os._exit`, a
    segfault, a hang past `timeout_s`) is that file's error and the others are still described.
    With `cached`, a file described before with the same bytes, local imports, versions and environment
    is answered from `kstrata.agents.reference_cache` (errors are never kept).
    """
    import os
    import signal
    import subprocess
    import tempfile
    import time

    from kstrata.agents import reference_cache
    from kstrata.backends.child import spawn

    todo = [Path(p) for p in paths]
    done: list[tuple[Path, TaskSpec | TaskError]] = []
    if cached:
        for p in list(todo):
            kept = reference_cache.spec_lookup(p)
            if kept is not None:
                try:
                    done.append((p, TaskSpec.from_json(kept)))
                except Exception:  # an older layout: described again
                    continue
                todo.remove(p)
    with tempfile.TemporaryDirectory(prefix="kstrata-task-") as scratch:
        while todo:
            results_path = Path(scratch) / f"results-{len(done)}.jsonl"
            results_path.touch()
            log_path = Path(scratch) / "log.txt"
            cmd = [sys.executable, "-m", "kstrata.agents.task_worker", str(results_path), *map(str, todo)]
            with log_path.open("wb") as log:
                # Its own session, output to a file: whatever the task starts is killed with it, and a
                # grandchild holding an inherited pipe cannot keep us waiting.
                proc = spawn(cmd, stdout=log, stderr=subprocess.STDOUT)
                events: list[dict[str, Any]] = []
                started = time.monotonic()
                # Until the first file starts, the child imports torch: that has its own allowance.
                allowed = max(timeout_s, _LOADER_START_S)
                timed_out = False
                try:
                    while True:
                        rc = proc.poll()
                        fresh = _read_events(results_path, len(events))
                        if fresh:
                            events += fresh
                            started = time.monotonic()  # the deadline is per task file
                            allowed = timeout_s
                        if rc is not None:
                            break
                        if time.monotonic() - started > allowed:
                            timed_out = True
                            break
                        time.sleep(0.02)
                finally:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            events += _read_events(results_path, len(events))
            current: Path | None = None
            for ev in events:
                if "start" in ev:
                    current = Path(ev["start"])
                elif current is not None:
                    result: TaskSpec | TaskError = (TaskSpec.from_json(ev["spec"]) if "spec" in ev
                                                    else TaskError(ev["error"]))
                    if cached and "spec" in ev:
                        reference_cache.spec_store(current, ev["spec"], ev.get("local_files") or [])
                    done.append((current, result))
                    current = None
            described = {d for d, _ in done}
            todo = [p for p in todo if p not in described]
            tail = log_path.read_text(errors="replace").strip().splitlines() if log_path.exists() else []
            last = f"; its last output: {cut_text(tail[-1], 200)}" if tail else ""
            if current is None:
                if todo:  # the loader itself did not start (a broken environment), not a task's doing
                    how = f"did not start in {_LOADER_START_S:g} s" if timed_out else f"exited with {rc}"
                    raise TaskError(f"the task loader (python -m kstrata.agents.task_worker) {how}{last}", path=todo[0])
                continue
            # `current` killed, hung or ended the child.
            if timed_out:
                why = (f"did not finish loading in {timeout_s:g} s (an import, Model(), get_inputs() or forward() "
                       "that loops or sleeps?); it was killed")
            elif rc is not None and rc < 0:
                why = f"crashed the process that loaded it ({signal.Signals(-rc).name}){last}"
            else:
                why = (f"ended the process that loaded it (exit status {rc}: sys.exit, os._exit or a KeyboardInterrupt "
                       f"in the task's code){last}")
            done.append((current, TaskError(why, path=current)))
            todo = [p for p in todo if p != current]
    order = {p: i for i, p in enumerate(Path(p) for p in paths)}
    return sorted(done, key=lambda d: order[d[0]])


def _read_events(path: Path, skip: int) -> list[dict[str, Any]]:
    """The complete JSON lines of `path` after the first `skip`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    lines = text.split("\n")[:-1]  # the last piece is empty or a line still being written
    return [json.loads(line) for line in lines[skip:]]


def import_task_module(path: str | Path) -> types.ModuleType:
    """Import any standalone Python file (a task, or a candidate's `ModelNew` file) in a fresh namespace.

    The module gets a unique name in `sys.modules` (so pickling and `inspect` work); `__name__` is not
    `"__main__"`; torch's global state (RNG, default dtype and device) is restored after the import.
    Errors are `TaskError`s naming the file and line.
    """
    saved = _GlobalTorchState()
    try:
        return _import_isolated(Path(path))[0]
    finally:
        saved.restore()


def _import_isolated(path: Path) -> tuple[types.ModuleType, str, str]:
    """The module, its source and the sha256 of its bytes."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TaskError("no such task file", path=path) from None
    except OSError as exc:
        raise TaskError(f"cannot read the task file: {exc.strerror or exc}", path=path) from None
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(f"not UTF-8 text (byte {exc.start})", path=path) from None
    filename = str(path.resolve())
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{path}:{exc.lineno}" if exc.lineno else str(path)
        col = f", column {exc.offset}" if exc.offset else ""
        raise TaskError(f"syntax error: {exc.msg}{col}", path=where) from None
    digest = hashlib.sha256(data).hexdigest()
    stem = re.sub(r"\W", "_", path.stem)
    name = f"kstrata_task_{stem}_{digest[:8]}_{next(_module_serial)}"
    module = types.ModuleType(name)
    module.__file__ = filename
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # the task's own exits are its errors
        del sys.modules[name]
        raise _error_in_file(path, filename, exc, "importing the task raised") from None
    return module, source, digest


def _definition_lines(source: str) -> dict[str, int]:
    """Top-level name → line of its (last) definition, for errors that point at it."""
    lines: dict[str, int] = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            lines[node.name] = node.lineno
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        lines[n.id] = node.lineno
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                lines[(alias.asname or alias.name).split(".")[0]] = node.lineno
    return lines


def _where(path: Path, lines: dict[str, int], name: str) -> str:
    return f"{path}:{lines[name]}" if name in lines else str(path)


def _check_names(path: Path, module: types.ModuleType, lines: dict[str, int]) -> dict[str, Any]:
    missing = [n for n in REQUIRED_NAMES if n not in module.__dict__]
    if missing:
        raise TaskError(f"a KernelBench task must define {', '.join(REQUIRED_NAMES)}; missing: {', '.join(missing)}",
                        path=path)
    values = {n: module.__dict__[n] for n in REQUIRED_NAMES}
    model = values["Model"]
    if not (isinstance(model, type) and issubclass(model, nn.Module)):
        raise TaskError(f"`Model` must be a subclass of torch.nn.Module, not {_kind(model)}",
                        path=_where(path, lines, "Model"))
    if model.forward is nn.Module.forward:
        raise TaskError("`Model` defines no forward()", path=_where(path, lines, "Model"))
    for n in ("get_inputs", "get_init_inputs"):
        fn = values[n]
        if not callable(fn) or isinstance(fn, type):
            raise TaskError(f"`{n}` must be a function, not {_kind(fn)}", path=_where(path, lines, n))
        try:
            inspect.signature(fn).bind()
        except TypeError:
            raise TaskError(f"`{n}()` must take no arguments", path=_where(path, lines, n)) from None
        except ValueError:
            pass  # a builtin without a signature: let the call decide
    for n in ("FLOPS", "BYTES"):
        if n in module.__dict__:
            v = module.__dict__[n]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise TaskError(f"`{n}` must be a non-negative number, not {v!r}", path=_where(path, lines, n))
    return values


def _kind(obj: Any) -> str:
    return type(obj).__name__ if not isinstance(obj, type) else f"the class {obj.__name__}"


def _error_in_file(path: Path, filename: str, exc: BaseException, what: str) -> TaskError:
    """A `TaskError` at the innermost line of the task file in `exc`'s traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == filename]
    where = f"{path}:{frames[-1].lineno}" if frames else str(path)
    detail = str(exc).strip().splitlines()
    first = cut_text(detail[0]) if detail else ""
    message = f"{what} {type(exc).__name__}" + (f": {first}" if first else "")
    if type(exc).__module__.startswith(("torch._subclasses", "torch.fx.experimental")):
        return _ValueDependentError(message, path=where, hint=(
            "kstrata describes a task on fake tensors, which have shapes but no values, and runs it for real only "
            f"when its inputs and model fit in {REAL_RUN_LIMIT_BYTES // 2**20} MiB: set a smaller size, or avoid "
            "ops whose output shape or control flow depends on tensor values"))
    return TaskError(message, path=where)


def _call_in_task(path: Path, module: types.ModuleType, fn: Callable[[], Any], what: str) -> Any:
    try:
        return fn()
    except (Exception, SystemExit) as exc:  # sys.exit() in a task's function is that function's error
        raise _error_in_file(path, str(module.__file__), exc, f"{what} raised") from None


class _GlobalTorchState:
    """The global torch state a task file could change: restored after it ran."""

    def __init__(self) -> None:
        self.rng = torch.random.get_rng_state()
        self.dtype = torch.get_default_dtype()
        self.device = torch.get_default_device()
        self.grad = torch.is_grad_enabled()

    def restore(self) -> None:
        torch.random.set_rng_state(self.rng)
        if torch.get_default_dtype() != self.dtype:
            torch.set_default_dtype(self.dtype)
        if torch.get_default_device() != self.device:
            # Setting a default device installs a global torch-function mode: install one only if
            # there was one before.
            torch.set_default_device(None if self.device == torch.device("cpu") else self.device)
        torch.set_grad_enabled(self.grad)


# ---------------------------------------------------------------------------------------------------
# Describing: one traced forward pass on fake tensors
# ---------------------------------------------------------------------------------------------------
def _describe(path: Path, module: types.ModuleType, digest: str, values: dict[str, Any], lines: dict[str, int], *,
              fake: bool, resident: list[int]) -> TaskSpec:
    """Trace one forward pass on fake tensors (`fake`) or on real CPU tensors.

    `resident` receives the bytes of the inputs and the model once they are built, so that a caller
    can tell whether a real run is affordable when the fake one fails.
    """
    model_class: type[nn.Module] = values["Model"]

    def call(fn: Callable[[], Any], what: str) -> Any:
        return _call_in_task(path, module, fn, what)

    def checked_list(value: Any, fn_name: str) -> list[Any]:
        if not isinstance(value, (list, tuple)):
            raise TaskError(f"`{fn_name}()` must return a list, not {_kind(value)}", path=_where(path, lines, fn_name))
        return list(value)

    with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext(), torch.no_grad():
        init = checked_list(call(values["get_init_inputs"], "get_init_inputs()"), "get_init_inputs")
        model = call(lambda: model_class(*init), "Model(*get_init_inputs())")
        inputs = checked_list(call(values["get_inputs"], "get_inputs()"), "get_inputs")
        resident.append(_min_bytes([*_tensors(inputs), *model.parameters(), *model.buffers()]))
        # The plain pass gives the outputs exactly as eager PyTorch lays them out; the counted pass may
        # run decompositions, whose results can be laid out differently.
        outputs = call(lambda: model(*inputs), "Model.forward(*get_inputs())")
        counter = FlopCounter()
        with counter:
            call(lambda: model(*inputs), "Model.forward(*get_inputs())")

        params = _state_spec(list(model.parameters()))
        buffers = _state_spec(list(model.buffers()))
        counted_bytes = _min_bytes([*_tensors(inputs), *model.parameters(), *model.buffers(), *_tensors(outputs)])
        input_names = _param_names(model_class.forward, skip_self=True)
        init_names = _param_names(model_class.__init__, skip_self=True)
        input_specs = tuple(itertools.chain.from_iterable(
            _arg_specs(v, _name(input_names, i, "input")) for i, v in enumerate(inputs)))
        init_specs = tuple(itertools.chain.from_iterable(
            _arg_specs(v, _name(init_names, i, "init")) for i, v in enumerate(init)))
        output_specs = _arg_specs(outputs, "output") if not isinstance(outputs, (list, tuple)) else tuple(
            itertools.chain.from_iterable(_arg_specs(v, f"output{i}") for i, v in enumerate(outputs)))

    declared_flops = module.__dict__.get("FLOPS")
    declared_bytes = module.__dict__.get("BYTES")
    return TaskSpec(
        path=str(path), name=path.stem, sha256=digest,
        inputs=input_specs, init_inputs=init_specs, outputs=output_specs, parameters=params, buffers=buffers,
        flops=int(declared_flops) if declared_flops is not None else counter.total,
        counted_flops=counter.total, flops_source="declared" if declared_flops is not None else "counted",
        flops_by_kind=tuple((k, counter.by_kind[k]) for k in FLOP_KINDS),
        flops_by_op=tuple(counter.by_op.most_common()), uncounted_ops=tuple(sorted(counter.uncounted)),
        min_bytes=int(declared_bytes) if declared_bytes is not None else counted_bytes, counted_bytes=counted_bytes,
        bytes_source="declared" if declared_bytes is not None else "counted",
        traced_with="FakeTensorMode" if fake else "cpu",
    )


def _param_names(fn: Any, *, skip_self: bool) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    if skip_self and params and params[0].name == "self":
        params = params[1:]
    names = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY):
            break
        names.append(p.name)
    return names


def _name(names: list[str], i: int, prefix: str) -> str:
    return names[i] if i < len(names) else f"{prefix}{i}"


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    leaves, _ = tree_flatten(value)
    return (leaf for leaf in leaves if isinstance(leaf, torch.Tensor))


def _arg_specs(value: Any, name: str) -> tuple[ArgSpec, ...]:
    if isinstance(value, torch.Tensor):
        return (_tensor_spec(value, name),)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in _tensors(value)):
        return tuple(itertools.chain.from_iterable(_arg_specs(v, f"{name}.{i}") for i, v in enumerate(value)))
    return (ValueSpec(name, type(value).__name__, _json_safe(value)),)


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, torch.dtype):
        return _dtype_name(value)
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _is_floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def _tensor_spec(t: torch.Tensor, name: str) -> TensorSpec:
    strided = t.layout == torch.strided
    return TensorSpec(name=name, shape=tuple(int(s) for s in t.shape), dtype=_dtype_name(t.dtype),
                      stride=tuple(int(s) for s in t.stride()) if strided else None,
                      contiguous=bool(t.is_contiguous()) if strided else False, numel=int(t.numel()),
                      bytes=int(t.numel()) * t.element_size())


def _state_spec(tensors: list[torch.Tensor]) -> StateSpec:
    dtypes = Counter(_dtype_name(t.dtype) for t in tensors)
    return StateSpec(count=len(tensors), numel=sum(int(t.numel()) for t in tensors),
                     bytes=sum(int(t.numel()) * t.element_size() for t in tensors), dtypes=tuple(dtypes.most_common()))


def _footprint_bytes(t: torch.Tensor) -> int:
    """Bytes of memory `t` really spans: a broadcast (stride-0) tensor spans fewer than its elements."""
    n = int(t.numel())
    if n == 0:
        return 0
    if t.layout == torch.strided:
        extent = 1 + sum((int(s) - 1) * abs(int(st)) for s, st in zip(t.shape, t.stride(), strict=True))
        n = min(n, extent)
    return n * t.element_size()


def _storage_key(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):
        return id(t)


def _min_bytes(tensors: list[torch.Tensor]) -> int:
    """Each storage once, at the largest footprint any of its tensors reads or writes."""
    per_storage: dict[int, int] = {}
    for t in tensors:
        key = _storage_key(t)
        per_storage[key] = max(per_storage.get(key, 0), _footprint_bytes(t))
    return sum(per_storage.values())


# ---------------------------------------------------------------------------------------------------
# Counting FLOPs
# ---------------------------------------------------------------------------------------------------
_aten = torch.ops.aten


def _matmul_formulas() -> dict[Any, Callable[..., int]]:
    from torch.utils.flop_counter import flop_registry

    formulas: dict[Any, Callable[..., int]] = dict(flop_registry)
    # The CPU's fused attention kernel (what a fake CPU tensor dispatches to) is the same work as
    # the CUDA ones: count it with their formula.
    sdpa = flop_registry[_aten._scaled_dot_product_flash_attention]
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable"):
        if hasattr(_aten, name):
            formulas[getattr(_aten, name)] = sdpa
    return formulas


_FORMULAS = _matmul_formulas()
#: Matmul-like ops whose bias (argument index) adds one FLOP per output element.
_BIAS_ARG = {"addmm": 0, "baddbmm": 0, "convolution": 2, "_convolution": 2, "convolution_overrideable": 2,
             "cudnn_convolution": 2, "_slow_conv2d_forward": 3}

_FREE = frozenset({
    "_to_copy", "copy", "copy_", "clone", "contiguous", "lift_fresh", "lift_fresh_copy", "detach", "detach_",
    "alias", "_unsafe_view", "cat", "stack", "index", "_unsafe_index", "index_select", "gather", "scatter",
    "embedding", "constant_pad_nd", "pad", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
    "replication_pad1d", "replication_pad2d", "replication_pad3d", "slice_scatter", "select_scatter",
    "as_strided_scatter", "diagonal_scatter", "flip", "roll", "repeat", "repeat_interleave", "tril", "triu",
    "fill", "fill_", "zero_", "index_put", "index_put_", "_index_put_impl_", "masked_scatter", "set_",
    "resize_", "_local_scalar_dense", "_assert_tensor_metadata", "one_hot", "channel_shuffle",
    "pixel_shuffle", "pixel_unshuffle", "im2col", "col2im", "unfold", "narrow_copy",
})
_FACTORY_PREFIXES = ("empty", "zeros", "ones", "full", "new_", "scalar_tensor", "arange", "linspace", "logspace",
                     "eye", "rand", "normal", "uniform", "bernoulli", "tensor", "_efficientzerotensor")
_TRANSCENDENTAL = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "tanh", "sigmoid", "logit", "erf", "erfc", "erfinv",
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "pow",
    "float_power", "sqrt", "rsqrt", "gelu", "silu", "mish", "softplus", "elu", "selu", "celu", "log_sigmoid_forward",
    "xlogy", "logaddexp", "logaddexp2", "lgamma", "digamma", "polygamma", "i0", "sinc", "erf_inv", "cbrt", "ndtri",
    "erfcx", "hypot", "zeta", "igamma", "igammac",
})
_SIMPLE_REDUCTIONS = frozenset({"sum", "nansum", "mean", "nanmean", "amax", "amin", "aminmax", "max", "min",
                                "argmax", "argmin", "prod", "any", "all", "count_nonzero"})
_SCANS = frozenset({"cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "_logcumsumexp", "topk"})
_WINDOW_POOLS = frozenset({"max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices",
                           "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d",
                           "avg_pool3d", "mkldnn_max_pool2d", "mkldnn_max_pool3d"})
#: `prims` ops (decompositions call some directly) that move or make data; the other prims are
#: elementwise unless they are `_PRIM_REDUCTIONS`.
_PRIM_FREE = frozenset({
    "convert_element_type", "broadcast_in_dim", "view_of", "view_element_type", "reshape", "squeeze", "transpose",
    "collapse", "collapse_view", "split_dim", "expand_dims", "as_strided", "as_strided_scatter", "cat", "clone",
    "copy_to", "copy_strided", "device_put", "empty", "empty_strided", "empty_permuted", "full", "full_like", "iota",
    "fill", "scalar_tensor", "rev", "resize", "item", "maximum_value", "minimum_value", "normal", "conj", "real",
    "imag", "slice", "slice_in_dim",
})
_PRIM_REDUCTIONS = frozenset({"sum", "prod", "amax", "amin", "var", "xor_sum"})
_ADAPTIVE_POOLS = frozenset({"adaptive_avg_pool1d", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d",
                             "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d",
                             "adaptive_avg_pool2d", "adaptive_avg_pool3d"})


@cache
def _rule(func: torch._ops.OpOverload) -> str:
    """Which rule of the cost model (module docstring) counts `func`."""
    from torch._decomp import decomposition_table

    packet = func.overloadpacket
    name = packet.__name__
    tags = set(func.tags)
    if packet in _FORMULAS:
        return "matmul"
    if func.namespace == "prim" or func.is_view:  # prim.device and friends answer questions about tensors
        return "free"
    if func.namespace == "prims":
        if name in _PRIM_FREE or name.startswith(_FACTORY_PREFIXES):
            return "free"
        if name in _PRIM_REDUCTIONS:
            return "reduction"
        return "transcendental" if name in _TRANSCENDENTAL else "pointwise"
    if name in _FREE or torch.Tag.nondeterministic_seeded in tags or name.startswith(_FACTORY_PREFIXES):
        return "free"
    if torch.Tag.pointwise in tags:
        return "transcendental" if name.rstrip("_") in _TRANSCENDENTAL else "pointwise"
    if name in _WINDOW_POOLS:
        return "window-pool"
    if name in _ADAPTIVE_POOLS or name in _SCANS or name in _SIMPLE_REDUCTIONS:
        return "reduction"
    if func in decomposition_table:
        return "decompose"
    if torch.Tag.reduction in tags:
        return "reduction"
    return "uncounted"


class FlopCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the FLOPs of every ATen op run under it, by the cost model in the module docstring.

    Works on real, meta and fake tensors. `by_kind` sums FLOPs per kind (`FLOP_KINDS`), `by_op` per
    ATen op (`aten.mm`, …), and `uncounted` lists ops no rule covers (their FLOPs count as 0).
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.by_kind: Counter[str] = Counter()
        self.by_op: Counter[str] = Counter()
        self.uncounted: Counter[str] = Counter()
        self._decomposing: list[Any] = []

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        rule = _rule(func)
        if rule == "decompose" and func not in self._decomposing:
            result = self._decompose(func, args, kwargs)
            if result is not NotImplemented:
                return result
            rule = "uncounted"
        out = func(*args, **kwargs)
        self._count(func, rule, out, args, kwargs)
        return out

    def _decompose(self, func: Any, args: Any, kwargs: Any) -> Any:
        from torch._decomp import decomposition_table

        saved = (self.by_kind.copy(), self.by_op.copy(), self.uncounted.copy())
        self._decomposing.append(func)
        try:
            with self:
                return decomposition_table[func](*args, **kwargs)
        except Exception:
            # A decomposition that does not apply to these arguments: forget what it counted, and
            # let the op run as itself.
            self.by_kind, self.by_op, self.uncounted = saved
            return NotImplemented
        finally:
            self._decomposing.pop()

    def _count(self, func: Any, rule: str, out: Any, args: Any, kwargs: Any) -> None:
        packet = func.overloadpacket
        first_out = next(_tensors(out), None)
        if rule == "free" or first_out is None:
            return
        first_in = next(_tensors(args), None)
        if rule == "matmul":
            kind, flops = "matmul", int(_FORMULAS[packet](*args, **kwargs, out_val=out))
            bias_at = _BIAS_ARG.get(packet.__name__)
            if bias_at is not None and len(args) > bias_at and args[bias_at] is not None:
                if packet.__name__ not in ("addmm", "baddbmm") or kwargs.get("beta", 1) != 0:
                    flops += int(first_out.numel())
        elif rule in ("pointwise", "transcendental"):
            kind, flops = rule, int(first_out.numel())
            if packet.__name__ == "pow" and _is_integral_number(args[1] if len(args) > 1 else None):
                kind = "pointwise"  # x ** 2 is a multiply, not a special function
        elif rule == "window-pool":
            window = args[1] if len(args) > 1 else kwargs.get("kernel_size", 1)
            kind, flops = "reduction", int(first_out.numel()) * math.prod([window] if isinstance(window, int) else window)
        elif rule == "reduction":
            kind, flops = "reduction", int(first_in.numel()) if first_in is not None else 0
        else:
            self.uncounted[str(packet)] += 1
            return
        self.by_kind[kind] += flops
        self.by_op[str(packet)] += flops


def _is_integral_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer()


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> FlopCounter:
    """Run `fn(*args, **kwargs)` under a `FlopCounter` (no autograd) and return the counter."""
    counter = FlopCounter()
    with torch.no_grad(), counter:
        fn(*args, **kwargs)
    return counter
