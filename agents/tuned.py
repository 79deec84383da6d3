"""The tuned database: kernels kstrata made faster, each keyed by the original kernel's content, its target
and the tool versions, that the `torch.compile` backend deploys (`options={"tuned": DIR}`).

Layout (one directory per tuned kernel, written atomically)::

    DIR/kstrata-tuned.json                      {"schema": "kstrata.tuned-db/1"}
    DIR/<kernel>-<content[:16]>-<target>-<versions[:8]>/
        tuned.json                              the record below
        entry/                                  the tuned kernel (a Triton cache entry: every level,
                                                binary and metadata consistent)

The **content digest** is the SHA-256 of the original kernel's TTIR with its source locations removed
(`loc(...)` references and `#loc` lines: they hold the path of the file Inductor generated, which differs
between machines and users) plus the options that change how TTIR is lowered (`num_warps`, `num_stages`,
`num_ctas`, `maxnreg`, ...), so the same kernel compiled the same way matches wherever it is compiled, and
a kernel with other code or options never does. The **versions** are the candidate engine's
(`tool_versions()`: Triton, ptxas, LLVM, kstrata); the ptxas is the one the kernel was built with (a program
under Inductor assembles with torch's own, `TRITON_PTXAS_PATH`: `add(..., ptxas=)` names it) and, at a
lookup, the one this process's Triton would use at that moment (Inductor sets the variable when it first
compiles, after the database was opened). A lookup needs all three to match and the kernel's name and
parameter list to be the tuned variant's: an unknown or mismatching kernel is never guessed at.

Only measured variants go in: a record holds the winning edit, its verdict (the gate's evidence summary),
the measured speedup with its spread, the device and when it was measured. `kstrata tuned list|show|prune`.

A kernel Inductor autotunes over several configs has one record per tuned config; `siblings` holds the
tuned variant's timing against every other config of the kernel that was recorded (each by its content
digest), each on its own launch record, and only a variant that beats them all goes in (`beats_siblings`).
With such a record the torch.compile backend makes Inductor's autotuner use the tuned config, when every
other config it compiled for the kernel is one the variant was measured against (`compiled_content_digest`;
`tools/torch_backend.py`, `_Session.choose_config`). A record without `siblings` (made before they were
measured) says nothing about the other configs: the autotuner chooses freely, as before.

The tuned config need not be the one the recorded program ran: the compiled search starts from the fastest
config Inductor compiled (`agents/compiled/run.py`, `kernel_start`), so a record may hold a variant of that
config (`recorded_config` and `speedup_vs_recorded` then say what the program ran and the gain over it), or
that config as it is, with no edit (`edit` `config(KEY)`, the tuned binary the original's: `config_choice`).
Either way the record is keyed by its own config's content, and the recorded config is one of its `siblings`,
so deploying it is the same restriction of the autotuner.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kstrata.agents.optimize.deployer import digest_parts, kernel_digest, strip_locations
from kstrata.ir.errors import KstrataError

DB_SCHEMA = "kstrata.tuned-db/1"
RECORD_SCHEMA = "kstrata.tuned/1"
DB_FILE = "kstrata-tuned.json"
RECORD_FILE = "tuned.json"
class TunedError(KstrataError):
    """A tuned database or record that cannot be used."""


def content_digest(ttir: str, options: Mapping[str, Any]) -> str:
    """The kernel's content digest: its location-free TTIR and its lowering options (`deployer.kernel_digest`,
    shared with the optimizer's standalone deployer, which cannot import kstrata)."""
    return kernel_digest(ttir, options)


def versions_digest(versions: Mapping[str, str] | None = None) -> str:
    from kstrata.agents.engine import tool_versions

    v = dict(versions) if versions is not None else dict(tool_versions())
    return hashlib.sha256(json.dumps(v, sort_keys=True).encode()).hexdigest()


_PTXAS_PATH = re.compile(r" \((/[^()]*)\)$")


def record_ptxas(versions: Mapping[str, str]) -> str | None:
    """The ptxas path a record's versions name (`tool_versions(ptxas=...)` writes `VERSION (PATH)`), or None."""
    m = _PTXAS_PATH.search(versions.get("ptxas", ""))
    return m.group(1) if m else None


@dataclass
class TunedRecord:
    kernel: str
    target: str
    content: str
    versions: dict[str, str]
    versions_digest: str
    #: The winning edit (a pipeline), its declared tolerance and the spaces it came from.
    edit: str
    tolerance: str | None
    spaces: list[str]
    #: The original's and the tuned binary's digests, the parameter list both share.
    original_binary: str
    tuned_binary: str
    params: list[str]
    #: Metadata the tuned kernel launches with where it differs from the original's (num_warps, shared, …).
    metadata_changes: dict[str, Any]
    verdict: str
    speedup: float
    speedup_range: list[float] | None
    time_before_us: float | None
    time_after_us: float | None
    device: str
    measured_at: str
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: The config the speedup was measured against (the one the recorded program ran: launch options, grid),
    #: when known.
    config: dict[str, Any] | None = None
    #: The tuned variant against each other autotuning config of the kernel, on that config's own launch
    #: record (`search.SiblingTiming` with the config's `content` digest); [] when it has none; None when not
    #: compared (a record made before configs were).
    siblings: list[dict[str, Any]] | None = None
    #: The config the recorded program ran, when the variant is of another, faster config (the compiled search
    #: started from the fastest config): `config` is then the config to deploy, `recorded_config` the one the
    #: program would have run, and `speedup_vs_recorded` the variant's speed over it (`speedup` is over its own
    #: config's original, the best config Inductor compiled). None: the variant is of the recorded config.
    recorded_config: dict[str, Any] | None = None
    speedup_vs_recorded: float | None = None

    @property
    def config_choice(self) -> bool:
        """Whether the record deploys a config as Inductor compiled it, with no edit (`config(KEY)`)."""
        return self.edit.startswith("config(") and self.tuned_binary == self.original_binary

    @property
    def beats_siblings(self) -> bool:
        """Whether the variant was timed against every recorded config of its kernel and beat each."""
        return self.siblings is not None and all(t.get("status") == "beaten" and t.get("content")
                                                 for t in self.siblings)

    @property
    def sibling_contents(self) -> set[str]:
        return {str(t["content"]) for t in self.siblings or () if t.get("content")}

    @property
    def slug(self) -> str:
        safe = re.sub(r"[^\w.-]", "_", self.kernel)[:80]
        return f"{safe}-{self.content[:16]}-{self.target.replace(':', '-')}-{self.versions_digest[:8]}"

    def to_json(self) -> dict[str, Any]:
        return {"schema": RECORD_SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], origin: str | Path) -> TunedRecord:
        from kstrata.ir.schema import validate_dataclass

        if not isinstance(data, Mapping) or data.get("schema") != RECORD_SCHEMA:
            raise TunedError(f"not a {RECORD_SCHEMA} record", path=origin)
        # a field of the wrong type is an unreadable record here, not a crash in whatever reads it later
        return validate_dataclass(cls, {k: v for k, v in data.items() if k != "schema"}, path=origin,
                                  what="tuned record", error=TunedError)


def _kernel_files(entry: Path) -> tuple[str, str, dict[str, Any], bytes]:
    """(name, TTIR text, metadata, binary) of a cache entry."""
    from kstrata.agents.run_passes import entry_kernel_name

    name = entry_kernel_name(entry)
    try:
        ttir = (entry / f"{name}.ttir").read_text()
        meta = json.loads((entry / f"{name}.json").read_text())
    except (OSError, ValueError) as exc:
        raise TunedError(f"cannot read the kernel's TTIR and metadata: {exc}", path=entry) from None
    binary = next((p for p in (entry / f"{name}.cubin", entry / f"{name}.hsaco") if p.is_file()), None)
    if binary is None:
        raise TunedError("the entry has no cubin or hsaco", path=entry)
    return name, ttir, meta, binary.read_bytes()


def _params(ttir: str) -> list[str]:
    """`name: type` of each parameter of the kernel's public function (attributes and locations left out)."""
    text = strip_locations(ttir)
    m = re.search(r"tt\.func public @[\w$]+\((.*?)\)\s*(?:attributes|\{)", text, re.S)
    if not m:
        return []
    return [f"{n}: {t}" for n, t in re.findall(r"%([\w$]+): ([^\s,{]+)", m.group(1))]


class TunedDB:
    """A tuned database directory (created on first `add`)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser()

    # -- writing ----------------------------------------------------------------------------------
    def create(self) -> TunedDB:
        """Make an empty database here (nothing when there is one)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / DB_FILE).exists():
            _atomic_write(self.root / DB_FILE, json.dumps({"schema": DB_SCHEMA}) + "\n")
        return self

    def add(self, original_entry: str | Path, tuned_entry: str | Path, *, edit: str, tolerance: str | None,
            spaces: list[str], verdict: str, speedup: float, speedup_range: list[float] | None,
            time_before_us: float | None, time_after_us: float | None, device: str, source: str = "",
            extra: Mapping[str, Any] | None = None, ptxas: str | None = None,
            config: Mapping[str, Any] | None = None,
            siblings: Sequence[Mapping[str, Any]] | None = None,
            recorded_config: Mapping[str, Any] | None = None,
            speedup_vs_recorded: float | None = None) -> TunedRecord:
        """Record `tuned_entry` as the tuned variant of `original_entry` (both cache entries); `ptxas`: the
        assembler both were built with when it is not this process's (`TRITON_PTXAS_PATH` of the recorded
        program: `engine.tool_env(record)`). `config`: the config it was measured against; `siblings`: its
        timings against the kernel's other configs (`SiblingTiming.to_json()`, each `config` with its
        cache `entry`), every one beaten; None: not compared. `recorded_config`, `speedup_vs_recorded`: the
        config the recorded program ran and the variant's speed over it, when `original_entry` is another config
        (`TunedRecord`). A tuned entry equal to the original (`edit` `config(KEY)`) deploys that config as it is."""
        from kstrata.agents.engine import tool_versions
        from kstrata.ir.candidate import changed_metadata

        if not speedup or speedup <= 1.0:
            raise TunedError(f"only measured speedups go in a tuned database, not {speedup!r}")
        lost = [t for t in siblings or () if t.get("status") != "beaten"]
        if lost:
            raise TunedError(f"the variant did not beat {len(lost)} of the kernel's other configs: not a win there")
        compared = None
        if siblings is not None:
            compared = []
            for t in siblings:
                _, sttir, smeta, _ = _kernel_files(Path(str(t["config"]["entry"])))
                compared.append({**t, "content": content_digest(sttir, smeta)})
        name, ttir, meta, original_bin = _kernel_files(Path(original_entry))
        tname, tttir, tmeta, tuned_bin = _kernel_files(Path(tuned_entry))
        if tname != name or _params(tttir) != _params(ttir):
            raise TunedError(f"the tuned kernel {tname} does not have the original {name}'s name and parameters")
        t = meta.get("target") or {}
        versions = dict(tool_versions(ptxas))
        record = TunedRecord(name, f"{t.get('backend')}:{t.get('arch')}", content_digest(ttir, meta), versions,
                             versions_digest(versions), edit, tolerance, spaces,
                             hashlib.sha256(original_bin).hexdigest(), hashlib.sha256(tuned_bin).hexdigest(),
                             _params(ttir), changed_metadata(meta, tmeta), verdict, speedup, speedup_range,
                             time_before_us, time_after_us, device, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             source, {**dict(extra or {}), **_content_parts(ttir, meta)},
                             dict(config) if config is not None else None, compared,
                             dict(recorded_config) if recorded_config is not None else None, speedup_vs_recorded)
        self.create()
        final = self.root / record.slug
        tmp = self.root / f".{record.slug}.tmp.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "entry").mkdir(parents=True)
        for f in sorted(Path(tuned_entry).iterdir()):
            if f.is_file() and not f.name.startswith(("__grp__", "lock", "tmp.")):
                shutil.copy2(f, tmp / "entry" / f.name)
        (tmp / RECORD_FILE).write_text(json.dumps(record.to_json(), indent=1, sort_keys=True) + "\n")
        if final.exists():
            old = self.root / f".{record.slug}.old.{os.getpid()}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
        return record

    # -- reading ----------------------------------------------------------------------------------
    def check(self) -> None:
        if not self.root.is_dir():
            raise TunedError("no such tuned database directory", path=self.root)
        marker = self.root / DB_FILE
        try:
            ok = json.loads(marker.read_text()).get("schema") == DB_SCHEMA
        except (OSError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise TunedError(f"not a kstrata tuned database (no valid {DB_FILE})", path=self.root)

    def records(self) -> Iterator[tuple[Path, TunedRecord | TunedError]]:
        """Every record directory with its record, or the error that makes it unreadable."""
        self.check()
        for d in sorted(self.root.iterdir()):
            if not d.is_dir() or d.name.startswith("."):
                continue
            try:
                data = json.loads((d / RECORD_FILE).read_text())
                yield d, TunedRecord.from_json(data, d / RECORD_FILE)
            except (OSError, ValueError) as exc:
                yield d, TunedError(f"unreadable tuned record: {type(exc).__name__}", path=d / RECORD_FILE)
            except TunedError as exc:
                yield d, exc

    def find(self, name: str) -> list[tuple[Path, TunedRecord]]:
        """Records whose kernel name or directory name starts with `name`."""
        return [(d, r) for d, r in self.records() if isinstance(r, TunedRecord)
                and (r.kernel == name or d.name.startswith(name))]

    def stale_reason(self, d: Path, r: TunedRecord, versions: str | None = None) -> str | None:
        """Why the record can never be applied here (other tool versions, a damaged entry), or None.
        `versions`: the digest to compare with; default: this installation's with the record's own ptxas
        when that file is here (a program under Inductor assembles with torch's), else the default one."""
        if versions is None:
            from kstrata.agents.engine import tool_versions

            ptxas = record_ptxas(r.versions)
            versions = versions_digest(dict(tool_versions(ptxas if ptxas and Path(ptxas).is_file() else None)))
        if r.versions_digest != versions:
            return "made with other tool versions than this installation's (it would never match)"
        binary = next((p for p in (d / "entry").glob(f"{r.kernel}.*") if p.suffix in (".cubin", ".hsaco")), None)
        if binary is None or hashlib.sha256(binary.read_bytes()).hexdigest() != r.tuned_binary:
            return "its tuned binary is missing or does not match the record's digest"
        return None

    def prune(self, *, dry_run: bool = False) -> list[tuple[str, str]]:
        """Remove records that can never apply here (unreadable, other versions, damaged); returns what and why."""
        gone = []
        for d, r in list(self.records()):
            why = str(r.message) if isinstance(r, TunedError) else self.stale_reason(d, r)
            if why:
                gone.append((d.name, why))
                if not dry_run:
                    shutil.rmtree(d)
        return gone

    def index(self) -> dict[tuple[str, str, str], tuple[Path, TunedRecord]]:
        """(content, target, versions digest) -> the usable record, for lookups (versions: each record's own;
        a lookup compares them with the tools of the moment)."""
        out: dict[tuple[str, str, str], tuple[Path, TunedRecord]] = {}
        for d, r in self.records():
            if isinstance(r, TunedRecord) and self.stale_reason(d, r, r.versions_digest) is None:
                out[(r.content, r.target, r.versions_digest)] = (d, r)
        return out


@dataclass(frozen=True)
class TunedVariant:
    """What the backend applies to one kernel: the tuned entry's levels and binary, and its metadata."""

    record: TunedRecord
    entry: Path

    def level(self, ext: str) -> bytes | None:
        p = self.entry / f"{self.record.kernel}.{ext}"
        return p.read_bytes() if p.is_file() else None


class LaunchCensus:
    """Which binaries a program launched while it is active (a context manager, in this process): per kernel
    name and binary (the SHA-256 of its cubin or hsaco), how many launches, and whether that binary is a
    tuned variant of the database `db`. Which variant runs is Inductor's autotuner's choice among the configs
    it compiled, so "deployed" (compiled in) is not "ran": this says which one ran.

    Counted where Triton's and Inductor's launchers meet (`CompiledKernel.launch_metadata`, called before every
    launch while a launch-enter hook chain exists, which Triton >= 3.5 always has); launches through Inductor's
    static CUDA launcher bypass it (the backend turns that launcher off while it compiles)."""

    def __init__(self, db: str | Path | None = None) -> None:
        self.tuned = {r.tuned_binary: r for _, r in TunedDB(db).index().values()} if db else {}
        self.counts: dict[tuple[str, str], int] = {}
        #: per (kernel, binary): its launch configuration as first seen (num_warps, num_stages, grid)
        self.configs: dict[tuple[str, str], dict[str, Any]] = {}
        self._digests: dict[int, str] = {}
        self._saved: Any = None

    def _digest(self, kernel: Any) -> str:
        key = id(kernel)
        if key not in self._digests:
            self._digests[key] = compiled_binary_digest(kernel)
        return self._digests[key]

    def __enter__(self) -> LaunchCensus:
        from triton.compiler.compiler import CompiledKernel

        census, original = self, CompiledKernel.launch_metadata
        self._saved = original

        def launch_metadata(kernel: Any, grid: Any, stream: Any, *args: Any) -> Any:
            k = (str(kernel.name), census._digest(kernel))
            census.counts[k] = census.counts.get(k, 0) + 1
            if k not in census.configs:
                meta = getattr(kernel, "metadata", None)
                census.configs[k] = {"num_warps": getattr(meta, "num_warps", None),
                                     "num_stages": getattr(meta, "num_stages", None),
                                     "grid": [int(g) for g in grid] if isinstance(grid, (tuple, list)) else None}
            return original(kernel, grid, stream, *args)

        CompiledKernel.launch_metadata = launch_metadata
        return self

    def __exit__(self, *exc: Any) -> None:
        from triton.compiler.compiler import CompiledKernel

        CompiledKernel.launch_metadata = self._saved

    def rows(self, calls: int = 1) -> list[dict[str, Any]]:
        """Per (kernel, binary): launches per call, its launch configuration (num_warps, num_stages, grid: which of
        the configs Inductor's autotuner compiled ran), and the tuned record's edit when the binary is tuned."""
        out = []
        for (name, digest), n in sorted(self.counts.items()):
            r = self.tuned.get(digest)
            out.append({"kernel": name, "binary": digest[:16], "launches_per_call": n / max(1, calls),
                        "tuned": r is not None, "edit": r.edit if r is not None else None,
                        **self.configs.get((name, digest), {})})
        return out


def compiled_binary_digest(kernel: Any) -> str:
    """The SHA-256 of a Triton `CompiledKernel`'s binary (its cubin or hsaco), as `TunedRecord.tuned_binary`."""
    asm = getattr(kernel, "asm", {}) or {}
    binary = asm.get("cubin") or asm.get("hsaco") or b""
    return hashlib.sha256(binary if isinstance(binary, bytes) else str(binary).encode()).hexdigest()


def compiled_content_digest(kernel: Any) -> str | None:
    """A Triton `CompiledKernel`'s content digest (its TTIR and lowering options), or None without its TTIR."""
    ttir = (getattr(kernel, "asm", {}) or {}).get("ttir")
    if not ttir:
        return None
    meta: Any = getattr(kernel, "metadata", None)  # Triton's KernelMetadata, a namedtuple
    options = meta._asdict() if hasattr(meta, "_asdict") else dict(meta) if isinstance(meta, Mapping) else {}
    return content_digest(ttir if isinstance(ttir, str) else ttir.decode(), options)


class TunedLookup:
    """Matches kernels being compiled to a tuned database (loaded once)."""

    def __init__(self, root: str | Path) -> None:
        self.db = TunedDB(root)
        self._index = self.db.index()
        self._by_binary = {r.tuned_binary: r for _, r in self._index.values()}

    def __len__(self) -> int:
        return len(self._index)

    def by_binary(self, digest: str) -> TunedRecord | None:
        """The record whose tuned binary has this digest (`compiled_binary_digest`), or None."""
        return self._by_binary.get(digest)

    def match(self, name: str, target: str, ttir: str, options: Mapping[str, Any]) -> tuple[TunedVariant | None, str]:
        """The tuned variant of this kernel, or None and why none applies (no guess is ever made)."""
        content, versions = content_digest(ttir, options), versions_digest()
        hit = self._index.get((content, target, versions))
        if hit is None:
            other_tools = [r for _, r in self._index.values() if r.content == content and r.target == target]
            if other_tools:
                from kstrata.agents.engine import tool_versions

                here = dict(tool_versions())
                diff = sorted(k for k in {*here, *other_tools[0].versions} if here.get(k) != other_tools[0].versions.get(k))
                return None, ("a tuned variant of this kernel exists, but made with other tool versions ("
                              + "; ".join(f"{k}: {other_tools[0].versions.get(k)} there, {here.get(k)} here" for k in diff)
                              + "): not applied")
            same_name = [r for _, r in self._index.values() if r.kernel == name and r.target == target]
            if not same_name:
                return None, "no tuned variant"
            measured = next((r for r in same_name if content in r.sibling_contents), None)
            if measured is not None:
                against = next(t for t in measured.siblings or () if t.get("content") == content)
                return None, (f"another autotuning config of a tuned kernel: the tuned variant of the config "
                              f"{(measured.config or {}).get('words', '?')} beat this one by {against.get('speedup', 0):.3f}x "
                              "on its own launch record; not applied to this config")
            return None, ("a tuned variant of this name exists, but for other code or options ("
                          + "; ".join(dict.fromkeys(_content_difference(r, ttir, options) for r in same_name))
                          + "): not applied")
        d, record = hit
        if record.kernel != name or record.params != _params(ttir):
            return None, "the tuned variant's name or parameters differ from this kernel's: not applied"
        return TunedVariant(record, d / "entry"), "tuned"


def _content_parts(ttir: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """What the content digest is made of, kept in a record's `extra` so that a lookup can say what differs."""
    parts = digest_parts(ttir, options)
    return {"ttir_digest": hashlib.sha256(parts["ttir"].encode()).hexdigest(), "lowering_options": parts["options"]}


def _content_difference(r: TunedRecord, ttir: str, options: Mapping[str, Any]) -> str:
    """In words, how a kernel being compiled differs from the kernel a record was tuned from."""
    theirs = r.extra.get("ttir_digest"), r.extra.get("lowering_options")
    if theirs[0] is None or not isinstance(theirs[1], dict):
        return "the record predates the parts of the digest being kept"
    here = _content_parts(ttir, options)
    parts = []
    if here["ttir_digest"] != theirs[0]:
        parts.append("its TTIR differs")
    opts = json.loads(json.dumps(here["lowering_options"], default=str))
    keys = sorted(k for k in {*opts, *theirs[1]} if opts.get(k) != theirs[1].get(k))
    parts += [f"{k}: {opts.get(k)!r} here, {theirs[1].get(k)!r} in the record" for k in keys]
    return ", ".join(parts) or "the digests differ although TTIR and options agree"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)
