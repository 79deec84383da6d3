"""The program being optimized: the kernels of a Triton cache, matched to the launch records of a
recorded run (`kstrata record`), with each kernel's share of the program's GPU time.

Shares come from, in this order:
- **measured**: each recorded kernel's original binary timed on its own launch record (on an NVIDIA GPU),
  times how often the program launched it (`.kstrata/launch-counts.json`, which `kstrata record` writes; one
  launch per record when a recording has none);
- **equal**: when nothing can be timed here (no GPU, AMD kernels), every recorded kernel gets the same
  share, and the report says so: the order is then the cache's, not the program's.
Launches by Inductor's autotuner benchmarking its configs are counted apart (`benchmark_launches`): a config
launched only there is skipped, as one the program never ran. A kernel of the cache that the recorded
program never launched is skipped with that reason; with no
launch records at all every kernel is kept, with equal shares. A kernel under `MIN_SHARE` is skipped.

**Sibling configs** (`Program.siblings`): Inductor autotunes a kernel over a few configs (block sizes,
num_warps, num_stages), each its own binary and cache entry; `kstrata record` records the configs its
autotuner only benchmarked as well. A kernel's siblings are the other entries of the same name and target
whose launch records give the same arguments (apart from the grid and launch options) and whose TTIR is the
same apart from integer constants (the block sizes). A win measured against the config the recording ran is
a win at deployment only if it beats those too: Inductor's autotuner chooses freely among them.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kstrata.ir.errors import KstrataError

#: Kernels with less of the program's GPU time than this are not optimized (the issue: under 1%).
MIN_SHARE = 0.01
#: Written by `kstrata record` under the records' directory: launches per (kernel name, Triton cache key).
COUNTS_FILE = ".kstrata/launch-counts.json"


@dataclass
class ProgramKernel:
    """One kernel of the cache and what the program did with it."""

    entry: str
    key: str
    name: str
    target: str
    record: str | None = None
    override_key: str | None = None
    launches: int | None = None
    #: Launches by Inductor's autotuner benchmarking this config (`benchmark_launches`), when counted.
    benchmark_launches: int | None = None
    #: The original's time per launch on its record (us), when measured.
    time_us: float | None = None
    share: float | None = None
    #: The bytes of its launch record's buffers over the copy bandwidth, as a fraction of `time_us`
    #: (`LaunchRecord.buffer_bytes`; an estimate: the memory side of its speed of light), when known.
    sol: float | None = None
    skip: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Program:
    cache_dir: str
    launches_dir: str | None
    kernels: list[ProgramKernel]
    #: "measured" or "equal", and the reason when equal.
    share_source: str = "equal"
    share_note: str = ""
    unreadable_records: list[str] = field(default_factory=list)
    is_cache: bool = True

    def ranked(self) -> list[ProgramKernel]:
        """Kernels to optimize, largest share first (ties keep the cache's order)."""
        kept = [k for k in self.kernels if k.skip is None]
        return sorted(kept, key=lambda k: -(k.share or 0.0))

    def siblings(self, k: ProgramKernel) -> tuple[list[KernelConfig], list[str]]:
        """The other compiled configs of `k` (see the module docstring) with a launch record each, benchmark-only
        ones included, as `KernelConfig`s; and why other entries of its name are not siblings."""
        configs: list[KernelConfig] = []
        notes: list[str] = []
        same_name = [j for j in self.kernels if j is not k and j.name == k.name and j.target == k.target]
        if not same_name or k.record is None:
            return configs, notes
        from kstrata.ir.launch import LaunchRecord

        mine = LaunchRecord.load(k.record)
        ttir = _ttir(k.entry)
        for j in same_name:
            if j.record is None:
                notes.append(f"{j.key[:12]}: no launch record (neither the program nor Inductor's autotuner launched it)")
                continue
            theirs = LaunchRecord.load(j.record)
            if _launch_args(theirs) != _launch_args(mine):
                notes.append(f"{j.key[:12]}: launched with other arguments (another specialization, not a config)")
                continue
            constants = constants_apart(ttir, _ttir(j.entry))
            if constants is None:
                notes.append(f"{j.key[:12]}: other code (its TTIR differs beyond integer constants)")
                continue
            configs.append(KernelConfig.of(j, theirs, constants))
        return configs, notes


@dataclass(frozen=True)
class KernelConfig:
    """One compiled config of a kernel: its entry and launch record, its launch options and grid, the integer
    constants where its TTIR differs from the searched config's (Inductor's block sizes, as (the searched
    config's, this config's) pairs), and how often the program and Inductor's autotuner launched it."""

    entry: str
    key: str
    record: str | None
    override_key: str | None
    num_warps: int | None
    num_stages: int | None
    grid: tuple[int, ...]
    constants: tuple[tuple[int, int], ...] = ()
    launches: int | None = None
    benchmark_launches: int | None = None

    @classmethod
    def of(cls, k: ProgramKernel, record: Any, constants: tuple[tuple[int, int], ...] = ()) -> KernelConfig:
        return cls(k.entry, k.key, k.record, k.override_key, record.num_warps, record.num_stages, tuple(record.grid),
                   constants, k.launches, k.benchmark_launches)

    def words(self) -> str:
        consts = ", ".join(f"{mine} (searched config: {searched})" for searched, mine in self.constants)
        return (f"{self.key[:12]}: num_warps {self.num_warps}, num_stages {self.num_stages}, grid "
                f"{list(self.grid)}" + (f", block constants {consts}" if consts else "")
                + f"; launches: {self.launches or 0} by the program, {self.benchmark_launches or 0} by the autotuner")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "grid": list(self.grid), "constants": [list(c) for c in self.constants],
                "words": self.words()}


def _ttir(entry: str) -> str:
    from kstrata.agents.run_passes import entry_kernel_name

    path = Path(entry) / f"{entry_kernel_name(Path(entry))}.ttir"
    return path.read_text() if path.is_file() else ""


def _launch_args(record: Any) -> list[tuple[Any, ...]]:
    """A record's arguments without what differs between configs of one kernel (storage placement)."""
    from kstrata.ir.launch import TensorArg

    return [(a.name, a.dtype, a.shape, a.stride) if isinstance(a, TensorArg) else (a.name, a.type, a.value)
            for a in record.args]


#: An integer literal where a block size shows in TTIR: after `<`, `(`, `[`, `{`, `,`, `=`, a space, `%c`
#: (`%c512_i32`), or an `x` between dimensions (`tensor<8x256xf32>`); not inside a float, hex or name.
_INTEGER = re.compile(r"(?:(?<=[<(\[{,= ])|(?<=%c)|(?<=\dx))(\d+)(?![\d.eE])")


def constants_apart(a: str, b: str) -> tuple[tuple[int, int], ...] | None:
    """Whether two TTIR texts are the same apart from integer constants (and source locations), and the
    differing (a, b) pairs; None when they differ otherwise (an empty tuple: identical)."""
    from kstrata.agents.optimize.deployer import strip_locations

    ta, tb = strip_locations(a), strip_locations(b)
    if not ta.strip() or not tb.strip():
        return None
    pieces_a, pieces_b = _INTEGER.split(ta), _INTEGER.split(tb)
    if len(pieces_a) != len(pieces_b):
        return None
    pairs: dict[tuple[int, int], None] = {}
    for i, (x, y) in enumerate(zip(pieces_a, pieces_b, strict=True)):
        if i % 2 == 0:  # text between integers: must be equal
            if x != y:
                return None
        elif x != y:
            pairs[int(x), int(y)] = None
    return tuple(pairs)


def is_triton_cache(path: Path) -> bool:
    """Whether `path` is a Triton cache root (entries with a group file and stage files)."""
    from kstrata.ir.triton_layout import iter_cache_entries

    return path.is_dir() and next(iter_cache_entries(path), None) is not None


def bare_binary_kind(path: Path) -> str | None:
    """"cubin" or "hsaco" when `path` is a single GPU code object (an ELF file of an NVIDIA or AMD GPU
    machine), else None."""
    from kstrata.backends.elf import read_elf
    from kstrata.ir.errors import KstrataError

    if not path.is_file():
        return None
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            return None
    try:
        machine = read_elf(path.read_bytes(), origin=str(path)).machine
    except KstrataError:
        return "cubin" if path.suffix == ".cubin" else "hsaco" if path.suffix in (".hsaco", ".co") else None
    return {190: "cubin", 224: "hsaco"}.get(machine)


def read_launch_counts(launches: Path, field: str = "launches") -> dict[tuple[str, str], int]:
    """(kernel name, base32 cache key) -> launches, from `launch-counts.json`; empty when there is none.
    `field`: "launches" (the program's) or "benchmark_launches" (Inductor's autotuner benchmarking a config)."""
    path = launches / COUNTS_FILE
    if not path.is_file():
        return {}
    from kstrata.ir.files import read_json

    data = read_json(path)
    counts: dict[tuple[str, str], int] = {}
    rows = data.get("kernels") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise KstrataError("not a kstrata launch-counts file (no 'kernels' list)", path=path)
    for row in rows:
        if isinstance(row, dict) and isinstance(row.get(field), int):
            counts[(str(row.get("kernel")), str(row.get("cache_key")))] = int(row[field])
    return counts


def load_program(cache_dir: str | Path, launches: str | Path | None, only: tuple[str, ...] = ()) -> Program:
    """The kernels of `cache_dir` matched to the records under `launches` (shares still unset)."""
    from kstrata.agents.run_passes import entry_kernel_name, load_launch_records, match_record, select_entries
    from kstrata.ir.launch import LaunchRecord
    from kstrata.ir.target import Target
    from kstrata.ir.triton_layout import iter_cache_entries, read_index

    src = Path(cache_dir).expanduser()
    if not src.is_dir():
        raise KstrataError("no such cache directory", path=src)
    entries = [str(e) for e in iter_cache_entries(src)]
    if not entries:
        raise KstrataError("no Triton cache entries here (a cache root holds <key>/__grp__*.json)", path=src)
    if only:
        entries = select_entries(entries, only, src)
    index, unreadable = load_launch_records(launches) if launches is not None else ({}, [])
    counts = read_launch_counts(Path(launches)) if launches is not None else {}
    benchmarked = read_launch_counts(Path(launches), "benchmark_launches") if launches is not None else {}
    kstrata_index = read_index(src)
    kernels = []
    for entry in entries:
        name = entry_kernel_name(Path(entry))
        meta_path = Path(entry) / f"{name}.json"
        target = "?"
        try:
            meta = json.loads(meta_path.read_text())
            t = meta.get("target", {})
            target = str(Target.parse(f"{t['backend']}:{t['arch']}"))
        except (OSError, ValueError, KeyError, TypeError, KstrataError):
            pass
        record = match_record(entry, index)
        known = kstrata_index.get(Path(entry).name)
        override = str(known["override_key"]) if isinstance(known, dict) and known.get("override_key") else None
        if record and not override:
            override = LaunchRecord.load(record).override_key
        k = ProgramKernel(entry, Path(entry).name, name, target, record, override)
        key = (name, Path(entry).name)
        if launches is not None and record is None:
            k.skip = "not launched by the recorded program (no launch record matches this cache entry)"
        elif counts.get(key) == 0 and benchmarked.get(key):
            k.skip = (f"launched only by Inductor's autotuner ({benchmarked[key]} benchmark launches), never by the "
                      "program: a config it did not choose")
            k.launches = 0
        else:
            k.launches = counts.get(key) or (1 if record else None)
        k.benchmark_launches = benchmarked.get(key)
        kernels.append(k)
    return Program(str(src), str(launches) if launches is not None else None, kernels,
                   unreadable_records=unreadable)


def assign_shares(program: Program, times_us: dict[str, float] | None, why_equal: str) -> None:
    """Shares from measured times (entry -> us per launch) where every kept kernel has one; otherwise
    equal shares, with `why_equal` said. Kernels under `MIN_SHARE` are skipped with their share."""
    kept = [k for k in program.kernels if k.skip is None]
    if not kept:
        return
    if times_us and all(k.entry in times_us for k in kept):
        total = sum(times_us[k.entry] * (k.launches or 1) for k in kept)
        for k in kept:
            k.time_us = times_us[k.entry]
            k.share = times_us[k.entry] * (k.launches or 1) / total if total > 0 else 1.0 / len(kept)
        program.share_source, program.share_note = "measured", (
            "time per launch measured on each kernel's launch record, times its launch count")
    else:
        for k in kept:
            k.share = 1.0 / len(kept)
        program.share_source, program.share_note = "equal", why_equal
    if program.share_source == "measured":
        for k in kept:
            if (k.share or 0.0) < MIN_SHARE:
                k.skip = f"{k.share:.2%} of the program's GPU time, under {MIN_SHARE:.0%}: not worth a search"
