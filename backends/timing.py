"""The one GPU timer of the project, and the one `Timing` it returns.

`time_gpu(fn)`: warm-up, then per run an L2 flush (a write of a buffer larger than the L2), a start
event, `fn`, a device-wide synchronize, an end event; the median with p10/p90 and the minimum, in
microseconds. Optionally the call is captured once as a CUDA graph and replayed.

Two spans (`span`): `"call"` (the default) is the above: the end event is recorded after the host has seen
the call finish, so the time includes the host's side of the call (its launches, its synchronize) — the
right figure for a model, whose host overhead is part of its cost (a CUDA graph wins exactly there).
`"device"` records the end event right after `fn` returns, before any synchronize: the device's time from
the start event to the call's last kernel. With the flush on, the host enqueues the call while the device
is still writing the flush buffer, so a launch's host cost stays off the clock. That is the figure for one
kernel replayed on its launch record (the compiled-kernel search, `replay`, the pass twins). Measured on the
H200 (`tools/timer_probe.py`, testsuite/results/timer-probe-gpu-2026-12-04.md): for one Triton silu launch
the call span read 18-25 us above torch.profiler's kernel duration (79.6 vs 60.2 us, 57.9 vs 32.9 us,
19.9 vs 1.7 us) and the device span within 3 us of it (57.9, 35.7, 4.7 us). Without the flush, both spans
read the host's launch too (the device waits for it): 103.3 / 82.1 us on the first kernel.

`interleaved_ab(fn_a, fn_b)`: A/B rounds against an incumbent in alternating order (ABBA…, so clock and
thermal drift fall on both alike), each round `time_gpu`; stops early when B is clearly slower than the
best time known (its fastest round slower than the best by more than `margin`), since no further round
could make it the winner. `ABResult` carries both sides' round medians, their spread and the speedup.

The timer reads the clock through a `CudaClock` (CUDA events, synchronize, current stream). The evaluator
passes references it saved before any candidate code ran, so a candidate that replaces
`torch.cuda.Event` or `torch.cuda.synchronize` does not change how it is timed; tests pass a CPU clock to
check the interleaving and the early stop without a GPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Timing:
    """Times in microseconds over `runs` timed runs (CUDA events, L2 flushed before each run)."""

    median_us: float
    p10_us: float
    p90_us: float
    min_us: float
    runs: int
    cuda_graph: bool = False
    #: What each run spanned (`SPANS`): the whole call, host side included, or the device's work.
    span: str = "call"

    @property
    def spread_pct(self) -> float:
        """p10 to p90 as a percentage of the median."""
        return 100.0 * (self.p90_us - self.p10_us) / self.median_us if self.median_us else 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timing:
        return cls(**data)

    @classmethod
    def of(cls, times_us: list[float], cuda_graph: bool = False, span: str = "call") -> Timing:
        times = sorted(times_us)
        if len(times) >= 2:
            q = statistics.quantiles(times, n=10)
            p10, p90 = q[0], q[-1]
        else:
            p10 = p90 = times[0]
        return cls(statistics.median(times), p10, p90, times[0], len(times), cuda_graph, span)


@dataclass(frozen=True)
class CudaClock:
    """How the timer reads time: an event factory (`Event(enable_timing=True)` with `record()`,
    `synchronize()` and `elapsed_time(other)` in ms), a device-wide synchronize and the current stream."""

    event: Callable[..., Any]
    synchronize: Callable[[], Any]
    current_stream: Callable[[], Any]
    #: Allocates the L2 flush buffer (`bytes -> object with .zero_()`); None: no flush.
    scratch: Callable[[int], Any] | None = None

    @staticmethod
    def cuda() -> CudaClock:
        import torch

        return CudaClock(torch.cuda.Event, torch.cuda.synchronize, torch.cuda.current_stream,
                         lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"))


#: Bytes written between runs to evict the L2 (larger than the L2 of any current GPU: H200 50 MB, MI300 256 MB).
L2_FLUSH_BYTES = 256 << 20


#: What a timed run spans (the module docstring): the whole call, host side included, or the device's work.
SPANS = ("call", "device")


def time_gpu(fn: Callable[[], Any], runs: int = 100, warmup: int = 10, flush_l2_bytes: int = L2_FLUSH_BYTES,
             cuda_graph: bool = False, clock: CudaClock | None = None, span: str = "call") -> Timing:
    """Time `fn` on the current CUDA stream (see the module docstring)."""
    if span not in SPANS:
        raise ValueError(f"span must be one of {', '.join(SPANS)}, not {span!r}")
    clock = clock or CudaClock.cuda()
    flush = clock.scratch(flush_l2_bytes) if clock.scratch is not None and flush_l2_bytes > 0 else None
    call = fn
    if cuda_graph:
        import torch

        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(clock.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        clock.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        call = graph.replay
    for _ in range(warmup):
        call()
    clock.synchronize()
    times = []
    for _ in range(runs):
        if flush is not None:
            flush.zero_()
        start = clock.event(enable_timing=True)
        end = clock.event(enable_timing=True)
        start.record()
        call()
        if span == "call":
            clock.synchronize()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)) * 1000.0)
    return Timing.of(times, cuda_graph, span)


@dataclass(frozen=True)
class ABResult:
    """Interleaved A/B rounds: each side's per-round medians (µs), in the order they ran."""

    a_us: list[float]
    b_us: list[float]
    runs_per_round: int
    order: list[str] = field(default_factory=list)
    #: Why the rounds stopped before `rounds` (B clearly slower than the best), or None.
    stopped_early: str | None = None
    #: What each timed run spanned (`SPANS`).
    span: str = "call"

    @property
    def rounds(self) -> int:
        return len(self.b_us)

    @property
    def median_a_us(self) -> float:
        return statistics.median(self.a_us)

    @property
    def median_b_us(self) -> float:
        return statistics.median(self.b_us)

    @property
    def speedup(self) -> float:
        """A's time over B's: above 1 when B (the candidate) is faster."""
        return self.median_a_us / self.median_b_us

    @property
    def speedup_range(self) -> tuple[float, float]:
        ratios = sorted(a / b for a, b in zip(self.a_us, self.b_us, strict=False))
        return ratios[0], ratios[-1]

    @staticmethod
    def _spread(values: list[float]) -> float:
        return 100.0 * (max(values) - min(values)) / statistics.median(values)

    @property
    def spread_a_pct(self) -> float:
        return self._spread(self.a_us)

    @property
    def spread_b_pct(self) -> float:
        return self._spread(self.b_us)

    def to_json(self) -> dict[str, Any]:
        lo, hi = self.speedup_range
        return {"time_before_us": self.median_a_us, "time_after_us": self.median_b_us, "speedup": self.speedup,
                "speedup_range": [lo, hi], "spread_before_pct": self.spread_a_pct,
                "spread_after_pct": self.spread_b_pct, "round_medians_us": [self.a_us, self.b_us],
                "rounds": self.rounds, "runs_per_round": self.runs_per_round, "order": "".join(self.order),
                "stopped_early": self.stopped_early, "span": self.span}


def interleaved_ab(fn_a: Callable[[], Any], fn_b: Callable[[], Any], rounds: int = 6, runs: int = 50, *,
                   best_us: float | None = None, margin: float = 0.10, min_rounds: int = 2,
                   warmup: int = 10, flush_l2_bytes: int = L2_FLUSH_BYTES, clock: CudaClock | None = None,
                   span: str = "call") -> ABResult:
    """`rounds` rounds of `time_gpu` on A (the incumbent) and B (the candidate) in ABBA order.

    After `min_rounds` rounds, stop when B's fastest round is slower than the best time known — `best_us`
    (the best candidate so far) or A's fastest round, whichever is lower — by more than `margin`."""
    a: list[float] = []
    b: list[float] = []
    order: list[str] = []
    stopped = None
    for r in range(rounds):
        for which in ("ab" if r % 2 == 0 else "ba"):
            fn, sink = (fn_a, a) if which == "a" else (fn_b, b)
            sink.append(time_gpu(fn, runs=runs, warmup=warmup, flush_l2_bytes=flush_l2_bytes, clock=clock,
                                 span=span).median_us)
            order.append(which.upper())
        if r + 1 >= min_rounds and r + 1 < rounds:
            best = min(x for x in (best_us, min(a)) if x is not None)
            if min(b) > best * (1.0 + margin):
                stopped = (f"after {r + 1} of {rounds} rounds: the candidate's fastest round ({min(b):.2f} us) is "
                           f"{min(b) / best:.2f}x the best ({best:.2f} us)")
                break
    return ABResult(a, b, runs, order, stopped, span)


def device_and_versions() -> dict[str, str]:
    """The current CUDA device and the versions every measurement carries."""
    import platform

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_properties(torch.cuda.current_device()).name
    return out
