"""`torch.compile(model, backend="kstrata")`: Inductor, with every Triton kernel it generates routed
through a kstrata pass pipeline.

The backend compiles with Inductor and installs, process-wide, Triton's stages inspection hook
(`triton.knobs.runtime.add_stages_inspection_hook`). For each Triton compile the hook wraps the stages
the pipeline has passes for: after Triton's own stage produced a level, kstrata's passes for that level
run on it (each followed by its verifier), and the next stage consumes the result. Option passes
(`num-warps`, `num-stages`) re-lower TTIR into TTGIR and update the launch metadata; `ptxas-options`
reaches the cubin stage. When a pass or a check fails, the stage's unmodified output is used and the
reason is logged and reported: a kernel is never lost.

Kernels compiled through kstrata are cached by Triton in a directory keyed by the pipeline and the tool
versions (`<cache_dir>/<hash>/`), so a second run of the same model finds them there and does no
rewriting work. The hook and that cache directory are set only while the backend compiles a graph;
Inductor compiles in this process then (`compile_threads=1`, FX graph cache off) so the hook sees
every kernel. A kernel Inductor compiles lazily after that (at a first call) is Triton's own.

Options (`options={...}` or environment variables):
- `pipeline` / `KSTRATA_PIPELINE`: the pass pipeline (default: `llir(noalias-args{assume=true}),ptx(cache-hints)`;
  `noalias-args` holds because Inductor never passes overlapping buffers to one kernel except through a
  single in-out pointer).
- `verify` / `KSTRATA_VERIFY`: `static` (default: each pass's verifier runs) or `none`.
- `cache_dir` / `KSTRATA_CACHE_DIR`: where rewritten kernels are cached (default `~/.cache/kstrata/triton`).
- `report` / `KSTRATA_REPORT`: a JSON-lines file, one line per kernel (rewritten or not, and why).
- `only_inductor` / `KSTRATA_ONLY_INDUCTOR`: rewrite only Inductor's kernels (`triton_*`), default true.
- `tuned` / `KSTRATA_TUNED`: a tuned database (`kstrata optimize CACHE --out OUT` writes `OUT/tuned`;
  `kstrata tuned list`). A kernel whose content digest (location-free TTIR and lowering options), target
  and tool versions match a record gets the tuned variant's levels and binary (and its launch metadata);
  every other kernel is left exactly as Inductor made it: with `tuned` the pipeline is off unless
  `pipeline` is given too. The report says, per kernel, `tuned` (with the edit) or why none applied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from kstrata.ir.errors import KstrataError

log = logging.getLogger("kstrata.torch_backend")

DEFAULT_PIPELINE = "llir(noalias-args{assume=true}),ptx(cache-hints)"
_OPTION_ENV = {"pipeline": "KSTRATA_PIPELINE", "verify": "KSTRATA_VERIFY", "cache_dir": "KSTRATA_CACHE_DIR",
               "report": "KSTRATA_REPORT", "only_inductor": "KSTRATA_ONLY_INDUCTOR", "tuned": "KSTRATA_TUNED"}


class BackendOptionError(KstrataError):
    """An option of the kstrata torch.compile backend that cannot be used."""


@dataclass(frozen=True)
class BackendConfig:
    pipeline: str = DEFAULT_PIPELINE
    verify: str = "static"
    cache_dir: str = str(Path.home() / ".cache" / "kstrata" / "triton")
    report: str | None = None
    only_inductor: bool = True
    tuned: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> BackendConfig:
        """Options given to torch.compile override the environment, which overrides the defaults."""
        from kstrata.passes.pipeline import parse_pipeline

        given = dict(options or {})
        unknown = sorted(set(given) - set(_OPTION_ENV))
        if unknown:
            raise BackendOptionError(f"unknown kstrata backend options {unknown}; known: {sorted(_OPTION_ENV)}")
        values: dict[str, Any] = {}
        for key, env in _OPTION_ENV.items():
            if key in given:
                values[key] = given[key]
            elif os.environ.get(env):
                values[key] = os.environ[env]
        if values.get("tuned") and "pipeline" not in values:
            values["pipeline"] = ""  # tuned variants only: every other kernel stays as Inductor made it
        if "only_inductor" in values and isinstance(values["only_inductor"], str):
            values["only_inductor"] = values["only_inductor"].lower() in ("1", "true", "yes")
        config = cls(**values)
        if config.verify not in ("static", "none"):
            raise BackendOptionError(f"verify must be 'static' or 'none', not {config.verify!r}")
        if config.pipeline:
            parse_pipeline(config.pipeline)  # a bad pipeline is an error now, with its column
        if config.tuned:
            from kstrata.agents.tuned import TunedDB

            TunedDB(config.tuned).check()  # not a tuned database: an error now, naming it
        return config

    def cache_key(self) -> str:
        """What the cached kernels depend on besides their source: the pipeline and the tool versions (the
        candidate engine's set: Triton, ptxas, LLVM, kstrata; plus torch, whose Inductor writes the source)."""
        import torch

        from kstrata.agents.engine import tool_versions

        tuned = None
        if self.tuned:  # which variants can be applied is part of what the cached kernels are
            from kstrata.agents.tuned import TunedDB

            tuned = sorted(r.tuned_binary for _, r in TunedDB(self.tuned).index().values())
        key = json.dumps({"pipeline": self.pipeline, "verify": self.verify, "torch": torch.__version__,
                          "versions": dict(tool_versions()), "tuned": tuned}, sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:20]


@dataclass
class KernelRecord:
    name: str
    target: str
    status: str  # "rewritten", "unchanged", "fallback", "tuned"
    passes: list[str] = field(default_factory=list)
    reason: str = ""


class _Session:
    """The installed hook and what it did, shared by every model compiled with the same config."""

    def __init__(self, config: BackendConfig) -> None:
        from kstrata.agents.tuned import TunedLookup
        from kstrata.passes.pipeline import parse_pipeline

        self.config = config
        self.pipeline = parse_pipeline(config.pipeline) if config.pipeline else None
        self.tuned = TunedLookup(config.tuned) if config.tuned else None
        self.records: list[KernelRecord] = []
        self.lock = threading.Lock()

    def record(self, rec: KernelRecord) -> None:
        with self.lock:
            self.records.append(rec)
        if rec.status == "fallback":
            log.warning("kstrata: kernel %s left unmodified: %s", rec.name, rec.reason)
        if self.config.report:
            path = Path(self.config.report)
            path.parent.mkdir(parents=True, exist_ok=True)
            with self.lock, path.open("a") as f:
                f.write(json.dumps(dataclasses.asdict(rec)) + "\n")

    def hook(self, backend: Any, stages: dict[str, Callable[..., Any]], options: Any, language: Any,
             capability: Any) -> None:
        """Triton's stages inspection hook: wrap the stages the pipeline has passes for."""
        from kstrata.ir.target import Target

        target = Target.from_triton(backend.target)
        state: dict[str, Any] = {"levels": {}, "name": None, "skip": None, "changed": [], "failed": None,
                                 "tuned": None, "tuned_why": None}
        levels_with_passes = {s.level for s in self.pipeline.stages if s.passes} if self.pipeline else set()
        for level in list(stages):
            original = stages[level]
            stages[level] = self._wrap(level, original, target, state, levels_with_passes, backend, options, capability)

    def _wrap(self, level: str, original: Callable[..., Any], target: Any, state: dict[str, Any],
              levels_with_passes: set[str], backend: Any, options: Any, capability: Any) -> Callable[..., Any]:
        def stage(src: Any, metadata: dict[str, Any]) -> Any:
            if level == "cubin" and metadata.get("ptx_options") != getattr(options, "ptx_options", None):
                out = backend.make_cubin(src, metadata, dataclasses.replace(options, ptx_options=metadata["ptx_options"]),
                                         capability)
            else:
                out = original(src, metadata)
            if state["name"] is None and not isinstance(out, bytes) and self.tuned is not None:
                m = re.search(r"tt\.func public @([\w$]+)", str(out))
                state["tuned"], state["tuned_why"] = self.tuned.match(m.group(1) if m else "?", str(target), str(out),
                                                                      metadata)
            if state["tuned"] is not None:  # the tuned variant's level replaces Triton's, every level
                out = self._tuned_level(state["tuned"], level, out, metadata)
            if isinstance(out, bytes):
                self._finish(state, target)
                return out
            text = str(out)
            if state["name"] is None:
                m = re.search(r"tt\.func public @([\w$]+)", text)
                name = m.group(1) if m else "?"
                state["name"] = name
                if state["tuned"] is not None:
                    state["skip"] = "tuned"
                elif self.config.only_inductor and not name.startswith("triton_"):
                    state["skip"] = "not an Inductor kernel"
            state["levels"][level] = text
            if state["skip"] or state["failed"] or level not in levels_with_passes:
                return out
            return self._rewrite(level, out, text, target, state, metadata)

        return stage

    @staticmethod
    def _tuned_level(variant: Any, level: str, out: Any, metadata: dict[str, Any]) -> Any:
        """The tuned variant's `level` in the form Triton's next stage takes (a module, text, bytes)."""
        data = variant.level(level)
        if data is None:
            return out
        if isinstance(out, bytes):
            metadata.update(variant.record.metadata_changes)  # num_warps, shared, ptx options, … of the variant
            return data
        text = data.decode()
        return _parse_mlir(text, level, out) if level in ("ttir", "ttgir") else text

    def _rewrite(self, level: str, out: Any, text: str, target: Any, state: dict[str, Any],
                 metadata: dict[str, Any]) -> Any:
        from kstrata.ir.bundle import KernelBundle
        from kstrata.passes.pipeline import run_stage

        assert self.pipeline is not None  # only levels the pipeline has passes for come here
        stage_spec = next(s for s in self.pipeline.stages if s.level == level)
        bundle = KernelBundle(state["name"], target, dict(state["levels"]), dict(metadata))
        try:
            outcome = run_stage(bundle, stage_spec, verify=self.config.verify == "static")
            if not outcome.changed:
                return out
            new: Any = outcome.text
            if level in ("ttir", "ttgir"):
                new = _parse_mlir(outcome.text, level, out)
        except Exception as exc:  # a kernel is never lost: keep Triton's output and say why
            state["failed"] = f"{level}: {type(exc).__name__}: {exc}"
            return out
        metadata.update(outcome.updates)
        state["levels"][level] = outcome.text
        state["changed"] += [r.spelling for r in outcome.records if r.status == "changed"]
        return new

    def _finish(self, state: dict[str, Any], target: Any) -> None:
        if state["tuned"] is not None:
            r = state["tuned"].record
            self.record(KernelRecord(r.kernel, str(target), "tuned", [r.edit], f"tuned variant {r.slug}: "
                                     f"{r.speedup:.3f}x measured on {r.device} ({r.measured_at})"))
            return
        if self.tuned is not None and state["tuned_why"] and state["skip"] != "not an Inductor kernel" \
                and not state["changed"]:
            self.record(KernelRecord(state["name"] or "?", str(target), "unchanged", [], state["tuned_why"]))
            return
        if state["skip"]:
            return
        if state["failed"]:
            self.record(KernelRecord(state["name"] or "?", str(target), "fallback", state["changed"], state["failed"]))
        elif state["changed"]:
            # Only the passes' static verifiers ran: the rewrite is unproven (`kstrata verify` with a launch
            # record gives it dynamic evidence), never counted as verified.
            self.record(KernelRecord(state["name"], str(target), "rewritten", state["changed"],
                                     "verification: unproven (static checks only)"))
        else:
            self.record(KernelRecord(state["name"] or "?", str(target), "unchanged"))


def _parse_mlir(text: str, level: str, like: Any) -> Any:
    from triton._C.libtriton import ir

    context = like.context
    with tempfile.TemporaryDirectory(prefix="kstrata-stage-") as tmp:
        path = Path(tmp) / f"kernel.{level}"
        path.write_text(text)
        module = ir.parse_mlir_module(str(path), context)
    module.context = context
    return module


_sessions: dict[BackendConfig, _Session] = {}
_said_no_triton = False


@contextlib.contextmanager
def _installed(config: BackendConfig) -> Iterator[_Session]:
    """While compiling: the stages hook and the pipeline-keyed Triton cache directory, then restore both.

    Inductor keeps compiled kernels in process-wide caches keyed by their source; they are cleared
    before (so the kernels are compiled here, under the hook) and after (so a later plain Inductor
    compile of the same source does not pick up a rewritten kernel).
    """
    from torch._inductor.async_compile import CompiledTritonKernels
    from torch._inductor.codecache import PyCodeCache
    from triton import knobs

    session = _sessions.setdefault(config, _Session(config))
    previous_hook = knobs.runtime.add_stages_inspection_hook
    if previous_hook is not None and previous_hook is not session.hook:
        raise BackendOptionError("another Triton stages hook is installed; kstrata will not replace it")
    cache = Path(config.cache_dir) / config.cache_key()
    cache.mkdir(parents=True, exist_ok=True)
    CompiledTritonKernels.cache_clear()  # type: ignore[no-untyped-call]
    PyCodeCache.cache_clear()
    with knobs.cache.scope(), knobs.runtime.scope():
        knobs.cache.dir = str(cache)
        knobs.runtime.add_stages_inspection_hook = session.hook
        try:
            yield session
        finally:
            CompiledTritonKernels.cache_clear()  # type: ignore[no-untyped-call]
            PyCodeCache.cache_clear()


def kstrata_backend(gm: Any, example_inputs: list[Any], options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """The torch.compile backend: Inductor, with Triton kernels rewritten by the configured pipeline."""
    global _said_no_triton
    import torch
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    config = BackendConfig.from_options(options)
    on_gpu = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)
    if not on_gpu:
        if not _said_no_triton:
            log.warning("kstrata: the inputs are not on a GPU, so Inductor generates no Triton kernels; "
                        "compiling with Inductor unchanged")
            _said_no_triton = True
        return cast("Callable[..., Any]", compile_fx(gm, example_inputs))
    # In this process (the hook is not in Inductor's compile workers), without the FX graph cache (a hit
    # would load kernels compiled without the pipeline).
    with _installed(config), inductor_config.patch(compile_threads=1, fx_graph_cache=False):
        compiled = cast("Callable[..., Any]", compile_fx(gm, example_inputs))
    return compiled


def report() -> list[dict[str, Any]]:
    """What the backend did to every kernel so far in this process."""
    return [dataclasses.asdict(r) for s in _sessions.values() for r in s.records]
