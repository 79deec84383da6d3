"""Profiling turned into findings: pluggable analyzers over the incumbent's evidence.

`Evidence` holds what was measured of the incumbent: the task spec, the roofline point, the
torch.profiler kernel table (time shares, launches per call, wall time), Nsight Compute metrics of the top
kernels when ncu ran (`ncu_note` says why not otherwise), SASS statistics of its Triton kernels when they
could be read, and the degenerate-task verdict. An analyzer (`Analyzer`: `name`, `analyze(evidence) ->
list[Finding]`) turns evidence into findings, each structured (`kind`, `data`, `severity` 0–1) plus one
line of text. Built-ins are below; more come from the entry-point group `kstrata.analyzers` (an entry
point names an Analyzer class, a factory, or an instance). An analyzer that raises is reported as a
finding of kind `analyzer-error`, never fatal.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Protocol, runtime_checkable

ENTRY_POINT_GROUP = "kstrata.analyzers"

#: Memory-bound work below this fraction of the measured copy bandwidth is a finding.
MEMORY_BW_FRACTION = 0.6
#: The GPU busy below this fraction of a call's wall time: launch- or host-bound.
BUSY_FRACTION = 0.6
#: Kernels shorter than this on average, with at least `MANY_LAUNCHES` launches per call: launch-bound.
SHORT_KERNEL_US = 8.0
MANY_LAUNCHES = 6
#: At or above this fraction of speed of light there is nothing left worth searching for.
AT_SOL = 0.95


@dataclass(frozen=True)
class Finding:
    analyzer: str
    kind: str
    text: str  # one line a person reads
    severity: float = 0.5  # 0..1: how much time it may explain
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"analyzer": self.analyzer, "kind": self.kind, "text": self.text, "severity": self.severity,
                "data": self.data}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Finding:
        return cls(d["analyzer"], d["kind"], d["text"], d.get("severity", 0.5), d.get("data", {}))


@dataclass
class Evidence:
    spec: Any  # TaskSpec
    policy: str
    device: str
    incumbent: str  # the incumbent's label (a baseline name)
    incumbent_us: float | None = None
    #: the fastest of the incumbent's round medians: its call at the quietest moment the timer saw
    incumbent_best_us: float | None = None
    roofline: dict[str, Any] | None = None  # RooflinePoint.to_json()
    ceilings: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None  # worker.profile's result
    profile_note: str = ""
    ncu: list[dict[str, Any]] | None = None
    ncu_note: str = ""
    sass: list[dict[str, Any]] | None = None
    sass_note: str = ""
    degeneracy: Any = None  # contract.Degeneracy
    graph_ops: tuple[str, ...] = ()  # torch.fx call targets in order (for structural findings)
    rewrites: tuple[str, ...] = ()  # graph.py rewrites that match the task's graph

    def ops(self) -> dict[str, int]:
        return dict(self.spec.flops_by_op)

    def notes(self) -> list[str]:
        return [n for n in (self.profile_note, self.ncu_note, self.sass_note) if n]


@runtime_checkable
class Analyzer(Protocol):
    name: str

    def analyze(self, evidence: Evidence) -> list[Finding]: ...


def _op_share(ev: Evidence, needles: Iterable[str]) -> float:
    ops = ev.ops()
    total = sum(ops.values()) or 1
    return sum(v for k, v in ops.items() if any(n in k for n in needles)) / total


def _kernel_share(ev: Evidence, needles: Iterable[str]) -> float:
    rows = (ev.profile or {}).get("kernels", [])
    return float(sum(r["share"] for r in rows if any(n in r["name"].lower() for n in needles)))


class RooflineAnalyzer:
    name = "roofline"

    def analyze(self, ev: Evidence) -> list[Finding]:
        r = ev.roofline
        if not r:
            ai = ev.spec.arithmetic_intensity
            return [Finding(self.name, "roofline-unknown", f"not measured (device {ev.device}): arithmetic intensity "
                            f"{ai:.2g} FLOP/byte, no roofline fraction", 0.0, {"intensity": ai})]
        out = [Finding(self.name, "roofline", f"{r['bound']}-bound, {100 * r['fraction']:.0f}% of speed of light "
                       f"({ev.incumbent} {r['seconds'] * 1e6:.1f} us vs SOL {r['sol_seconds'] * 1e6:.1f} us)",
                       max(0.0, 1 - r["fraction"]), {"bound": r["bound"], "fraction": r["fraction"]})]
        if r["fraction"] >= AT_SOL:
            out.append(Finding(self.name, "at-sol", f"already at {100 * r['fraction']:.0f}% of speed of light", 0.0,
                               {"fraction": r["fraction"]}))
        if r["bound"] == "memory" and ev.ceilings:
            bw = r["achieved_bytes_per_s"] / ev.ceilings["copy_bytes_per_s"]
            if bw < MEMORY_BW_FRACTION:
                out.append(Finding(self.name, "memory-bound-low-bw",
                                   f"memory-bound at {100 * bw:.0f}% of the measured copy bandwidth "
                                   f"(below {100 * MEMORY_BW_FRACTION:.0f}%)", 1 - bw, {"bandwidth_fraction": bw}))
        return out


class LaunchAnalyzer:
    """Launch- or host-bound work: the GPU idle for much of a call, or many short kernels.

    The busy fraction is the kernels' time per call over the call's time *as the timer measured it*
    (`Evidence.incumbent_us`, without a profiler attached); the profiler's own wall time per call counts its
    overhead: on the H200 (2026-12-02) torch.compile's GroupNorm (level1/22) took 170 us per call under
    torch.profiler and 84 us under the timer in a fresh-process evaluation of the same call, with 62.7 us of
    kernels: the profiler's wall said "GPU busy 37%, launch-bound", the timer 75%. (The timer's own figure
    drifted on that machine too, up to 136 us in later processes, which then fired the finding again.) So the
    call's time is the incumbent's fastest round (`Evidence.incumbent_best_us`) where its rounds are known: host
    time that comes and goes with the machine's load is not the task's (on level1/22 the same 63 us of kernels
    were 48% of a 131 us median and 72% of the 88 us best round in one run, 2026-12-02). The profiler's wall
    is used only when the incumbent was not timed."""

    name = "launches"

    def analyze(self, ev: Evidence) -> list[Finding]:
        p = ev.profile
        if not p or not p.get("wall_us_per_call") or not p.get("launches_per_call"):
            return []  # no device kernels seen (a CPU run): nothing to say about launches
        kernel_us = p["kernel_us_per_call"]
        timed = ev.incumbent_us is not None and ev.incumbent_us > 0
        best = ev.incumbent_best_us if timed and ev.incumbent_best_us and ev.incumbent_best_us > 0 else None
        wall = float(best or ev.incumbent_us) if timed else float(p["wall_us_per_call"])  # type: ignore[arg-type]
        busy = min(1.0, kernel_us / wall)
        launches = p["launches_per_call"]
        mean = kernel_us / launches if launches else 0.0
        source = (f"the call's {wall:.0f} us as timed" + (f" at its fastest round (median {ev.incumbent_us:.0f} us)"
                                                          if best else "")
                  + f" (under the profiler {p['wall_us_per_call']:.0f} us)" if timed
                  else f"the call's {wall:.0f} us under the profiler (not timed)")
        out = []
        if busy < BUSY_FRACTION or (launches >= MANY_LAUNCHES and mean < SHORT_KERNEL_US):
            out.append(Finding(self.name, "launch-bound",
                               f"launch-bound: {launches:.0f} kernels per call averaging {mean:.1f} us, GPU busy "
                               f"{100 * busy:.0f}% of {source}", 1 - busy,
                               {"busy": busy, "launches": launches, "mean_kernel_us": mean, "wall_us": wall,
                                "wall_source": "timer" if timed else "profiler"}))
        elif launches >= 2 * MANY_LAUNCHES:
            out.append(Finding(self.name, "many-kernels", f"{launches:.0f} kernels per call (fusion headroom)", 0.3,
                               {"launches": launches}))
        return out


class OperatorMixAnalyzer:
    """Structural findings from the task's ATen FLOPs and graph (no GPU needed)."""

    name = "operators"

    def analyze(self, ev: Evidence) -> list[Finding]:
        out = []
        conv = max(_op_share(ev, ("convolution",)), _kernel_share(ev, ("conv", "cudnn", "implicit_gemm", "xmma")))
        if conv > 0.3:
            out.append(Finding(self.name, "conv-heavy", f"convolutions carry {100 * conv:.0f}% of the work "
                               "(cuDNN algorithm choice and memory format matter)", conv, {"share": conv}))
        attn = max(_op_share(ev, ("scaled_dot_product", "_flash_attention", "_efficient_attention")),
                   _kernel_share(ev, ("flash", "fmha", "attention")))
        if attn > 0.2:
            out.append(Finding(self.name, "attention", f"attention carries {100 * attn:.0f}% of the work (SDPA backend "
                               "choice)", attn, {"share": attn}))
        mm = _op_share(ev, ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm"))
        ops = ev.graph_ops
        if mm > 0.3 and not ev.rewrites and any(a == "gelu" and b == "linear" for b, a in itertools.pairwise(ops)):
            out.append(Finding(self.name, "gemm-epilogue", "a Linear followed by GELU: an epilogue-fusing GEMM "
                               "(compiler or template) can take it", 0.3, {"matmul_share": mm}))
        red = dict(ev.spec.flops_by_kind).get("reduction", 0) / max(1, ev.spec.flops)
        if red > 0.3:
            out.append(Finding(self.name, "reduction-heavy", f"reductions are {100 * red:.0f}% of the FLOPs (reduction "
                               "strategy: split, persistent)", red, {"share": red}))
        return out


class GraphPatternAnalyzer:
    """Which exact torch.fx rewrites (graph.py) match the task's graph."""

    name = "graph"

    def analyze(self, ev: Evidence) -> list[Finding]:
        if not ev.rewrites:
            return []
        lib = [r for r in ev.rewrites if r == "addmm-epilogue"]
        ids = [r for r in ev.rewrites if r != "addmm-epilogue"]
        out = []
        if ids:
            out.append(Finding(self.name, "fx-identity", "exact algebraic rewrites apply to the graph: " + ", ".join(ids),
                               0.5, {"rewrites": ids}))
        if lib:
            out.append(Finding(self.name, "gemm-epilogue", "a Linear + ReLU: cuBLASLt's addmm + activation epilogue "
                               "applies", 0.3, {"rewrites": lib}))
        return out


class PrecisionAnalyzer:
    name = "precision"

    def analyze(self, ev: Evidence) -> list[Finding]:
        mm = dict(ev.spec.flops_by_kind).get("matmul", 0) / max(1, ev.spec.flops)
        dtypes = ev.spec.dtypes
        if mm < 0.5 or "float32" not in dtypes:
            return []
        if ev.policy == "tf32":
            return [Finding(self.name, "simt-fp32-tf32-allowed", f"fp32 matmuls ({100 * mm:.0f}% of the FLOPs) run on "
                            "SIMT FP32 units while the tf32 policy admits tensor cores", 0.8, {"matmul_share": mm})]
        r = ev.roofline
        if r and r["bound"] == "compute" and r["fraction"] > 0.85:
            return [Finding(self.name, "fp32-gemm-strict-bound", f"fp32 matmul-bound at {100 * r['fraction']:.0f}% of "
                            "the SIMT FP32 bound: under strict no tensor-core path is admitted", 0.0, {"matmul_share": mm})]
        return []


class NcuAnalyzer:
    """Occupancy limits, tail effect, coalescing, DRAM/SM throughput of the top kernels (when ncu ran)."""

    name = "ncu"

    def analyze(self, ev: Evidence) -> list[Finding]:
        out: list[Finding] = []
        for k in (ev.ncu or [])[:5]:
            name = str(k.get("Kernel Name", "?"))[:60]
            occ = _num(k, "sm__warps_active.avg.pct_of_peak_sustained_active")
            theo = _num(k, "sm__maximum_warps_per_active_cycle_pct")
            lim_reg, lim_smem = _num(k, "launch__occupancy_limit_registers"), _num(k, "launch__occupancy_limit_shared_mem")
            lim_warps = _num(k, "launch__occupancy_limit_warps")
            if theo is not None and theo < 50 and lim_warps is not None:
                if lim_reg is not None and lim_reg < lim_warps and (lim_smem is None or lim_reg <= lim_smem):
                    out.append(Finding(self.name, "occupancy-registers", f"{name}: occupancy {theo:.0f}% limited by "
                                       f"registers ({_num(k, 'launch__registers_per_thread') or 0:.0f}/thread)", 0.4,
                                       {"kernel": name, "theoretical": theo}))
                elif lim_smem is not None and lim_smem < lim_warps:
                    out.append(Finding(self.name, "occupancy-shared", f"{name}: occupancy {theo:.0f}% limited by "
                                       "shared memory", 0.4, {"kernel": name, "theoretical": theo}))
            waves = _num(k, "launch__waves_per_multiprocessor")
            if waves is not None and 0 < waves < 1.0:
                out.append(Finding(self.name, "tail-effect", f"{name}: {waves:.2f} waves per SM (fewer CTAs than SMs x "
                                   "occupancy: part of the GPU idles)", 1 - waves, {"kernel": name, "waves": waves}))
            sect = _num(k, "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct")
            # 0 is no plain global load at all (a kernel that loads through cp.async or TMA: cuDNN's and
            # cuBLAS's on sm80+; the H200 run of 2026-12-01 called such a conv "0% of each sector used").
            if sect is not None and 0 < sect < 60:
                out.append(Finding(self.name, "uncoalesced", f"{name}: {sect:.0f}% of each loaded sector used "
                                   "(uncoalesced or narrow global loads)", 0.5, {"kernel": name, "sector_use": sect}))
            dram, sm = _num(k, "dram__throughput.avg.pct_of_peak_sustained_elapsed"), _num(
                k, "sm__throughput.avg.pct_of_peak_sustained_elapsed")
            if dram is not None and sm is not None and dram < 40 and sm < 40:
                out.append(Finding(self.name, "latency-bound", f"{name}: DRAM {dram:.0f}%, SM {sm:.0f}% of peak "
                                   f"(achieved occupancy {occ or 0:.0f}%): latency-bound", 0.4, {"kernel": name}))
        return out


class SassAnalyzer:
    name = "sass"

    def analyze(self, ev: Evidence) -> list[Finding]:
        out = []
        for k in ev.sass or []:
            if k.get("local_bytes", 0) > 0:
                out.append(Finding(self.name, "spills", f"{k['name'][:60]}: {k['local_bytes']} bytes of local memory "
                                   f"per thread (register spills), {k.get('registers')} registers", 0.3, k))
            narrow = k.get("narrow_global_loads", 0)
            if narrow and narrow > k.get("wide_global_loads", 0):
                out.append(Finding(self.name, "narrow-loads", f"{k['name'][:60]}: {narrow} global loads narrower than "
                                   "128 bits outnumber the wide ones", 0.2, k))
        return out


def _num(row: dict[str, Any], key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) else None


class DegenerateAnalyzer:
    name = "degenerate"

    def analyze(self, ev: Evidence) -> list[Finding]:
        d = ev.degeneracy
        if d is None or not d.degenerate:
            return []
        return [Finding(self.name, "degenerate", "degenerate task: " + "; ".join(d.reasons) +
                        " (left out of geomeans)", 0.0, {"reasons": list(d.reasons)})]


BUILTIN_ANALYZERS: tuple[type, ...] = (RooflineAnalyzer, LaunchAnalyzer, OperatorMixAnalyzer, GraphPatternAnalyzer,
                                       PrecisionAnalyzer,
                                       NcuAnalyzer, SassAnalyzer, DegenerateAnalyzer)


def discover_analyzers(plugins: bool = True) -> list[Analyzer]:
    found: list[Analyzer] = [cls() for cls in BUILTIN_ANALYZERS]
    if plugins:
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
                obj = obj() if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Analyzer)) else obj
            except Exception as exc:
                found.append(_Broken(ep.name, f"{type(exc).__name__}: {exc}"))
                continue
            if isinstance(obj, Analyzer):
                found.append(obj)
    return found


class _Broken:
    def __init__(self, name: str, why: str) -> None:
        self.name, self.why = name, why

    def analyze(self, ev: Evidence) -> list[Finding]:
        return [Finding(self.name, "analyzer-error", f"analyzer {self.name} did not load: {self.why}", 0.0)]


def analyze(evidence: Evidence, analyzers: Iterable[Analyzer]) -> list[Finding]:
    out: list[Finding] = []
    for a in analyzers:
        try:
            out.extend(a.analyze(evidence))
        except Exception as exc:
            out.append(Finding(a.name, "analyzer-error", f"analyzer {a.name} failed: {type(exc).__name__}: {exc}", 0.0))
    return out
