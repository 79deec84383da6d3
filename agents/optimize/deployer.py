"""The `ir` space's deployer: standalone code (the standard library, torch and triton only; never kstrata)
that an `ir` candidate's `model_new.py` carries, which makes Triton use kstrata's rewritten levels for
exactly the kernels the kernel-level search improved, and proves that it did.

This file is both a module of the package (the `ir` space computes kernel digests with `kernel_digest`
below, so the proposer and the deployer can never disagree on what a kernel is) and the text
`irspace.render_ir_source` appends to the incumbent's source, followed by the deployment spec and one
`_kstrata_ir_install(...)` call. Nothing outside the functions runs at import but the imports of the
standard library.

How it deploys (checked against Triton 3.6's `compiler/compiler.py`):

- **Which kernel**: a kernel is named by its *content digest*, the SHA-256 of its TTIR with the source
  locations removed (Inductor's generated file lives at a path that differs between processes) plus the
  options that change TTIR's lowering; Triton's source hash (`src.hash()`) is not used, because it leaves
  the launch options out (two autotuning configs that differ only in `num_warps` share it).
- **How**: Triton's stages inspection hook (`knobs.runtime.add_stages_inspection_hook`, the mechanism
  kstrata's torch.compile backend uses): when the TTIR stage of a compile matches a deployed kernel, each
  later stage's output is replaced by the rewritten level (Triton's own stage still runs first, on the
  rewritten input, so the metadata it derives — shared memory, names — follows the rewritten code), and at
  the binary the launch metadata the passes changed (`num_warps`, …) is applied. Not
  `TRITON_KERNEL_OVERRIDE`: the override replaces a stage's IR but not the options already parsed from the
  source, so a rewritten `num-warps` TTGIR would launch with the original thread count.
- **Its own Triton cache**: neither the hook nor an override is part of Triton's cache key
  (`get_cache_invalidating_env_vars()` is empty), so a hit in the user's cache would return the original
  binary. The deployer points Triton (the `knobs.cache.dir` knob, not `TRITON_CACHE_DIR`, which a process
  started in the scope would inherit without the hook) at `<tmp>/kstrata-ir-<digest of the
  deployment>/triton-cache`, which only processes running this same deployment fill; the directory must be
  this user's and writable by it alone.
- **Scoped to the model**: the hook, the cache directory, the compile-time check and the Inductor settings
  hold only while this ModelNew's `__init__` or `forward` runs (Inductor and the Triton JIT compile
  inside them), and are restored after, so another model in the same process (the measurement loads the
  baseline beside this candidate) compiles and runs untouched. Inductor's in-process kernel caches
  (`PyCodeCache`, `CompiledTritonKernels`, keyed by the generated source) are cleared before and after a
  model's first call, so neither model reuses the other's compiled kernels (kstrata's torch.compile
  backend does the same).
- **Inductor**: inside the scope, it compiles in this process (`compile_threads=1`: the hook is
  process-local), without its FX graph cache and without bundling Triton artifacts into it (a hit would
  write stale, un-rewritten binaries back into the Triton cache dir), and with Triton's own launcher (the
  static CUDA launcher bypasses `CompiledKernel.run`, which the proof below watches).

The proof (it raises `IrDeployError`, never times the original silently):

- at compile time, Triton's compilation listener sees every compile and every cache hit in the scope: a
  kernel whose TTIR digest is a deployed one must have exactly the rewritten binary (SHA-256 of the cubin),
  or the compile raises;
- at launch time, the launcher a deployed kernel's `CompiledKernel.run` returns (Triton's JIT reads it at
  every launch, Inductor's launcher once when it is made; Inductor's launcher calls `launch_metadata` only
  when `knobs.runtime.launch_enter_hook` is set, which a program may turn off) notes in the scope, per deployed kernel name, whether the
  binary launched last was the rewritten one (a launcher costs one more Python call per launch of a deployed
  name, which the candidate's timing carries); the wrapped `ModelNew.forward` checks after each of its first `VERIFY_CALLS` calls that
  the last launch of every deployed name in that call ran the rewritten binary (an autotuner that picked
  another configuration of the same kernel fails here) and that every deployed kernel has been launched in
  this process.

Writes: only Triton's own cache files (which Triton writes atomically) under the temporary directory, and a
private temporary file per MLIR level it parses (removed at once); never the user's tree.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import re
import tempfile
import threading
from typing import Any

#: Compile options that change the lowering of one TTIR or how its binary launches (part of a kernel's content
#: digest: two compiles of one TTIR that differ in one of these are two kernels, e.g. `enable_reflect_ftz` flushes
#: libdevice's denormals, `launch_pdl` launches with programmatic dependent launch).
LOWERING_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "waves_per_eu", "matrix_instr_nonkdim",
                    "kpack", "enable_fp_fusion", "launch_cooperative_grid", "arch", "launch_pdl", "enable_reflect_ftz",
                    "ptx_version", "debug", "sanitize_overflow", "instrumentation_mode")
#: The levels a deployment may replace, in Triton's stage order (the binary last).
DEPLOY_LEVELS = ("ttir", "ttgir", "llir", "ptx", "cubin")
#: Calls of each ModelNew instance whose launches are checked.
VERIFY_CALLS = 3
_LOC_REF = re.compile(r"\s*loc\((?:[^()]|\([^()]*\))*\)")


class IrDeployError(RuntimeError):
    """A deployed kernel was compiled or launched without its rewritten levels."""


def strip_locations(ttir: str) -> str:
    """TTIR without source locations: `#loc…` definition lines and ` loc(…)` references (they hold the path of
    the file Inductor generated, which differs between processes, machines and users)."""
    kept = [ln for ln in ttir.splitlines() if not ln.lstrip().startswith("#loc")]
    return "\n".join(_LOC_REF.sub("", ln).rstrip() for ln in kept) + "\n"


def digest_parts(ttir: str, options: Any) -> dict[str, Any]:
    """What a kernel's content digest is made of: its TTIR without source locations, its lowering options."""
    return {"ttir": strip_locations(ttir),
            "options": {k: options.get(k) for k in LOWERING_OPTIONS if options.get(k) is not None}}


def kernel_digest(ttir: str, options: Any) -> str:
    """A kernel's content digest (`digest_parts`). The one definition: the tuned database (`agents/tuned.py`)
    keys its records by it too."""
    return hashlib.sha256(json.dumps(digest_parts(ttir, options), sort_keys=True, default=str).encode()).hexdigest()


def _options_dict(options: Any) -> dict[str, Any]:
    return dict(options) if isinstance(options, dict) else dict(getattr(options, "__dict__", {}))


class _Deployment:
    """The installed hook, listener and launch watch, and what they saw (one per process)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.kernels = {k["digest"]: k for k in spec["kernels"]}
        self.names: dict[str, list[dict[str, Any]]] = {}  # a name may have several deployed binaries (specialisations)
        for k in spec["kernels"]:
            self.names.setdefault(k["name"], []).append(k)
        self.failures: list[str] = []
        self.applied: dict[str, int] = {}  # digest -> compiles that took the rewritten levels
        self.launched: set[str] = set()  # the rewritten binaries (cubin SHA-256) launched
        self.last: dict[str, bool] = {}  # name -> whether its last launch ran the rewritten binary
        self.lock = threading.Lock()
        self.active = False  # inside a scope (`_Scope`): the hook, the listener and the launch watch act
        self.listener_fn: Any = None  # what `_kstrata_ir_install` installed, checked on entering a scope
        self.run_property: Any = None
        self.cache_dir = os.path.join(tempfile.gettempdir(), f"kstrata-ir-{spec['digest'][:20]}", "triton-cache")

    # -- the compile side ----------------------------------------------------------------------
    def hook(self, backend: Any, stages: dict[str, Any], options: Any, language: Any, capability: Any) -> None:
        state: dict[str, Any] = {"kernel": None}
        for level in list(stages):
            stages[level] = self._wrap(level, stages[level], state, options)

    def _wrap(self, level: str, original: Any, state: dict[str, Any], options: Any) -> Any:
        def stage(src: Any, metadata: dict[str, Any]) -> Any:
            out = original(src, metadata)
            if level == "ttir":
                state["kernel"] = self.kernels.get(kernel_digest(str(out), _options_dict(options)))
            kernel = state["kernel"]
            if kernel is None or level not in kernel["levels"]:
                return out
            data = kernel["levels"][level]
            if level == "cubin":
                metadata.update(kernel["metadata_changes"])
                with self.lock:
                    self.applied[kernel["digest"]] = self.applied.get(kernel["digest"], 0) + 1
                return base64.b64decode(data)
            return _parse_mlir(data, level, out) if level in ("ttir", "ttgir") else data

        return stage

    def listener(self, *, src: Any, metadata: dict[str, Any], metadata_group: dict[str, str], times: Any,
                 cache_hit: bool) -> None:
        name = str(metadata.get("name", ""))
        ttir_path = next((p for f, p in metadata_group.items() if f.endswith(".ttir")), None)
        if ttir_path is None:
            if name in self.names:
                self._fail(f"kernel {name}: compiled without its TTIR in the cache, so it cannot be shown to be "
                           "the deployed one")
            return
        with open(ttir_path) as fh:
            kernel = self.kernels.get(kernel_digest(fh.read(), metadata))
        if kernel is None:
            return
        cubin_path = next((p for f, p in metadata_group.items() if f.endswith(".cubin")), None)
        got = _file_digest(cubin_path) if cubin_path else "none"
        if got != kernel["cubin_sha256"]:
            how = "a cache hit returned" if cache_hit else "the compile made"
            self._fail(f"kernel {kernel['name']} ({kernel['pipeline']}): {how} a binary other than the rewritten "
                       f"one (sha256 {got[:16]}, expected {kernel['cubin_sha256'][:16]})")

    def _fail(self, why: str) -> None:
        with self.lock:
            self.failures.append(why)
        raise IrDeployError(f"kstrata ir deployer: {why}")

    # -- the launch side -----------------------------------------------------------------------
    def watch(self, kernel: Any) -> None:
        name = getattr(kernel, "name", None)
        deployed = self.names.get(name) if isinstance(name, str) else None
        if deployed is None or not isinstance(name, str):
            return
        sha = getattr(kernel, "_kstrata_ir_sha", None)
        if sha is None:
            cubin = kernel.asm.get("cubin") if hasattr(kernel, "asm") else None
            sha = hashlib.sha256(cubin).hexdigest() if isinstance(cubin, bytes) else "none"
            kernel._kstrata_ir_sha = sha
        ok = any(k["cubin_sha256"] == sha for k in deployed)
        with self.lock:
            self.last[name] = ok
            if ok:
                self.launched.add(sha)

    def begin_call(self) -> None:
        with self.lock:
            self.last.clear()

    def check_call(self) -> None:
        """After a checked call: every deployed name launched in it last ran the rewritten binary, and every
        deployed kernel has run in this process."""
        with self.lock:
            wrong = sorted(n for n, ok in self.last.items() if not ok)
            missing = [k for k in self.spec["kernels"] if k["cubin_sha256"] not in self.launched]
            failures = list(self.failures)
        if failures:
            raise IrDeployError("kstrata ir deployer: " + failures[0])
        if wrong:
            pipelines = ", ".join(k["pipeline"] for k in self.names[wrong[0]])
            raise IrDeployError(f"kstrata ir deployer: kernel {wrong[0]} was launched with a binary other than the "
                                f"rewritten one ({pipelines}): another compile of it (an "
                                "autotuning configuration, a stale cache) ran instead")
        if missing:
            raise IrDeployError(f"kstrata ir deployer: kernel {missing[0]['name']} ({missing[0]['pipeline']}) "
                                "was never launched with its rewritten binary in this process")


def _private_dir(path: str) -> None:
    """Make `path` (under the shared temporary directory) this user's own: its name is known from the spec, so
    another user could make it first and fill the cache the model's other kernels load their binaries from."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if hasattr(os, "getuid") and (not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.getuid()
                                  or st.st_mode & 0o022):
        raise IrDeployError(f"kstrata ir deployer: {path} is not a directory of this user's that only it may write "
                            "(remove it, or point TMPDIR elsewhere)")


def _file_digest(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _parse_mlir(text: str, level: str, like: Any) -> Any:
    from triton._C.libtriton import ir

    fd, path = tempfile.mkstemp(prefix="kstrata-ir-", suffix=f".{level}")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        module = ir.parse_mlir_module(path, like.context)
    finally:
        os.unlink(path)
    module.context = like.context
    return module


#: The deployments installed in this process, by their spec's digest: the measurement times two `ir` candidates in
#: one process once one of them is the incumbent (each acts only inside its own model's scope).
_DEPLOYMENTS: dict[str, _Deployment] = {}
#: The listener and the `CompiledKernel.run` property, installed once per process for all deployments.
_INSTALLED: dict[str, Any] = {}
#: The deployed kernel names of all deployments: the one look-up `CompiledKernel.run` adds to another model's
#: launches in the process (the baseline timed beside this candidate), so that it does not carry this one's watch.
_NAMES: set[str] = set()


def _kstrata_ir_install(spec: dict[str, Any]) -> _Deployment:
    """The deployment of `spec` in this process (one per spec); the listener and launch watch it acts through
    (idle outside a scope) are installed with the first."""
    dep = _DEPLOYMENTS.get(spec["digest"])
    if dep is not None:
        return dep
    from triton import knobs
    from triton.compiler.compiler import CompiledKernel

    dep = _Deployment(spec)
    _private_dir(os.path.dirname(dep.cache_dir))
    os.makedirs(dep.cache_dir, mode=0o700, exist_ok=True)
    if not _INSTALLED:
        previous = knobs.compilation.listener

        def listener(**kw: Any) -> None:
            if previous is not None:
                previous(**kw)
            for d in list(_DEPLOYMENTS.values()):
                if d.active:
                    d.listener(**kw)

        knobs.compilation.listener = listener
        # Every Python launch path goes through `CompiledKernel.run` (the JIT reads it per launch, Inductor's
        # launcher takes it once in `make_launcher`); `launch_metadata` is not: Inductor's launcher calls it only
        # when `knobs.runtime.launch_enter_hook` (a HookChain by default) was set when the launcher was made.
        original = CompiledKernel.run

        def run(self: Any) -> Any:
            launcher = original.fget(self)
            name = getattr(self, "name", None)
            if name not in _NAMES:
                return launcher
            deps = [d for d in list(_DEPLOYMENTS.values()) if name in d.names]

            def watched(*args: Any) -> Any:
                for d in deps:
                    if d.active:
                        d.watch(self)
                return launcher(*args)

            return watched

        CompiledKernel.run = property(run)
        _INSTALLED.update(listener=listener, run=CompiledKernel.run)
    dep.listener_fn, dep.run_property = _INSTALLED["listener"], _INSTALLED["run"]
    _DEPLOYMENTS[spec["digest"]] = dep
    _NAMES.update(dep.names)
    return dep


#: Inductor settings inside the scope (see the module docstring).
_INDUCTOR = {"compile_threads": 1, "fx_graph_cache": False, "bundle_triton_into_fx_graph_cache": False,
             "use_static_cuda_launcher": False}


class _Scope:
    """While a ModelNew method runs: the stages hook, the deployment's cache directory and (`inductor`)
    Inductor's settings, restored after; re-entrant (a forward inside a forward keeps the outer scope).
    After an instance's checked calls the scope is `inductor=False`: with Inductor's settings a scope cost
    23 us, without them 4 us (this shared 2-core CPU machine, 2026-12-02), which the timed calls carry, and
    those settings only matter while a compile happens (a recompile after the checked calls compiles without
    them; a launch of it through `CompiledKernel.run` that is not the rewritten binary of a deployed name still
    raises after that call, but one through Inductor's static launcher is not seen)."""

    _MISSING = object()

    def __init__(self, dep: _Deployment, *, clear: bool = False, inductor: bool = True) -> None:
        self.dep, self.clear, self.inductor = dep, clear, inductor
        self.saved: Any = None

    def __enter__(self) -> None:
        from triton import knobs

        if self.dep.active:
            return
        hook = knobs.runtime.add_stages_inspection_hook
        if hook is not None and hook != self.dep.hook:
            raise IrDeployError("kstrata ir deployer: another Triton stages hook is installed; the rewritten kernels "
                                "cannot be deployed beside it")
        from triton.compiler.compiler import CompiledKernel

        if knobs.compilation.listener is not self.dep.listener_fn or \
                CompiledKernel.__dict__.get("run") is not self.dep.run_property:
            raise IrDeployError("kstrata ir deployer: Triton's compilation listener or CompiledKernel.run was replaced "
                                "after the deployer installed its checks; the deployment cannot be proven")
        inductor: dict[str, Any] = {}
        if self.inductor:
            from torch._inductor import config as inductor_config

            inductor = {k: getattr(inductor_config, k) for k in _INDUCTOR if hasattr(inductor_config, k)}
        # the knob's own value (set or not) and the environment variable its setter also writes
        self.saved = (hook, knobs.cache.__dict__.get("dir", self._MISSING), os.environ.get("TRITON_CACHE_DIR"),
                      inductor)
        try:  # `__exit__` does not run when `__enter__` raises: undo here what was set
            for k in inductor:
                setattr(inductor_config, k, _INDUCTOR[k])
            # the knob, not the environment variable its setter also writes: a process started in the scope (an
            # autotuning or compile worker) has no hook, and would fill this deployment's cache with the originals
            knobs.cache.__dict__["dir"] = self.dep.cache_dir
            knobs.runtime.add_stages_inspection_hook = self.dep.hook
            if self.clear:
                _clear_inductor_caches()
            self.dep.active = True
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        if self.saved is None:
            return
        from triton import knobs

        hook, raw_dir, env_dir, inductor = self.saved
        self.saved = None
        self.dep.active = False
        try:
            if self.clear:
                _clear_inductor_caches()
        finally:
            self._restore(knobs, hook, raw_dir, env_dir, inductor)

    def _restore(self, knobs: Any, hook: Any, raw_dir: Any, env_dir: str | None, inductor: dict[str, Any]) -> None:
        knobs.runtime.add_stages_inspection_hook = hook
        if raw_dir is self._MISSING:
            knobs.cache.__dict__.pop("dir", None)
        else:
            knobs.cache.__dict__["dir"] = raw_dir
        if env_dir is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = env_dir
        if inductor:
            from torch._inductor import config as inductor_config

            for k, v in inductor.items():
                setattr(inductor_config, k, v)


def _clear_inductor_caches() -> None:
    try:
        from torch._inductor.async_compile import CompiledTritonKernels
        from torch._inductor.codecache import PyCodeCache
    except ImportError:  # an Inductor without these caches has nothing to clear
        return
    CompiledTritonKernels.cache_clear()  # type: ignore[no-untyped-call]
    PyCodeCache.cache_clear()


def _kstrata_ir_checked(cls: Any, dep: _Deployment) -> Any:
    """`cls` (the incumbent's ModelNew) with its `__init__` and `forward` run in the deployment's scope, and its
    first `VERIFY_CALLS` calls per instance checking the deployment. Wrapped in place, not subclassed: a
    subclass bound to the name `ModelNew` made `super(ModelNew, self).__init__()` in the class call itself."""
    init, forward = cls.__init__, cls.forward

    @functools.wraps(init)
    def checked_init(self: Any, *args: Any, **kwargs: Any) -> None:
        with _Scope(dep):
            init(self, *args, **kwargs)

    @functools.wraps(forward)
    def checked_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls = self.__dict__.get("_kstrata_ir_calls", 0)
        if calls >= VERIFY_CALLS:
            with _Scope(dep, inductor=False):
                out = forward(self, *args, **kwargs)
            if False in dep.last.values():  # a recompile after the checks launched another binary of a name
                dep.check_call()
            return out
        with _Scope(dep, clear=calls == 0):
            dep.begin_call()
            out = forward(self, *args, **kwargs)
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()
            dep.check_call()
        self.__dict__["_kstrata_ir_calls"] = calls + 1
        return out

    cls.__init__, cls.forward = checked_init, checked_forward
    return cls
