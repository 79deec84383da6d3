"""Autotuning a template instance on the GPU: which schedule of its space is fastest for this task.

`autotune(match)` builds the task's model and inputs directly on the GPU (no host copy of GB-sized
inputs), computes the reference output once (eager PyTorch under the match's precision policy), then
searches the schedule space by coordinate descent from the best of the default schedule and the template's
hints (schedules that change several parameters at once): one parameter at a time is swept over its
values, the best is kept, until a sweep finds nothing better; with time left, descent starts again from the
fastest schedule of a strategy not yet descended from (`search`), until the time budget is spent.
Each schedule is rendered, imported, built under the same seed as the reference, run once and screened
by `screen`: its output against a float64 run of the task, within the bound `kstrata eval`'s strict policy
uses (`agents.evaluate.compare_output`: a multiple of PyTorch's own error against float64 plus a few
ULPs), not a fixed tolerance against eager (eager's own fp32 error can exceed it: a convolution's 1e-5);
the hardened `kstrata eval` judges the final source. A correct schedule is then timed by the project's GPU timer
(`backends.timing.time_gpu`: L2 flushed per run, CUDA events, median). A schedule that fails to compile,
crashes or differs is recorded with its reason and skipped.

The result is cached in `cache_dir/templates-tuned.json`, keyed by template, input/output shapes and
dtypes, policy, device name, and the Triton and torch versions, so the optimizer and the benchmark do
not tune the same instance twice. `measure` lets the optimizer pass its engine's timer instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kstrata.agents.templates.base import Params, TemplateMatch

CACHE_FILE = "templates-tuned.json"


class TuneError(Exception):
    """Autotuning could not run (no GPU, the task does not build): why, in one line."""


@dataclass(frozen=True)
class Trial:
    params: Params
    median_us: float | None
    error: str | None = None


@dataclass(frozen=True)
class TuneResult:
    template: str
    key: str
    params: Params
    median_us: float
    trials: tuple[Trial, ...] = field(default=())
    cached: bool = False
    device: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def cache_key(m: TemplateMatch, device: str) -> str:
    import torch
    import triton

    raw = f"{m.template}|{m.shape_key}|{device}|triton {triton.__version__}|torch {torch.__version__}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


def _write_cache(path: Path, key: str, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read_cache(path)
    data[key] = entry
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".templates-tuned.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def set_policy(policy: str) -> None:
    """The process-wide matmul/cuDNN precision of a policy (strict: TF32 off)."""
    import torch

    on = policy == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


class TaskOnDevice:
    """A task's reference model, inputs and eager output on a CUDA device, built once per tuning run."""

    def __init__(self, m: TemplateMatch, seed: int = 42, device: str = "cuda") -> None:
        import torch

        from kstrata.agents.tasks import import_task_module

        self.seed, self.device = seed, device
        self.dir = Path(tempfile.mkdtemp(prefix="kstrata-templates-"))
        self.module = import_task_module(m.task_path)
        set_policy(m.policy)
        with torch.device(device):
            torch.manual_seed(seed)
            self.init = list(self.module.get_init_inputs())
            torch.manual_seed(seed)
            self.model = self.module.Model(*self.init).eval()
            torch.manual_seed(seed + 1)
            self.inputs = list(self.module.get_inputs())
        with torch.no_grad():
            self.ref = self.model(*self.inputs)
        self._truth: Any = None
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def truth(self) -> Any:
        """The task's output in float64 (a float64 copy of the model on float64 inputs), computed once."""
        import copy

        import torch

        if self._truth is None:
            with torch.no_grad():
                model64 = copy.deepcopy(self.model).double()
                ins = [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in self.inputs]
                self._truth = model64(*ins)
                del model64, ins
        return self._truth

    def screen(self, out: Any) -> str | None:
        """None if `out` is correct under strict (against float64), else why not (one line)."""
        return screen(self.ref, out, self.truth())

    def judge(self, out: Any) -> tuple[str | None, Any]:
        """`screen`'s verdict and the comparison it rests on (`evaluate.OutputComparison`; None when the
        output's shape or dtype already fails it)."""
        return judge(self.ref, out, self.truth())

    def build(self, source: str, tag: str) -> Any:
        """Import a rendered source and build its ModelNew like the reference (same seed: same weights)."""
        import torch

        from kstrata.agents.tasks import import_task_module

        path = self.dir / f"model_new_{tag}.py"
        path.write_text(source)
        mod = import_task_module(path)
        with torch.device(self.device):
            torch.manual_seed(self.seed)
            return mod.ModelNew(*self.init).eval()

    def error(self, out: Any) -> float:
        """Relative L2 error of `out` against the reference output (on the device)."""
        if tuple(out.shape) != tuple(self.ref.shape):
            return float("inf")
        return errors(out, self.ref)[1]


def screen(ref: Any, out: Any, truth: Any) -> str | None:
    """None if `out` is within `kstrata eval`'s strict bound against the float64 `truth` (a multiple of the
    eager output `ref`'s own error against `truth`, plus a few ULPs), else why not, in one line."""
    return judge(ref, out, truth)[0]


def judge(ref: Any, out: Any, truth: Any) -> tuple[str | None, Any]:
    """`screen`'s verdict, with the `evaluate.OutputComparison` behind it (None when the output's shape or
    dtype differs from the reference's)."""
    import torch

    from kstrata.agents.evaluate import compare_output

    if isinstance(ref, torch.Tensor):
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(ref.shape) or out.dtype != ref.dtype:
            got = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
            return f"output is {got}, expected {tuple(ref.shape)} {ref.dtype}", None
    c = compare_output("output", ref, out, truth)
    return (None if c.strict_ok else (c.detail or "differs from the reference")), c


def errors(x: Any, truth: Any, chunk: int = 1 << 26) -> tuple[float, float]:
    """(largest absolute error, relative L2 error) of `x` against `truth`, in float64, in chunks of `chunk`
    elements (a 6.4 GB fp32 output would otherwise need 25 GB of float64 temporaries at once)."""
    import torch

    xf, tf = x.reshape(-1), truth.reshape(-1)
    worst, num, den = 0.0, 0.0, 0.0
    for i in range(0, xf.numel(), chunk):
        a, b = xf[i:i + chunk].double(), tf[i:i + chunk].double()
        d = a - b
        worst = max(worst, float(d.abs().max()))
        num += float(torch.dot(d, d))
        den += float(torch.dot(b, b))
    rel = (num ** 0.5) / (den ** 0.5) if den > 0 else num ** 0.5
    return worst, rel


def default_measure(fn: Callable[[], Any], runs: int) -> float:
    """Median microseconds of `fn` by the project's one GPU timer (`backends.timing.time_gpu`)."""
    from kstrata.backends.timing import time_gpu

    return float(time_gpu(fn, runs=runs, warmup=3).median_us)


def search(starts: list[Params], space: dict[str, tuple[Any, ...]], valid: Callable[[Params], bool],
           score: Callable[[Params], float | None], out_of_time: Callable[[], bool]) -> tuple[Params, float | None]:
    """The fastest schedule found: every start scored (the default, then the hints: schedules that change several
    parameters at once), coordinate descent from the fastest, then, while time is left, descent again from the
    fastest schedule scored so far of a `strategy` not yet descended from. A descent from one strategy's best
    reaches another strategy only with that one's parameters, which may not suit it (the norm's `stream` wants
    SPLIT >= 2, `resident` SPLIT 1): on 2026-12-04 the tuner stopped after 10 of LayerNorm's schedules with most
    of its time unspent. `score` memoizes and gives None for a schedule that failed."""
    scored: dict[str, tuple[Params, float]] = {}

    def run(p: Params) -> float | None:
        us = score(p)
        if us is not None:
            scored[json.dumps(p, sort_keys=True)] = (p, us)
        return us

    best, best_us = starts[0], run(starts[0])
    for p in starts[1:]:
        if out_of_time():
            break
        us = run(p)
        if us is not None and (best_us is None or us < best_us):
            best, best_us = p, us
    descended: set[Any] = set()
    start, start_us = best, best_us
    while True:
        descended.add(start.get("strategy"))
        start, start_us = _descend(start, start_us, space, valid, run, out_of_time)
        if start_us is not None and (best_us is None or start_us < best_us):
            best, best_us = start, start_us
        rest = sorted((v for v in scored.values() if v[0].get("strategy") not in descended), key=lambda v: v[1])
        if out_of_time() or not rest:
            return best, best_us
        start, start_us = rest[0]


def _descend(start: Params, start_us: float | None, space: dict[str, tuple[Any, ...]], valid: Callable[[Params], bool],
             run: Callable[[Params], float | None], out_of_time: Callable[[], bool]) -> tuple[Params, float | None]:
    """Coordinate descent from `start`: one parameter at a time swept over its values, the fastest kept, until a
    sweep finds nothing faster or time runs out (a failed start: the first schedule that runs)."""
    improved = True
    while improved and not out_of_time():
        improved = False
        for axis, values in space.items():
            for v in values:
                if out_of_time():
                    break
                p = {**start, axis: v}
                if p == start or not valid(p):
                    continue
                us = run(p)
                if us is not None and (start_us is None or us < start_us):
                    start, start_us, improved = p, us, True
    return start, start_us


def autotune(m: TemplateMatch, *, budget_s: float = 60.0, cache_dir: str | Path | None = None, runs: int = 20,
             measure: Callable[[Callable[[], Any], int], float] | None = None, on_progress: Callable[[str], None] | None = None,
             use_cache: bool = True, prepared: TaskOnDevice | None = None) -> TuneResult:
    """The fastest correct schedule of `m` found within `budget_s` on the current CUDA device."""
    import torch

    if not torch.cuda.is_available():
        raise TuneError("autotuning a template needs a CUDA GPU (on the CPU, templates are checked for correctness only)")
    device_name = torch.cuda.get_device_name()
    key = cache_key(m, device_name)
    cache_path = Path(cache_dir) / CACHE_FILE if cache_dir else None
    if cache_path and use_cache:
        hit = _read_cache(cache_path).get(key)
        if hit:
            return TuneResult(m.template, key, hit["params"], hit["median_us"], cached=True, device=device_name)
    t0 = time.monotonic()
    say = on_progress or (lambda s: None)
    timer = measure or default_measure
    env = prepared or TaskOnDevice(m)
    trials: dict[str, Trial] = {}

    def score(p: Params) -> float | None:
        k = json.dumps(p, sort_keys=True)
        if k in trials:
            return trials[k].median_us
        try:
            new = env.build(m.render(p), f"{m.template}_{len(trials)}")  # one env may tune several templates
            with torch.no_grad():
                out = new(*env.inputs)
                torch.cuda.synchronize()
                why = env.screen(out)
                del out
                if why is not None:
                    raise ValueError(f"not correct under strict: {why}")

                def call(new: Any = new) -> Any:
                    return new(*env.inputs)

                us = timer(call, runs)
            trials[k] = Trial(p, us)
            say(f"  {m.template} {k}: {us:.1f} us")
            return us
        except Exception as e:  # a schedule that does not compile or run is a result, not a crash
            trials[k] = Trial(p, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            say(f"  {m.template} {k}: failed ({trials[k].error})")
            return None

    best, best_us = search([m.default_params(), *m.hint_params()], m.schedule_space(), m._valid, score,
                           lambda: time.monotonic() - t0 >= budget_s)
    if best_us is None:
        errors = "; ".join(sorted({t.error or "" for t in trials.values()}))[:400]
        raise TuneError(f"no schedule of {m.template} ran correctly: {errors}")
    result = TuneResult(m.template, key, best, best_us, tuple(trials.values()), device=device_name,
                        seconds=time.monotonic() - t0)
    if cache_path:
        _write_cache(cache_path, key, {"template": m.template, "shape_key": m.shape_key, "device": device_name,
                                       "params": best, "median_us": best_us, "tried": len(trials),
                                       "date": time.strftime("%Y-%m-%d")})
    return result
