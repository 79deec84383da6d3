"""Device time per call from torch.profiler: which kernels a program ran on the GPU, for how long each, and how
busy the device was while it ran.

`profile_calls(fn, calls, before=...)` runs `fn` under `torch.profiler` (CUDA activity only), one profiler
session per call, so each session holds one call's device events and nothing else; `before` (an L2 flush, say)
runs before each call outside the session, as the timer (`backends/timing.py`) runs its flush outside the timed
window. The first session is not counted: it is the one that starts CUPTI's tracing.

`device_profile(sessions)` turns the events of those sessions (the `FunctionEvent`s of `prof.events()`, one list
per call) into a `DeviceProfile`: per kernel name the device time and launches per call (a name launched several
times in a call sums), and per call the device-busy time (the union of the events' intervals: overlapping
kernels count once) and the span (first start to last end). It reads the events, not `key_averages()`, because
the busy time needs each event's interval, which the averages drop. Kept: kernels, memcpys and memsets
(activity types `kernel`, `gpu_memcpy`, `gpu_memset`); dropped: `gpu_user_annotation` (a `record_function` range,
such as Inductor's `CompiledFxGraph` call, projected onto the GPU timeline: counting it would count its kernels
twice) and synchronizations (`cuda_sync`, "Context Sync"). An event without an activity type (an older torch) is
kept unless it is a user annotation or a synchronization by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: Calls profiled per model by default (after one uncounted call).
PROFILE_CALLS = 5
#: Activity types (libkineto's names, compared in lower case: one release spells `gpu_user_Annotation`) of the
#: device events that are work on the device.
DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
#: Names of device events that are waits, not work (Inductor's own profiler-based timing drops these too).
SYNC_NAMES = frozenset({"Context Sync", "Stream Sync", "Event Sync"})


@dataclass(frozen=True)
class KernelTime:
    """One kernel name's device time and launches, per call."""

    name: str
    us_per_call: float
    launches_per_call: float


@dataclass(frozen=True)
class DeviceProfile:
    """Device time per call over `calls` profiled calls; `reason` says why there are no figures."""

    calls: int
    kernels: tuple[KernelTime, ...] = ()
    busy_us: float | None = None
    span_us: float | None = None
    reason: str | None = None

    def by_name(self) -> dict[str, KernelTime]:
        return {k.name: k for k in self.kernels}

    def to_json(self) -> dict[str, Any]:
        return {"calls": self.calls, "busy_us": self.busy_us, "span_us": self.span_us, "reason": self.reason,
                "kernels": [{"name": k.name, "us_per_call": k.us_per_call, "launches_per_call": k.launches_per_call}
                            for k in self.kernels]}


def _is_device_event(e: Any) -> bool:
    return getattr(getattr(e, "device_type", None), "name", None) == "CUDA"


def is_device_work(e: Any) -> bool:
    """A CUDA event that is work on the device (a kernel, memcpy or memset), not an annotation or a wait."""
    activity = getattr(e, "activity_type", None)
    if activity:
        return str(activity).lower() in DEVICE_WORK
    return not getattr(e, "is_user_annotation", False) and e.name not in SYNC_NAMES


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def device_profile(sessions: Sequence[Iterable[Any]], calls: int | None = None) -> DeviceProfile:
    """Per-call device figures from profiler events, one iterable of events per call (module docstring), or
    per `calls` calls in all when the sessions hold several calls each (busy time and span are then per call
    on average, gaps between the calls of one session counted in the span)."""
    calls = calls or len(sessions)
    if not calls:
        return DeviceProfile(0, reason="no call was profiled")
    time_us: dict[str, float] = {}
    launches: dict[str, int] = {}
    dropped: dict[str, int] = {}
    busy = span = 0.0
    seen_device = 0
    for events in sessions:
        intervals = []
        for e in events:
            if not _is_device_event(e):
                continue
            seen_device += 1
            if not is_device_work(e):
                kind = str(getattr(e, "activity_type", None) or e.name)
                dropped[kind] = dropped.get(kind, 0) + 1
                continue
            start, end = float(e.time_range.start), float(e.time_range.end)
            intervals.append((start, end))
            time_us[e.name] = time_us.get(e.name, 0.0) + (end - start)
            launches[e.name] = launches.get(e.name, 0) + 1
        if intervals:
            busy += _union_us(intervals)
            span += max(e for _, e in intervals) - min(s for s, _ in intervals)
    if not time_us:
        why = (f"the profiler gave {seen_device} CUDA events in {calls} calls, none a kernel, memcpy or memset "
               f"({', '.join(f'{k} x {n}' for k, n in sorted(dropped.items()))})" if seen_device else
               f"the profiler gave no CUDA events in {calls} calls (CUPTI unavailable, or the calls ran nothing on "
               "the GPU)")
        return DeviceProfile(calls, reason=why)
    kernels = sorted((KernelTime(n, t / calls, launches[n] / calls) for n, t in time_us.items()),
                     key=lambda k: (-k.us_per_call, k.name))
    return DeviceProfile(calls, tuple(kernels), busy / calls, span / calls)


def profile_calls(fn: Callable[[], Any], calls: int = PROFILE_CALLS,
                  before: Callable[[], Any] | None = None) -> DeviceProfile:
    """Profile `calls` calls of `fn` on the current CUDA device (module docstring); raises what the profiler
    raises."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sessions = []
    for i in range(calls + 1):
        if before is not None:
            before()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        if i:  # the first session starts CUPTI's tracing: not counted
            sessions.append(list(prof.events()))
    return device_profile(sessions)
