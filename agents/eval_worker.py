"""One side of an evaluation, in its own process: the reference, or the candidate under watch.

Run by `kstrata.agents.evaluate.run_worker` as `python -m kstrata.agents.eval_worker --role ROLE ...`;
not a public interface. The worker writes `report.json` (checks, timing, errors) and one
`trial{i}.pt` per trial (the outputs, on the CPU) into `--workdir`. The parent judges the values.

The references to the timer and the synchronization functions are taken when this module is imported,
before anything imports the candidate (see `evaluate`'s docstring for every check made here).
"""

from __future__ import annotations

import threading
import time

import torch

# Taken first: the candidate is imported only later, so these are the real objects.
_REAL: dict[str, object] = {
    "time.perf_counter": time.perf_counter,
    "time.time": time.time,
    "torch.cuda.Event": torch.cuda.Event,
    "torch.cuda.Event.record": torch.cuda.Event.record,
    "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
    "torch.cuda.Event.synchronize": torch.cuda.Event.synchronize,
    "torch.cuda.synchronize": torch.cuda.synchronize,
    "torch.cuda.current_stream": torch.cuda.current_stream,
    "torch.cuda.Stream.synchronize": torch.cuda.Stream.synchronize,
    "torch.Tensor.clone": torch.Tensor.clone,
    "torch.Tensor.copy_": torch.Tensor.copy_,
    "torch.Tensor.zero_": torch.Tensor.zero_,
    "torch.Tensor.fill_": torch.Tensor.fill_,
    "torch.equal": torch.equal,
    "torch.save": torch.save,
}
_perf_counter = time.perf_counter
_Event = torch.cuda.Event
_synchronize = torch.cuda.synchronize
_current_stream = torch.cuda.current_stream
_clone = torch.Tensor.clone
_copy = torch.Tensor.copy_
_equal = torch.equal
import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from torch.utils._pytree import tree_flatten  # noqa: E402

from kstrata.agents.evaluate import DISTRIBUTIONS  # noqa: E402
from kstrata.agents.tasks import import_task_module  # noqa: E402
from kstrata.agents.trial_io import save_trial as _save_trial  # noqa: E402  (bound before any candidate runs)
from kstrata.backends.timing import CudaClock, time_gpu  # noqa: E402

#: Bytes of the poisoned block (at least; more when the inputs are larger).
POISON_BYTES = 256 << 20


def _attr(path: str) -> object:
    obj: Any = {"time": time, "torch": torch}[path.split(".")[0]]
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def timer_tampering() -> list[str]:
    """The names among the saved references that no longer point at the saved objects."""
    changed = []
    for name, real in _REAL.items():
        try:
            now = _attr(name)
        except AttributeError:
            changed.append(name)
            continue
        if now is not real:
            changed.append(name)
    return changed


# ---------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------
def trial_seed(seed: int, trial: int) -> int:
    return seed if trial == 0 else (seed * 1_000_003 + trial * 7919) % (2**31 - 1)


def make_inputs(module: Any, trial: int, seed: int, device: str) -> list[Any]:
    """The task's `get_inputs()` under the trial's seed, on `device`, with the trial's distribution applied."""
    s = trial_seed(seed, trial)
    torch.manual_seed(s)
    with torch.device(device):
        inputs = list(module.get_inputs())
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    dist = DISTRIBUTIONS[trial % len(DISTRIBUTIONS)]
    if dist == "task":
        return inputs
    gen = torch.Generator(device=device).manual_seed(s + 1)
    return [reshape_values(x, dist, gen) if isinstance(x, torch.Tensor) and x.dtype.is_floating_point else x
            for x in inputs]


#: Elements per step of `reshape_values`: its temporaries stay at a few hundred MiB however large the input
#: (at published sizes whole-tensor temporaries came to about 24 GiB per input and ran the H200 out of
#: memory with three processes on it).
RESHAPE_CHUNK = 1 << 25


def _finite_stats(flat: torch.Tensor) -> tuple[float, float, bool, int]:
    """Mean, standard deviation (n - 1), whether all are >= 0, and the count of the finite values of
    `flat`, chunk by chunk in float64 (chunk means and squared deviations merged exactly as in Chan's
    pairwise update)."""
    n, mean, m2, lo = 0, 0.0, 0.0, math.inf
    for c in torch.split(flat, RESHAPE_CHUNK):
        fin = c.isfinite()
        k = int(fin.sum())
        if not k:
            continue
        c64 = torch.where(fin, c, 0).double()
        cm = float(c64.sum()) / k
        cm2 = float(torch.where(fin, (c64 - cm) ** 2, 0.0).sum())
        lo = min(lo, float(torch.where(fin, c64, math.inf).min()))
        d, tot = cm - mean, n + k
        mean += d * k / tot
        m2 += cm2 + d * d * n * k / tot
        n = tot
    std = math.sqrt(m2 / (n - 1)) if n > 1 else 1.0
    return mean, std, n > 0 and lo >= 0.0, n


def reshape_values(x: torch.Tensor, dist: str, gen: torch.Generator) -> torch.Tensor:
    """New values for `x` of another distribution, keeping its shape, dtype, layout, location, scale and
    sign domain; computed in chunks of `RESHAPE_CHUNK` elements (the draws depend only on the generator's
    state and the element count, so every process gets the same values)."""
    if dist not in ("shifted-scaled", "uniform-offset", "heavy-tailed", "zeros-negatives"):
        raise ValueError(f"unknown distribution {dist!r}")
    src = x.detach()
    dense = src.contiguous()
    flat = dense.reshape(-1)
    m, s, nonneg, count = _finite_stats(flat)
    if not count:
        m, s, nonneg = 0.0, 1.0, False
    if not math.isfinite(s) or s == 0.0:
        s = max(abs(m), 1.0)
    dev = x.device
    out = torch.empty(flat.shape, dtype=x.dtype, device=dev)
    for lo in range(0, flat.numel(), RESHAPE_CHUNK):
        xc = flat[lo:lo + RESHAPE_CHUNK].float()
        n = xc.numel()
        if dist == "zeros-negatives":
            u = torch.rand(n, generator=gen, device=dev)
            y = xc.clone()
            if not nonneg:
                y = torch.where(u < 0.35, -y, y)
            y = torch.where((u >= 0.35) & (u < 0.55), torch.zeros_like(y), y)
            y = torch.where((u >= 0.55) & (u < 0.60), torch.full_like(y, -0.0), y)
        else:
            z = torch.randn(n, generator=gen, device=dev)
            if dist == "shifted-scaled":
                y = m + s * (1.5 * z + 1.0)
            elif dist == "uniform-offset":
                y = m + s * (4.0 * torch.rand(n, generator=gen, device=dev) - 1.0)  # uniform on [m - s, m + 3s]
            else:  # heavy-tailed: a normal over a shifted half-normal (Cauchy-like tails), by IEEE division only
                # (a vectorized exp is not bitwise the same in every process: `z * exp(0.75 w)` differed in the
                # first thread's half of a 192 x 192 input between the reference's and the candidate's processes
                # in about one evaluation in four on the 2-core CPU machine, 2026-12-07, failing `same-inputs`)
                w = torch.randn(n, generator=gen, device=dev)
                y = m + s * (z / (0.25 + w.abs())).clamp(-16.0, 16.0)
            if nonneg:
                y = y.abs()
        out[lo:lo + n] = y.to(x.dtype)
    if src.is_contiguous():
        return out.view(x.shape)
    shaped = torch.empty_like(src)  # the input's own layout (a transposed input stays transposed)
    shaped.copy_(out.view(x.shape))
    return shaped


#: A GPU tensor of at least this many bytes is hashed on the device (`device_hash`): sha256 on the host
#: (with the copy out of the tensor) took 2.4 s per GiB on the 2-core development machine, about 14 s for
#: one 6.4 GB input of a published-size task, twice per trial.
DEVICE_HASH_BYTES = 1 << 26
_HASH_PRIME = (1 << 31) - 1
_HASH_CHUNK = 1 << 24  # words per step: int64 temporaries of 128 MiB each


def device_hash(t: torch.Tensor) -> str:
    """A 62-bit content hash computed where the tensor is, in exact integer arithmetic (the same value on
    every device and in every process): the bytes as 32-bit words w_i, h = sum(w_i * c_i) mod (2^31 - 1)
    for two index-derived coefficient sequences c_i. A consistency check between our own processes (both
    sides saw the same inputs, a candidate left its inputs alone), not a cryptographic one."""
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-flat.numel()) % 4
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    words = flat.view(torch.int32)
    sums = [0, 0]
    for lo in range(0, words.numel(), _HASH_CHUNK):
        w = words[lo:lo + _HASH_CHUNK].to(torch.int64) & 0xFFFFFFFF  # unsigned, < 2^32
        w = w % _HASH_PRIME  # < 2^31
        idx = torch.arange(lo, lo + w.numel(), device=w.device, dtype=torch.int64)
        for lane, (a, b) in enumerate(((0x9E3779B1, 0x7F4A7C15), (0x85EBCA77, 0x165667B1))):
            c = (idx * a + b) % _HASH_PRIME + 1  # < 2^31; products below 2^62
            sums[lane] = (sums[lane] + int(((w * c) % _HASH_PRIME).sum())) % _HASH_PRIME  # a chunk's sum < 2^55
    return f"dev:{sums[0]:08x}{sums[1]:08x}"


def digest(values: list[Any]) -> str:
    """sha256 over every tensor's bytes (and the repr of other values), in order; a large GPU tensor
    contributes its `device_hash` instead of its bytes."""
    h = hashlib.sha256()
    for v in values:
        if isinstance(v, torch.Tensor):
            t = v.detach().contiguous()
            h.update(str((tuple(t.shape), t.dtype)).encode())
            if t.is_cuda and t.numel() * t.element_size() >= DEVICE_HASH_BYTES:
                h.update(device_hash(t).encode())
            else:
                h.update(t.reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


def _flat_outputs(out: Any) -> list[Any]:
    leaves, _ = tree_flatten(out)
    return list(leaves)


# ---------------------------------------------------------------------------------------------------
# Allocator poisoning and storage checks
# ---------------------------------------------------------------------------------------------------
def poison_allocator(device: str, nbytes: int) -> None:
    """Leave only 0xFF-filled free blocks in the caching allocator (NaN in fp32/fp16/bf16)."""
    if device != "cuda":
        return
    _synchronize()
    torch.cuda.empty_cache()
    big = torch.empty(nbytes, dtype=torch.uint8, device=device)
    big.fill_(0xFF)
    small = [torch.empty(1 << 19, dtype=torch.uint8, device=device) for _ in range(8)]
    for t in small:
        t.fill_(0xFF)
    _synchronize()
    del big, small


#: The share of the device's memory that earlier trials' outputs may keep (see run_candidate).
KEEP_FRACTION = 0.125


def _keep_limit(device: str) -> int:
    forced = os.environ.get("KSTRATA_KEEP_OUTPUT_BYTES")  # tests: the published-size behaviour on small tensors
    if forced is not None:
        return int(forced)
    if device != "cuda":
        return 1 << 62  # host memory: the outputs are freed with the process; keep them all, as before
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory * KEEP_FRACTION)


def _poison_cap(device: str, nbytes: int) -> int:
    """The poison's size, at most a third of the device's free memory: the poison makes an output that
    reuses freed memory hold NaN; it must not itself be what runs the device out of memory."""
    if device != "cuda":
        return nbytes
    free, _ = torch.cuda.mem_get_info()
    return max(POISON_BYTES, min(nbytes, free // 3))


def _span(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.data_ptr() + st.nbytes()


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[0] != a[1] and b[0] != b[1]


def _same_bits(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(_equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)))
    return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _thread_origin(t: threading.Thread) -> str:
    target = getattr(t, "_target", None)
    fn = target if target is not None else type(t).run
    code = getattr(fn, "__code__", None)
    return code.co_filename if code is not None else ""


# ---------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------
def time_cuda(fn: Callable[[], Any], runs: int, warmup: int = 10, cuda_graph: bool = False,
              flush_bytes: int = 256 << 20) -> dict[str, Any]:
    """The project's GPU timer (`backends/timing.py`), reading the clock through the references saved at
    import: per run an L2 flush, a start event, the call, a device-wide synchronize, an end event."""
    clock = CudaClock(_Event, _synchronize, _current_stream,
                      lambda n: torch.empty(n, dtype=torch.uint8, device="cuda"))
    return time_gpu(fn, runs=runs, warmup=warmup, flush_l2_bytes=flush_bytes, cuda_graph=cuda_graph,
                    clock=clock).to_json()


# ---------------------------------------------------------------------------------------------------
# The two roles
# ---------------------------------------------------------------------------------------------------
def precision_settings() -> dict[str, Any]:
    """PyTorch's precision switches as this process runs with them (reported for every role)."""
    m = torch.backends.cuda.matmul
    return {"matmul_allow_tf32": bool(m.allow_tf32), "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "matmul_fp16_reduced_precision_reduction": bool(m.allow_fp16_reduced_precision_reduction),
            "matmul_bf16_reduced_precision_reduction": bool(m.allow_bf16_reduced_precision_reduction)}


def memory_peaks(device: str) -> dict[str, int]:
    """This process's peak host memory (resident) and peak GPU memory allocated by torch, in bytes."""
    import resource

    peaks = {"peak_host_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
    if device == "cuda":
        peaks["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated())
    return peaks


def _progress(role: str, done: int, total: int, started: float, phases: dict[str, float] | None = None) -> None:
    """A line the parent reads from the log while it waits: trials done, the seconds so far, and where
    the last trial's time went (`name=seconds,...`: at published sizes a trial takes tens of seconds)."""
    tail = ""
    if phases:
        tail = " " + ",".join(f"{k}={v:.2f}" for k, v in phases.items())
    print(f"PROGRESS {role} {done}/{total} {time.perf_counter() - started:.3f}{tail}", flush=True)


class _Phases:
    """Seconds per phase of one trial (the device synchronized at each mark, so a phase owns its GPU work)."""

    def __init__(self, device: str) -> None:
        self.device, self._t = device, time.perf_counter()
        self.times: dict[str, float] = {}

    def mark(self, name: str) -> None:
        if self.device == "cuda":
            _synchronize()
        now = time.perf_counter()
        self.times[name] = self.times.get(name, 0.0) + now - self._t
        self._t = now


def _release_cached(device: str) -> None:
    """Return the caching allocator's free blocks to the driver between trials: three processes share the
    GPU in lockstep, and at published sizes (6 GiB per tensor) blocks cached by one of them are memory the
    others cannot get (measured on the H200: 38 -> 135 GB over three trials before this, then an OOM)."""
    if device == "cuda":
        _synchronize()
        torch.cuda.empty_cache()


def _step(args: argparse.Namespace, what: str) -> None:
    """In lockstep mode, wait for the parent's go before `what` (a trial or the timing)."""
    if getattr(args, "lockstep", False):
        print(f"READY {what}", flush=True)
        line = sys.stdin.readline()
        if not line.startswith("go"):
            raise RuntimeError(f"the evaluator stopped the run before {what}")


def _versions() -> dict[str, str]:
    v = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        v["triton"] = triton.__version__
    except Exception:
        pass
    if torch.version.cuda:
        v["cuda"] = str(torch.version.cuda)
    return v


def _build(model_class: Any, module: Any, seed: int, device: str) -> tuple[Any, list[Any]]:
    # KernelBench's protocol: seed, init inputs and model on the CPU, then move to the device.
    torch.manual_seed(seed)
    init = list(module.get_init_inputs())
    torch.manual_seed(seed)
    model = model_class(*init)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
        model.eval()
    return model, init


def _to_double(model: Any, inputs: list[Any]) -> tuple[Any, list[Any]]:
    import copy

    m64 = copy.deepcopy(model).double()
    ins = [x.double() if isinstance(x, torch.Tensor) and x.dtype.is_floating_point else x for x in inputs]
    return m64, ins


def _tf32_round(t: torch.Tensor) -> torch.Tensor:
    """`t` with its float32 value rounded to TF32 (10 mantissa bits, to nearest, ties away from zero: PTX's
    `cvt.rna.tf32.f32`), in `t`'s dtype. Non-finite values are kept."""
    f = t.to(torch.float32)
    r = ((f.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)
    return torch.where(f.isfinite(), r, f).to(t.dtype)


def tf32_allowed_ops(device: str) -> tuple[str, ...]:
    """The operation families this process's PyTorch settings let run in TF32 on `device`: convolutions
    with `torch.backends.cudnn.allow_tf32` (PyTorch's default is True), matrix products with
    `torch.backends.cuda.matmul.allow_tf32`. `KSTRATA_TF32_ALLOWANCE=force` says the same on the CPU (tests)."""
    forced = os.environ.get("KSTRATA_TF32_ALLOWANCE") == "force"
    if not (device.startswith("cuda") or forced):
        return ()
    ops = []
    if torch.backends.cudnn.allow_tf32:
        ops.append("convolution")
    if torch.backends.cuda.matmul.allow_tf32:
        ops.append("matmul")
    return tuple(ops)


def tf32_allowance(m64: Any, inputs: list[Any], out64: list[Any], ops: tuple[str, ...]) -> tuple[list[Any], int]:
    """The error PyTorch's precision settings admit: the float64 model run again with the inputs of every
    operation in `ops` (convolutions, matrix products) rounded to TF32, as cuDNN and cuBLAS round them when
    TF32 is allowed, against the float64 outputs. Per output `{"max_abs", "rel_l2"}` (None for an output
    that is not a floating tensor), and how many operations were rounded (0: the model has none, and
    nothing is admitted beyond PyTorch's own error)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    families = {"convolution": {aten.convolution.default: (0, 1)},
                "matmul": {aten.mm.default: (0, 1), aten.bmm.default: (0, 1), aten.addmm.default: (1, 2),
                           aten.baddbmm.default: (1, 2)}}
    rounded = {op: idx for fam in ops for op, idx in families[fam].items()}

    class RoundToTF32(TorchDispatchMode):  # type: ignore[no-untyped-call]
        count = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func in rounded:
                args = list(args)
                for i in rounded[func]:
                    if isinstance(args[i], torch.Tensor) and args[i].dtype.is_floating_point:
                        args[i] = _tf32_round(args[i])
                RoundToTF32.count += 1
            return func(*args, **(kwargs or {}))

    _, ins64 = _to_double(torch.nn.Identity(), inputs)
    with RoundToTF32():  # type: ignore[no-untyped-call]
        emulated = _flat_outputs(m64(*ins64))
    del ins64
    stats: list[Any] = []
    for e, t in zip(emulated, out64, strict=False):
        if not (isinstance(e, torch.Tensor) and isinstance(t, torch.Tensor) and e.dtype.is_floating_point
                and e.shape == t.shape):
            stats.append(None)
            continue
        max_abs, d_sq, t_sq = 0.0, 0.0, 0.0
        ef, tf = e.reshape(-1), t.reshape(-1)
        for lo in range(0, ef.numel(), RESHAPE_CHUNK):
            a, b = ef[lo:lo + RESHAPE_CHUNK], tf[lo:lo + RESHAPE_CHUNK]
            mask = a.isfinite() & b.isfinite()
            d = (a[mask] - b[mask]).abs()
            if d.numel():
                max_abs = max(max_abs, float(d.max()))
                d_sq += float((d * d).sum())
                t_sq += float((b[mask] * b[mask]).sum())
        stats.append({"max_abs": max_abs, "rel_l2": math.sqrt(d_sq / t_sq) if t_sq > 0 else math.sqrt(d_sq)})
    return stats, RoundToTF32.count


def run_reference(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.policy == "strict":  # IEEE fp32: no TF32 in matmuls or cuDNN convolutions (see evaluate's docstring)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    report["precision"] = precision_settings()
    tf32_ops = tf32_allowed_ops(args.device)
    module = import_task_module(args.task)
    model, _ = _build(module.Model, module, args.seed, args.device)
    m64: Any = None
    fp64_note = ""
    trials = []
    started = time.perf_counter()
    with torch.no_grad():
        inputs: list[Any] = []
        for i in range(args.trials):
            _step(args, f"trial {i}")
            inputs = []  # the last trial's inputs are kept for the timing only
            _release_cached(args.device)
            ph = _Phases(args.device)
            inputs = make_inputs(module, i, args.seed, args.device)
            ph.mark("inputs")
            # hashed before the forward, as the candidate's process hashes its own: a Model that writes its
            # inputs (in-place ops) must not read as a get_inputs that draws other values
            in_digest = digest(inputs)
            ph.mark("digest")
            out = _flat_outputs(model(*inputs))
            ph.mark("forward")
            if digest(inputs) != in_digest:  # it wrote them: the float64 reference runs on them as drawn
                report["reference_writes_inputs"] = True
                inputs = []  # the written copy freed before the fresh one is drawn (a published size: GBs)
                inputs = make_inputs(module, i, args.seed, args.device)
                ph.mark("inputs")
            outputs64 = None
            allowance: list[Any] | None = None
            if not fp64_note:
                try:
                    if m64 is None:
                        m64, _ = _to_double(model, [])
                    _, ins64 = _to_double(torch.nn.Identity(), inputs)
                    out64 = _flat_outputs(m64(*ins64))
                    del ins64
                    ph.mark("float64")
                    if tf32_ops:  # what PyTorch's settings admit beyond its own error (TF32 convolutions)
                        try:
                            allowance, n_rounded = tf32_allowance(m64, inputs, out64, tf32_ops)
                            report["tf32"] = {"ops": list(tf32_ops), "rounded_calls": n_rounded}
                        except Exception as exc:  # said in the report; the bound is then PyTorch's own error
                            report["tf32"] = {"ops": list(tf32_ops), "rounded_calls": 0,
                                              "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                            n_rounded = 0
                        ph.mark("tf32")
                        if not n_rounded:  # no such operation in the model: nothing admitted, not run again
                            tf32_ops, allowance = (), None
                    outputs64 = out64  # saved from the device straight into the trial file (trial_io)
                    del out64
                except Exception as exc:
                    fp64_note = f"the float64 reference failed: {type(exc).__name__}: {str(exc)[:200]}"
                    outputs64 = None
            entry = {"input_digest": in_digest, "outputs": out, "outputs64": outputs64, "fp64_note": fp64_note,
                     "tf32_allowance": allowance if outputs64 is not None else None}
            del out
            _save_trial(entry, Path(args.workdir) / f"trial{i}.pt")
            ph.mark("save")
            trials.append({"index": i, "distribution": DISTRIBUTIONS[i % len(DISTRIBUTIONS)],
                           "seed": trial_seed(args.seed, i), "checks": []})
            del outputs64, entry
            _release_cached(args.device)  # before the candidate's process runs its trial
            _progress("reference", i + 1, args.trials, started, ph.times)
        report["trials"] = trials
        report["fp64_note"] = fp64_note
        if args.timing and args.device == "cuda":
            _step(args, "timing")
            report["timing"] = time_cuda(lambda: model(*inputs), args.runs, cuda_graph=args.cuda_graph)
    report["memory"] = memory_peaks(args.device)
    from kstrata.agents.reference_cache import local_files

    report["local_files"] = local_files(args.task)  # what a kept copy of this run depends on besides the task


def run_candidate(args: argparse.Namespace, report: dict[str, Any]) -> None:
    device = args.device
    checks: list[dict[str, Any]] = []
    report["checks"] = checks
    task_module = import_task_module(args.task)
    threads_before_import = set(threading.enumerate())
    report["phase"] = "import"
    cand_module = import_task_module(args.candidate)
    cand_file = str(Path(args.candidate).resolve())
    model_new = getattr(cand_module, "ModelNew", None)
    if model_new is None:
        raise RuntimeError("the candidate file defines no `ModelNew`")
    tampered = timer_tampering()
    checks.append({"name": "timer-integrity-after-import", "ok": not tampered,
                   "detail": f"replaced by the candidate: {', '.join(tampered)}" if tampered else ""})
    report["phase"] = "init"
    model, _ = _build(model_new, task_module, args.seed, device)
    report["phase"] = "forward"
    trials = []
    buffers: list[Any] | None = None
    # Earlier trials' outputs stay alive, so a fresh honest output can never reuse their memory (an output
    # that overlaps one is a cached result) -- up to KEEP_FRACTION of the device's memory, newest first: at
    # published sizes five 6 GiB outputs would not fit beside the reference's process. A cached output
    # still fails the trial's values (every trial has other inputs); the check says which trials it saw.
    kept_outputs: list[tuple[int, torch.Tensor]] = []
    keep_limit = _keep_limit(device)
    stream0 = _current_stream() if device == "cuda" else None
    started = time.perf_counter()
    with torch.no_grad():
        for i in range(args.trials):
            _step(args, f"trial {i}")
            _release_cached(device)
            ph = _Phases(device)
            fresh = make_inputs(task_module, i, args.seed, device)
            if buffers is None:
                buffers = fresh
            else:
                # Same tensors, new data: defeats caches keyed by pointer, shape or identity.
                for j, (b, f) in enumerate(zip(buffers, fresh, strict=True)):
                    if isinstance(b, torch.Tensor):
                        _copy(b, f)
                    else:
                        buffers[j] = f
            del fresh
            ph.mark("inputs")
            in_digest = digest(buffers)
            in_spans = [_span(b) for b in buffers if isinstance(b, torch.Tensor)]
            ph.mark("digest")
            nbytes = max(POISON_BYTES, 2 * sum(b.numel() * b.element_size() for b in buffers if isinstance(b, torch.Tensor)))
            poison_allocator(device, _poison_cap(device, nbytes))
            ph.mark("poison")
            threads_before = set(threading.enumerate())
            t_checks: list[dict[str, Any]] = []
            out = _flat_outputs(model(*buffers))
            # The value as the current stream sees it the moment forward returns: this is what is judged.
            snapshot = [_clone(o) if isinstance(o, torch.Tensor) else o for o in out]
            if device == "cuda":
                _synchronize()
            time.sleep(0.05)  # give a background thread the chance to write after the return
            if device == "cuda":
                _synchronize()
            ph.mark("forward")
            late = [k for k, (a, b) in enumerate(zip(snapshot, out, strict=True)) if not _same_bits(a, b)]
            t_checks.append({"name": "no-work-after-return", "ok": not late,
                             "detail": (f"output(s) {late} changed after forward returned: work left running on another "
                                        "stream or in a background thread; synchronize with the current stream before "
                                        "returning") if late else ""})
            if device == "cuda":
                now = _current_stream()
                t_checks.append({"name": "current-stream", "ok": now == stream0,
                                 "detail": "" if now == stream0 else "forward changed the current CUDA stream"})
            new_threads = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
            own = [t.name for t in new_threads if _thread_origin(t) == cand_file]
            t_checks.append({"name": "no-background-threads", "ok": not own,
                             "detail": f"threads started by the candidate still running: {', '.join(own)}" if own else ""})
            after = digest(buffers)
            t_checks.append({"name": "inputs-unchanged", "ok": after == in_digest,
                             "detail": "" if after == in_digest else "forward wrote to its inputs (they must be read-only)"})
            alias = []
            for k, o in enumerate(out):
                if not isinstance(o, torch.Tensor):
                    continue
                span = _span(o)
                if any(_overlaps(span, s) for s in in_spans):
                    alias.append(f"output {k} shares memory with an input")
                hit = [t for t, p in kept_outputs if _overlaps(span, _span(p))]
                if hit:
                    alias.append(f"output {k} shares memory with the output of trial {hit[0]} (a cached result?)")
            seen = sorted({t for t, _ in kept_outputs})
            not_kept = [t for t in range(i) if t not in seen]
            t_checks.append({"name": "no-aliasing", "ok": not alias, "detail": "; ".join(alias) or (
                f"outputs of trials {not_kept} released before this trial (device memory), so not compared"
                if not_kept else "")})
            ph.mark("checks")
            tampered = timer_tampering()
            t_checks.append({"name": "timer-integrity", "ok": not tampered,
                             "detail": f"replaced by the candidate: {', '.join(tampered)}" if tampered else ""})
            _save_trial({"input_digest": in_digest, "outputs": snapshot}, Path(args.workdir) / f"trial{i}.pt")
            ph.mark("save")
            kept_outputs.extend((i, o) for o in out if isinstance(o, torch.Tensor))
            while kept_outputs and sum(o.untyped_storage().nbytes() for _, o in kept_outputs) > keep_limit:
                kept_outputs.pop(0)
            trials.append({"index": i, "distribution": DISTRIBUTIONS[i % len(DISTRIBUTIONS)],
                           "seed": trial_seed(args.seed, i), "checks": t_checks})
            del snapshot, out
            _release_cached(device)  # before the reference's process runs the next trial
            _progress("candidate", i + 1, args.trials, started, ph.times)
        report["trials"] = trials
        report["precision"] = precision_settings()  # as the candidate left them
        leftover = [t.name for t in set(threading.enumerate()) - threads_before_import
                    if t.is_alive() and _thread_origin(t) == cand_file]
        if leftover:
            checks.append({"name": "no-background-threads", "ok": False,
                           "detail": f"threads started by the candidate still running: {', '.join(leftover)}"})
        report["phase"] = "timing"
        if args.timing and device == "cuda" and buffers is not None:
            _step(args, "timing")
            bufs = buffers
            # Correctness after timing: a candidate right for its first calls and cheap and wrong later
            # is caught by judging the outputs of the last timed call and of one drawn at random.
            warmup = 10
            pick = warmup + random.Random(args.seed).randrange(args.runs)
            calls = [0]
            kept: dict[str, Any] = {}

            def timed() -> Any:
                out = model(*bufs)
                if calls[0] == pick:
                    kept["random"] = [_clone(o) if isinstance(o, torch.Tensor) else o for o in _flat_outputs(out)]
                calls[0] += 1
                kept["last"] = out
                return out

            report["timing"] = time_cuda(timed, args.runs, warmup=warmup, cuda_graph=args.cuda_graph)
            last = [_clone(o) if isinstance(o, torch.Tensor) else o for o in _flat_outputs(kept.get("last"))]
            _synchronize()
            timed_outputs = {"last": last, "random": kept.get("random"), "random_call": pick - warmup,
                             "calls": calls[0]}
            _save_trial(timed_outputs, Path(args.workdir) / "timed.pt")  # device tensors straight to the file
            del kept, last, timed_outputs
            tampered = timer_tampering()
            if tampered:
                checks.append({"name": "timer-integrity-after-timing", "ok": False,
                               "detail": f"replaced by the candidate: {', '.join(tampered)}"})
    report["memory"] = memory_peaks(device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kstrata.agents.eval_worker")
    p.add_argument("--role", choices=("reference", "candidate"), required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--candidate")
    p.add_argument("--workdir", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--timing", action="store_true")
    p.add_argument("--cuda-graph", action="store_true")
    p.add_argument("--policy", default="strict")
    p.add_argument("--lockstep", action="store_true", help="wait for a go line on stdin before each trial "
                   "and before timing (outputs too large to keep every trial)")
    args = p.parse_args(argv)
    report: dict[str, Any] = {"role": args.role, "ok": False, "versions": _versions(), "phase": "setup"}
    if args.device == "cuda":
        report["device_name"] = torch.cuda.get_device_name()
    else:
        report["device_name"] = f"cpu ({platform.machine()})"
    try:
        if args.role == "reference":
            run_reference(args, report)
        else:
            run_candidate(args, report)
        report["ok"] = True
    except BaseException as exc:  # a candidate's SystemExit is a failure to report, not an exit
        report["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        report["traceback"] = traceback.format_exc()[-3000:]
        print(report["traceback"], file=sys.stderr)
    tmp = Path(args.workdir) / "report.json.tmp"
    tmp.write_text(json.dumps(report, default=str))
    tmp.replace(Path(args.workdir) / "report.json")
    # Leave at once: a candidate's lingering (non-daemon) threads must not keep the process alive.
    from kstrata.agents.leave import leave

    leave(0)


if __name__ == "__main__":
    main()
