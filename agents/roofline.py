"""Roofline: the device's measured ceilings, the speed-of-light time of a task, and the fraction reached.

`measure_ceilings()` measures, on the current CUDA device: the copy bandwidth (a 1 GiB device-to-device
copy, read + write bytes over time), and the dense matmul rate per dtype (8192^3 `torch.mm` on random
data: fp32 with TF32 off (`highest`), fp32 with TF32 (`high`), fp16, bf16), each the median of timed runs
after warm-up (CUDA events, a synchronize before the end event). `load_or_measure(cache_dir)` keeps the
result in a dated JSON file `ceilings-<device>-<YYYY-MM-DD>.json` and reuses one younger than `max_age_days`.

Speed of light of a task under a precision policy (`speed_of_light(spec, ceilings, policy)`): the larger of
- compute: its matmul FLOPs (GEMMs and convolutions) at the measured matmul rate of the fastest precision
  the policy admits for the task's dtype (`matmul_precision`): fp32 under `strict` at the faster of the
  TF32-off rate and the bf16 rate over `SPLIT_PRODUCTS` (the `strict` policy does not admit TF32, but an fp32
  product split into bf16 parts, six tensor-core products with an IEEE fp32 product's error, is how the
  templates compute fp32 GEMMs under it: `templates.tensorcore`), fp32 under `tf32` at the TF32 tensor-core rate (`bf16`,
  `fp16`: at theirs), plus its other FLOPs (pointwise, transcendental, reductions) at the fp32 TF32-off
  matmul rate, a stand-in for the CUDA cores' FMA rate that is an optimistic bound for them (special
  functions run slower). A ceilings file without a measured TF32 rate bounds TF32 by the device's datasheet
  dense peak where `DATASHEET_TF32` knows it (the H200's 494 TFLOP/s; the measured 8192^3 rate there was
  376, 2026-12-03), else by the fp32 rate (and says so: `Ceilings.matmul_rate`);
- memory: its minimum bytes (`TaskSpec.min_bytes`) at the measured copy bandwidth.

`assess(spec, ceilings, seconds, speedup, baseline_seconds=...)` gives the fraction of speed of light
reached (speed-of-light time / measured time, 1.0 = at the roof) and flags a result faster than speed of
light, or more than `SUSPICIOUS_SPEEDUP` times faster than its baseline unless the roofline explains it
(`explain_speedup`): the candidate is not faster than light, and the baseline runs so far below speed of
light that the two fractions allow the ratio (within `EXPLAINED_MARGIN`). A large win over a slow eager
baseline is common and real (measured on the H200: LayerNorm over three dims, eager at 2% of SOL, a Triton
kernel at 55%: 30x); a large win that no roofline explains is usually a bug. A flagged result is not
accepted until explained; an explained one carries its explanation (`RooflinePoint.explanations`).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CEILINGS_SCHEMA = "kstrata.ceilings/1"
#: A speedup above this over the baseline is flagged (KernelBench-era lesson: such results are usually bugs).
SUSPICIOUS_SPEEDUP = 10.0
#: Measured faster than speed of light by more than this fraction (timer resolution) is flagged.
SOL_MARGIN = 0.02
#: A speedup above SUSPICIOUS_SPEEDUP is explained when it is at most the ratio of the candidate's and the
#: baseline's SOL fractions times (1 + this): the two fractions may come from different measurements
#: (the optimizer's baselines are timed before the candidate's interleaved rounds), so a baseline that
#: measured slower this time than when it was placed on the roofline does not inflate the ratio unseen.
EXPLAINED_MARGIN = 0.10
MATMUL_DTYPES = ("float32", "tf32", "float16", "bfloat16")
#: Tensor-core products of bf16 parts an fp32 product takes when split (`templates.tensorcore.SPLIT_FP32`,
#: bf16x6): the strict fp32 matmul ceiling is at least the bf16 rate over this.
SPLIT_PRODUCTS = 6
#: The lower precision a policy (`kstrata.agents.optimize.candidate.POLICIES`) admits for fp32 matmuls and
#: convolutions; `strict` (and any other) admits none.
POLICY_MATMUL = {"tf32": "tf32", "bf16": "bfloat16", "fp16": "float16"}
#: Dense TF32 tensor-core peaks from the vendor's datasheets (FLOP/s, without sparsity), by device name: the
#: bound where a ceilings file has no measured TF32 rate.
DATASHEET_TF32 = {"NVIDIA H200": 494e12}
#: Datasheet peak memory bandwidth (bytes/s) by a part of the device's name: a bound no kernel may beat (the
#: engine's output-write bound flags a timing faster than it); the roofline's own figure is the measured copy
#: bandwidth (`Ceilings.copy_bytes_per_s`), which a kernel can approach.
DATASHEET_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "MI300": 5.3e12, "B200": 8.0e12}


def datasheet_bandwidth(device_name: str) -> float:
    """`DATASHEET_BANDWIDTH` of the device; an unknown device gets the table's highest, which makes a bound
    from it lower and so flags less, never more."""
    return next((bw for key, bw in DATASHEET_BANDWIDTH.items() if key in device_name),
                max(DATASHEET_BANDWIDTH.values()))


@dataclass(frozen=True)
class Ceilings:
    """What the device can do, measured: bytes per second of a copy, FLOP per second of a matmul per dtype."""

    device: str
    date: str
    copy_bytes_per_s: float
    matmul_flops_per_s: dict[str, float]
    versions: dict[str, str] = field(default_factory=dict)
    method: str = ("copy: 1 GiB device-to-device, (read+write) bytes / median time; matmul: 8192^3 torch.mm on "
                   "random data, 2*n^3 / median time; CUDA events, synchronize before the end event")
    schema: str = CEILINGS_SCHEMA

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Ceilings:
        if data.get("schema") != CEILINGS_SCHEMA:
            raise ValueError(f"ceilings schema {data.get('schema')!r} is not {CEILINGS_SCHEMA!r}")
        return cls(**data)

    def matmul_rate(self, dtype: str, policy: str = "strict") -> float:
        """The matmul rate for a task dtype under a policy (`matmul_precision`): measured where this file has
        it (fp32's at least the bf16 rate over `SPLIT_PRODUCTS`), a TF32 rate missing from it the datasheet's
        (`DATASHEET_TF32`), anything else at fp32's."""
        precision = matmul_precision(dtype, policy)
        if precision == "float32" and "bfloat16" in self.matmul_flops_per_s:
            return max(self.matmul_flops_per_s["float32"], self.matmul_flops_per_s["bfloat16"] / SPLIT_PRODUCTS)
        if precision in self.matmul_flops_per_s:
            return self.matmul_flops_per_s[precision]
        if precision == "tf32" and self.device in DATASHEET_TF32:
            return DATASHEET_TF32[self.device]
        return self.matmul_flops_per_s["float32"]


def matmul_precision(dtype: str, policy: str = "strict") -> str:
    """The precision fp32 (or `dtype`'s own) matmuls may run at under `policy`: "float32" is TF32 off."""
    lower = POLICY_MATMUL.get(policy)
    return lower if dtype == "float32" and lower is not None else dtype


def _median_ms(fn: Any, runs: int, warmup: int = 3) -> float:
    """The project's GPU timer (`backends/timing.py`) in milliseconds; no L2 flush: the copy is 1 GiB and
    the matmuls read their operands many times, so what the L2 holds does not change the ceiling."""
    from kstrata.backends.timing import time_gpu

    return time_gpu(fn, runs=runs, warmup=warmup, flush_l2_bytes=0).median_us / 1000.0


def measure_ceilings(matmul_n: int = 8192, copy_bytes: int = 1 << 30) -> Ceilings:
    """Measure copy bandwidth and matmul rates on the current CUDA device (a few seconds)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("measuring ceilings needs a CUDA GPU")
    src = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda")
    src.fill_(1)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda dst=dst, src=src: dst.copy_(src), runs=20)
    copy_bw = 2 * copy_bytes / (ms * 1e-3)
    del src, dst
    rates: dict[str, float] = {}
    saved = torch.get_float32_matmul_precision()
    try:
        for name in MATMUL_DTYPES:
            dtype = {"float32": torch.float32, "tf32": torch.float32, "float16": torch.float16,
                     "bfloat16": torch.bfloat16}[name]
            torch.set_float32_matmul_precision("high" if name == "tf32" else "highest")
            a = torch.randn(matmul_n, matmul_n, device="cuda", dtype=dtype)
            b = torch.randn(matmul_n, matmul_n, device="cuda", dtype=dtype)
            c = torch.empty(matmul_n, matmul_n, device="cuda", dtype=dtype)
            ms = _median_ms(lambda a=a, b=b, c=c: torch.mm(a, b, out=c), runs=10)
            rates[name] = 2 * matmul_n**3 / (ms * 1e-3)
            del a, b, c
    finally:
        torch.set_float32_matmul_precision(saved)
    versions = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
    return Ceilings(device=torch.cuda.get_device_name(), date=_dt.date.today().isoformat(), copy_bytes_per_s=copy_bw,
                    matmul_flops_per_s=rates, versions=versions)


def _slug(device: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")


#: Where the CLIs keep the measured ceilings unless told otherwise.
DEFAULT_CEILINGS_DIR = Path.home() / ".cache" / "kstrata"


def copy_bandwidth(cache_dir: str | Path) -> tuple[float | None, str]:
    """The measured copy bandwidth (`load_or_measure`'s ceilings, cached under `cache_dir`) and where it came
    from; None and why when the ceilings could not be measured (a figure built on it is then left out)."""
    try:
        ceilings, path = load_or_measure(cache_dir)
    except Exception as exc:  # the caller goes on without the figure, and says why
        return None, f"no bandwidth: measuring the roofline's ceilings failed: {type(exc).__name__}: {exc}"
    return ceilings.copy_bytes_per_s, f"the roofline's measured copy bandwidth, {path.name}"


def load_or_measure(cache_dir: str | Path, max_age_days: int = 30) -> tuple[Ceilings, Path]:
    """The newest cached ceilings of this device younger than `max_age_days`, else measure and cache them."""
    import torch

    cache = Path(cache_dir)
    device = torch.cuda.get_device_name()
    today = _dt.date.today()
    candidates = sorted(cache.glob(f"ceilings-{_slug(device)}-*.json"), reverse=True) if cache.is_dir() else []
    for path in candidates:
        try:
            c = Ceilings.from_json(json.loads(path.read_text()))
        except (ValueError, TypeError, KeyError, json.JSONDecodeError):
            continue
        if (today - _dt.date.fromisoformat(c.date)).days <= max_age_days:
            return c, path
    c = measure_ceilings()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"ceilings-{_slug(device)}-{c.date}.json"
    path.write_text(json.dumps(c.to_json(), indent=2) + "\n")
    return c, path


@dataclass(frozen=True)
class RooflinePoint:
    """One measured time against the roofline: speed of light, which roof bounds it, the fraction reached."""

    seconds: float
    sol_seconds: float
    compute_seconds: float
    memory_seconds: float
    bound: str  # "compute" or "memory"
    fraction: float  # sol_seconds / seconds: 1.0 is at the roof
    achieved_flops_per_s: float
    achieved_bytes_per_s: float
    flags: tuple[str, ...] = ()
    #: Why a speedup above SUSPICIOUS_SPEEDUP was accepted ("eager at 2% of SOL, candidate at 55%: ...").
    explanations: tuple[str, ...] = ()
    baseline_fraction: float | None = None  # the baseline's fraction of SOL, when its time was given

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["flags"] = list(self.flags)
        d["explanations"] = list(self.explanations)
        return d


def speed_of_light(spec: Any, ceilings: Ceilings, policy: str = "strict") -> tuple[float, float, float]:
    """(speed-of-light seconds, compute seconds, memory seconds) of one forward pass of a task under a
    precision policy (the module docstring: which matmul rate bounds it)."""
    by_kind = dict(spec.flops_by_kind)
    matmul = by_kind.get("matmul", 0) if spec.flops_source == "counted" else spec.flops
    other = max(0, spec.flops - matmul)
    dtype = spec.dtypes[0] if spec.dtypes else "float32"
    compute = matmul / ceilings.matmul_rate(dtype, policy) + other / ceilings.matmul_flops_per_s["float32"]
    memory = spec.min_bytes / ceilings.copy_bytes_per_s
    return max(compute, memory), compute, memory


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.1f}%" if fraction < 0.095 else f"{100 * fraction:.0f}%"


def explain_speedup(speedup: float, fraction: float, baseline_fraction: float | None, baseline: str = "the baseline",
                    margin: float = EXPLAINED_MARGIN) -> tuple[bool, str]:
    """Whether the roofline explains `speedup` of a candidate at `fraction` of SOL over a baseline at
    `baseline_fraction`: (True, the explanation) or (False, why not)."""
    if not fraction > 0 or baseline_fraction is None or not baseline_fraction > 0:
        return False, "no roofline of the task to explain it"
    if fraction > 1.0 + SOL_MARGIN:
        return False, f"the candidate is faster than speed of light ({_pct(fraction)} of SOL)"
    allowed = fraction / baseline_fraction
    where = f"{baseline} at {_pct(baseline_fraction)} of SOL, candidate at {_pct(fraction)}"
    if speedup > allowed * (1.0 + margin):
        return False, (f"more than the roofline explains ({where}: at most {allowed:.1f}x, "
                       f"{100 * margin:.0f}% noise margin)")
    return True, f"{speedup:.1f}x explained by the roofline: {where}"


def assess(spec: Any, ceilings: Ceilings, seconds: float, speedup: float | None = None, *,
           baseline_seconds: float | None = None, baseline: str = "the baseline", policy: str = "strict") -> RooflinePoint:
    """Place a time measured under precision `policy` on that policy's roofline (`speed_of_light`) and flag
    what cannot be true without an explanation.

    `baseline_seconds`: the time of the baseline `speedup` is over (named `baseline` in the explanation);
    without it, or without a speed of light for the task, a speedup above SUSPICIOUS_SPEEDUP stays flagged."""
    sol, compute, memory = speed_of_light(spec, ceilings, policy)
    fraction = sol / seconds if seconds > 0 else float("inf")
    base_fraction = sol / baseline_seconds if baseline_seconds and baseline_seconds > 0 and sol > 0 else None
    flags = []
    explanations = []
    if fraction > 1.0 + SOL_MARGIN:
        flags.append(f"faster than speed of light ({fraction:.2f}x the roofline bound of {sol * 1e6:.1f} us)")
    if speedup is not None and speedup > SUSPICIOUS_SPEEDUP:
        explained, why = explain_speedup(speedup, fraction if sol > 0 else 0.0, base_fraction, baseline)
        if explained:
            explanations.append(why)
        else:
            flags.append(f"speedup {speedup:.1f}x is above {SUSPICIOUS_SPEEDUP:g}x and {why}")
    return RooflinePoint(seconds=seconds, sol_seconds=sol, compute_seconds=compute, memory_seconds=memory,
                         bound="compute" if compute >= memory else "memory", fraction=fraction,
                         achieved_flops_per_s=spec.flops / seconds if seconds > 0 else 0.0,
                         achieved_bytes_per_s=spec.min_bytes / seconds if seconds > 0 else 0.0, flags=tuple(flags),
                         explanations=tuple(explanations), baseline_fraction=base_fraction)
