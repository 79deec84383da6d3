"""`rocprofv3` adapter: find the profiler, build its command lines, read its CSV outputs.

**Needs an AMD GPU with ROCm.** `rocprofv3` (ROCprofiler-SDK, ROCm 6.2 and later) profiles a program
that runs on an AMD GPU; without one (`/dev/kfd` absent) `run_rocprofv3` refuses with a
`ProfilerUnavailable` error before starting anything. Building commands and parsing outputs work
anywhere, which is how they are tested.

Two collection modes:

- kernel tracing, `rocprofv3 --kernel-trace --output-format csv -d DIR -o NAME -- APP …`, writes
  `NAME_kernel_trace.csv`, one row per dispatch, parsed into `KernelDispatch` records;
- counter collection, `rocprofv3 --pmc C1 C2 … --output-format csv -d DIR -o NAME -- APP …`, writes
  `NAME_counter_collection.csv` (under `pass_1/` in some versions), one row per counter per
  dispatch, parsed into one `DispatchCounters` record per dispatch.

`--output-format csv` is always passed: ROCm 7 defaults to its `rocpd` SQLite output. Files are
looked for anywhere below the output directory, because versions differ in where they put them
(`DIR/NAME_…`, `DIR/<hostname>/<pid>_…`, `DIR/pass_1/…`).

Column names are those of rocprofv3's documentation ("Using rocprofv3", ROCprofiler-SDK):

- kernel trace: `Kind, Agent_Id, Queue_Id, Stream_Id, Thread_Id, Dispatch_Id, Kernel_Id,
  Kernel_Name, Correlation_Id, Start_Timestamp, End_Timestamp, LDS_Block_Size, Scratch_Size,
  VGPR_Count, Accum_VGPR_Count, SGPR_Count, Workgroup_Size_X/Y/Z, Grid_Size_X/Y/Z`;
- counter collection: `Correlation_Id, Dispatch_Id, Agent_Id, Queue_Id, Process_Id, Thread_Id,
  Grid_Size, Kernel_Id, Kernel_Name, Workgroup_Size, LDS_Block_Size, Scratch_Size, VGPR_Count,
  Accum_VGPR_Count, SGPR_Count, Counter_Name, Counter_Value, Start_Timestamp, End_Timestamp`.

Only `Dispatch_Id`, `Kernel_Name` and the timestamps (trace) or `Counter_Name`/`Counter_Value`
(counters) are required; older releases lack `Kernel_Id`, `Accum_VGPR_Count` and, in counter
files, the timestamps, which then read as `None`. Timestamps are nanoseconds.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError

from .tools import DEFAULT_TIMEOUT_S, FoundTool, ToolError, ToolResult, find_tool, run_tool

ENV_VAR = "KSTRATA_ROCPROFV3"
KERNEL_TRACE_SUFFIX = "kernel_trace.csv"
COUNTER_COLLECTION_SUFFIX = "counter_collection.csv"
NEEDS_GPU = "rocprofv3 needs an AMD GPU with ROCm (the amdgpu driver's /dev/kfd); none is present on this machine"


class ProfilerUnavailable(ToolError):
    """The profiler cannot run here (no AMD GPU, or no ROCm)."""


class ProfileOutputError(KstrataError):
    """A profiler output file that is missing, or that cannot be read (names the file and line)."""


def find_rocprofv3() -> FoundTool:
    """`$KSTRATA_ROCPROFV3`, then `$ROCM_PATH/bin/rocprofv3`, `/opt/rocm/bin/rocprofv3`, then `PATH`."""
    candidates: list[tuple[str, str]] = []
    rocm_path = os.environ.get("ROCM_PATH")
    if rocm_path:
        candidates.append(("rocm", str(Path(rocm_path) / "bin" / "rocprofv3")))
    candidates += [("rocm", "/opt/rocm/bin/rocprofv3"), ("system", "rocprofv3")]
    return find_tool("rocprofv3", env_var=ENV_VAR, candidates=candidates)


def amd_gpu_present() -> bool:
    """Whether the ROCm kernel driver interface exists, the minimum for any AMD GPU work."""
    return Path("/dev/kfd").exists()


# -- commands --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RocprofCommand:
    """A `rocprofv3` command line and where its outputs will land."""

    argv: tuple[str, ...]
    output_dir: Path
    output_name: str
    mode: str  # "kernel-trace" or "counters"

    @property
    def output_suffix(self) -> str:
        return KERNEL_TRACE_SUFFIX if self.mode == "kernel-trace" else COUNTER_COLLECTION_SUFFIX


def _tool_path(tool: FoundTool | str | os.PathLike[str] | None) -> str:
    if tool is None:
        return str(find_rocprofv3().path)
    return str(tool.path if isinstance(tool, FoundTool) else tool)


def _common(app: Sequence[str], output_dir: str | os.PathLike[str], output_name: str,
            kernel_include: str | None, extra: Sequence[str]) -> tuple[list[str], list[str]]:
    if not app:
        raise ValueError("rocprofv3 needs an application command line to profile")
    if not output_name or "/" in output_name:
        raise ValueError(f"output name {output_name!r} must be a plain file-name prefix")
    head = ["--output-format", "csv", "-d", str(output_dir), "-o", output_name]
    if kernel_include:
        head += ["--kernel-include-regex", kernel_include]
    head += list(extra)
    return head, ["--", *app]


def kernel_trace_command(app: Sequence[str], output_dir: str | os.PathLike[str], *, output_name: str = "kstrata",
                         kernel_include: str | None = None, extra: Sequence[str] = (),
                         tool: FoundTool | str | os.PathLike[str] | None = None) -> RocprofCommand:
    """`rocprofv3 --kernel-trace --output-format csv -d DIR -o NAME [filters] -- APP …`."""
    head, tail = _common(app, output_dir, output_name, kernel_include, extra)
    argv = (_tool_path(tool), "--kernel-trace", *head, *tail)
    return RocprofCommand(argv, Path(output_dir), output_name, "kernel-trace")


def counter_collection_command(app: Sequence[str], output_dir: str | os.PathLike[str], counters: Sequence[str], *,
                               output_name: str = "kstrata", kernel_include: str | None = None,
                               extra: Sequence[str] = (),
                               tool: FoundTool | str | os.PathLike[str] | None = None) -> RocprofCommand:
    """`rocprofv3 --pmc C1 C2 … --output-format csv -d DIR -o NAME [filters] -- APP …`.

    All counters go in one `--pmc` list, which rocprofv3 collects in one pass or refuses; split
    counters that do not fit one pass into several commands.
    """
    names = [c.strip() for c in counters if c.strip()]
    if not names:
        raise ValueError("counter collection needs at least one counter name")
    bad = [c for c in names if not all(ch.isalnum() or ch in "_:[]." for ch in c)]
    if bad:
        raise ValueError(f"not counter names: {bad}")
    head, tail = _common(app, output_dir, output_name, kernel_include, extra)
    argv = (_tool_path(tool), "--pmc", *names, *head, *tail)
    return RocprofCommand(argv, Path(output_dir), output_name, "counters")


def run_rocprofv3(command: RocprofCommand, *, timeout: float = DEFAULT_TIMEOUT_S) -> ToolResult:
    """Run a `rocprofv3` command on this machine's AMD GPU; refuses at once when there is none."""
    if not amd_gpu_present():
        raise ProfilerUnavailable(NEEDS_GPU, repro=" ".join(command.argv),
                                  hint="run this on a machine with an AMD GPU and ROCm 6.2 or later")
    command.output_dir.mkdir(parents=True, exist_ok=True)
    return run_tool(command.argv, timeout=timeout)


# -- records ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelDispatch:
    """One kernel dispatch of a kernel trace."""

    dispatch_id: int
    kernel_name: str
    start_ns: int
    end_ns: int
    agent: str | None = None
    queue_id: int | None = None
    kernel_id: int | None = None
    correlation_id: int | None = None
    grid: tuple[int, int, int] | None = None
    workgroup: tuple[int, int, int] | None = None
    lds_bytes: int | None = None
    scratch_bytes: int | None = None
    vgprs: int | None = None
    agprs: int | None = None
    sgprs: int | None = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class DispatchCounters:
    """The counters collected for one dispatch (the long-format rows of one `Dispatch_Id` joined)."""

    dispatch_id: int
    kernel_name: str
    counters: Mapping[str, float] = field(default_factory=dict)
    agent: str | None = None
    kernel_id: int | None = None
    grid_size: int | None = None
    workgroup_size: int | None = None
    lds_bytes: int | None = None
    scratch_bytes: int | None = None
    vgprs: int | None = None
    agprs: int | None = None
    sgprs: int | None = None
    start_ns: int | None = None
    end_ns: int | None = None

    @property
    def duration_ns(self) -> int | None:
        return None if self.start_ns is None or self.end_ns is None else self.end_ns - self.start_ns


# -- parsing ---------------------------------------------------------------------------------------

def _rows(source: str | os.PathLike[str], required: Iterable[str]) -> tuple[str, list[tuple[int, dict[str, str]]]]:
    """(name for messages, [(line number, row)]) of a CSV file or CSV text with the `required` columns."""
    if isinstance(source, str) and "\n" in source:
        where, text = "<csv text>", source
    else:
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ProfileOutputError(f"cannot read profiler output: {exc.strerror}", path=path) from None
        where = str(path)
    reader = csv.DictReader(io.StringIO(text))
    columns = reader.fieldnames or []
    missing = [c for c in required if c not in columns]
    if missing:
        raise ProfileOutputError(f"not a rocprofv3 CSV of this kind: columns {missing} are missing "
                                 f"(has {', '.join(columns) or 'no header'})", path=where)
    rows = []
    for row in reader:
        rows.append((reader.line_num, {k: (v or "").strip() for k, v in row.items() if k is not None}))
    return where, rows


def _int(row: Mapping[str, str], key: str, where: str, line: int, *, required: bool = False) -> int | None:
    text = row.get(key, "")
    if text == "":
        if required:
            raise ProfileOutputError(f"line {line}: {key} is empty", path=where)
        return None
    try:
        return int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise ProfileOutputError(f"line {line}: {key} = {text!r} is not a number", path=where) from None
        if not value.is_integer():
            raise ProfileOutputError(f"line {line}: {key} = {text!r} is not an integer", path=where) from None
        return int(value)


def _req(row: Mapping[str, str], key: str, where: str, line: int) -> int:
    value = _int(row, key, where, line, required=True)
    assert value is not None
    return value


def _triple(row: Mapping[str, str], prefix: str, where: str, line: int) -> tuple[int, int, int] | None:
    values = [_int(row, f"{prefix}_{axis}", where, line) for axis in "XYZ"]
    if any(v is None for v in values):
        return None
    x, y, z = values
    assert x is not None and y is not None and z is not None
    return x, y, z


def _timestamps(row: Mapping[str, str], where: str, line: int, required: bool) -> tuple[int | None, int | None]:
    start = _int(row, "Start_Timestamp", where, line, required=required)
    end = _int(row, "End_Timestamp", where, line, required=required)
    if start is not None and end is not None and end < start:
        raise ProfileOutputError(f"line {line}: End_Timestamp {end} is before Start_Timestamp {start}", path=where)
    return start, end


def parse_kernel_trace(source: str | os.PathLike[str]) -> list[KernelDispatch]:
    """Dispatches of a `*_kernel_trace.csv` (a path, or the CSV text itself), in file order."""
    where, rows = _rows(source, ("Dispatch_Id", "Kernel_Name", "Start_Timestamp", "End_Timestamp"))
    out = []
    for line, row in rows:
        if row.get("Kind", "KERNEL_DISPATCH") not in ("KERNEL_DISPATCH", ""):
            continue  # other record kinds may share a trace file in future versions
        start, end = _timestamps(row, where, line, required=True)
        assert start is not None and end is not None
        out.append(KernelDispatch(
            dispatch_id=_req(row, "Dispatch_Id", where, line), kernel_name=row["Kernel_Name"],
            start_ns=start, end_ns=end, agent=row.get("Agent_Id") or None,
            queue_id=_int(row, "Queue_Id", where, line), kernel_id=_int(row, "Kernel_Id", where, line),
            correlation_id=_int(row, "Correlation_Id", where, line),
            grid=_triple(row, "Grid_Size", where, line), workgroup=_triple(row, "Workgroup_Size", where, line),
            lds_bytes=_int(row, "LDS_Block_Size", where, line), scratch_bytes=_int(row, "Scratch_Size", where, line),
            vgprs=_int(row, "VGPR_Count", where, line), agprs=_int(row, "Accum_VGPR_Count", where, line),
            sgprs=_int(row, "SGPR_Count", where, line),
        ))
    return out


def parse_counter_collection(source: str | os.PathLike[str]) -> list[DispatchCounters]:
    """Per-dispatch counter values of a `*_counter_collection.csv` (a path or the CSV text), by dispatch order.

    The file has one row per (dispatch, counter); rows of one `Dispatch_Id` (and agent) are joined.
    A counter that appears twice for one dispatch is an error: it would mean two passes were mixed.
    """
    where, rows = _rows(source, ("Dispatch_Id", "Kernel_Name", "Counter_Name", "Counter_Value"))
    merged: dict[tuple[str | None, int], dict[str, Any]] = {}
    for line, row in rows:
        dispatch = _req(row, "Dispatch_Id", where, line)
        agent = row.get("Agent_Id") or None
        name = row["Counter_Name"]
        try:
            value = float(row["Counter_Value"])
        except ValueError:
            raise ProfileOutputError(f"line {line}: Counter_Value {row['Counter_Value']!r} of {name} is not a number",
                                     path=where) from None
        start, end = _timestamps(row, where, line, required=False)
        record = merged.setdefault((agent, dispatch), {
            "dispatch_id": dispatch, "kernel_name": row["Kernel_Name"], "counters": {}, "agent": agent,
            "kernel_id": _int(row, "Kernel_Id", where, line), "grid_size": _int(row, "Grid_Size", where, line),
            "workgroup_size": _int(row, "Workgroup_Size", where, line),
            "lds_bytes": _int(row, "LDS_Block_Size", where, line), "scratch_bytes": _int(row, "Scratch_Size", where, line),
            "vgprs": _int(row, "VGPR_Count", where, line), "agprs": _int(row, "Accum_VGPR_Count", where, line),
            "sgprs": _int(row, "SGPR_Count", where, line), "start_ns": start, "end_ns": end,
        })
        if record["kernel_name"] != row["Kernel_Name"]:
            raise ProfileOutputError(f"line {line}: dispatch {dispatch} is {row['Kernel_Name']!r} here but "
                                     f"{record['kernel_name']!r} on an earlier line", path=where)
        if name in record["counters"]:
            raise ProfileOutputError(f"line {line}: counter {name} appears twice for dispatch {dispatch}", path=where)
        record["counters"][name] = value
    return [DispatchCounters(**fields) for fields in merged.values()]


def find_outputs(output_dir: str | os.PathLike[str], suffix: str, output_name: str | None = None) -> list[Path]:
    """Output files ending in `suffix` anywhere below `output_dir` (optionally only `output_name_*`), sorted."""
    root = Path(output_dir)
    prefix = f"{output_name}_" if output_name else ""
    return sorted(p for p in root.rglob(f"{prefix}*{suffix}") if p.is_file())


def read_kernel_trace(command: RocprofCommand) -> list[KernelDispatch]:
    """Every dispatch of the kernel-trace files `command` wrote."""
    files = find_outputs(command.output_dir, KERNEL_TRACE_SUFFIX, command.output_name)
    if not files:
        raise ProfileOutputError(f"no *{KERNEL_TRACE_SUFFIX} below the output directory", path=command.output_dir,
                                 hint="did rocprofv3 run, with --output-format csv?")
    return [d for f in files for d in parse_kernel_trace(f)]


def read_counter_collection(command: RocprofCommand) -> list[DispatchCounters]:
    """Every dispatch's counters from the counter-collection files `command` wrote.

    An empty result is an error, so that a run that wrote no values (a counter the GPU does not
    define can leave no file behind) never reads as "all counters zero".
    """
    files = find_outputs(command.output_dir, COUNTER_COLLECTION_SUFFIX, command.output_name)
    records = [d for f in files for d in parse_counter_collection(f)]
    if not records:
        raise ProfileOutputError(f"no counter values in *{COUNTER_COLLECTION_SUFFIX} below the output directory",
                                 path=command.output_dir,
                                 hint="check the counter names with `rocprofv3 --list-avail` on the GPU machine")
    return records


def durations_by_kernel(dispatches: Iterable[KernelDispatch]) -> dict[str, list[int]]:
    """Dispatch durations in ns, by kernel name, in dispatch order."""
    out: dict[str, list[int]] = {}
    for d in sorted(dispatches, key=lambda d: (d.start_ns, d.dispatch_id)):
        out.setdefault(d.kernel_name, []).append(d.duration_ns)
    return out
