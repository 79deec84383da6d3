"""`torch.compile(model, backend="kstrata")`: Inductor, with every Triton kernel it generates routed
through a kstrata pass pipeline by the candidate engine (`kstrata.agents.engine`).

The backend compiles with Inductor and installs, process-wide, Triton's stages inspection hook
(`triton.knobs.runtime.add_stages_inspection_hook`). For each Triton compile the hook watches the stages:
when Triton has made the first level the pipeline has passes for (the *rewrite level*), the kernel as it
is then (every level so far and Triton's metadata) becomes an engine base (`Engine.add_stage_kernel`,
digested by content) and the rewrite a candidate, `Candidate(base, level, PipelineEdit(pipeline))`, whose
key holds the pipeline and the Triton, ptxas, LLVM and kstrata versions. `Engine.build` makes it in a
worker process (the original's lower levels rebuilt with Triton's stages, so it is Triton's own binary; the
pipeline with its pass verifiers; the levels below each changed one rebuilt; the engine's static checks:
signature and the PTX entry or code-object ABI), or answers from the engine cache when any process built
that candidate before (the record says `cached`, the log says so), and deduplicates it by binary digest.
Only a build whose checks passed is deployed: from the rewrite level down, each of Triton's stage outputs
is replaced by the built level (Triton's own stage still runs, so its metadata follows the rewritten
code) and the launch metadata the passes changed (`num_warps`, `ptx_options`, …) is applied at the binary.
A build that failed (a pass's verifier, a static check, a crash of its worker) is not deployed: Triton's
own output is used, and the record (`fallback`) and a warning say why. An edit that changes nothing is
`unchanged`. The rewrites are unproven (static checks only): `kstrata verify` with a launch record gives
dynamic evidence.

Kernels compiled through kstrata are also cached by Triton in a directory keyed by the pipeline and the
tool versions (`<cache_dir>/<hash>/`), so a second run of the same model with the same `cache_dir` finds
them there and Triton does not compile at all; the engine's cache answers when Triton compiles again (a
new `cache_dir`, another model with the same kernel, another process or machine sharing the engine
cache). The hook and that cache directory are set only while the backend compiles a graph; Inductor
compiles in this process then (`compile_threads=1`, FX graph cache and autotuning cache off) so the hook sees
every kernel and every autotuning config, and Inductor's autotuner chooses among the deployed variants; its
static launcher is off (it would load the original's binary from Inductor's cache: same Triton hash). A
kernel Inductor compiles lazily after that (at a first call) is Triton's own.

Options (`options={...}` or environment variables):
- `pipeline` / `KSTRATA_PIPELINE`: the pass pipeline (default: `llir(noalias-args{assume=true}),ptx(cache-hints)`;
  `noalias-args` holds because Inductor never passes overlapping buffers to one kernel except through a
  single in-out pointer).
- `verify` / `KSTRATA_VERIFY`: `static` (default) or `none`. The engine always runs the pass verifiers and
  its static checks before a rewrite is deployed; `none` no longer turns them off (the backend says so once).
- `cache_dir` / `KSTRATA_CACHE_DIR`: where Triton caches the kernels compiled through kstrata (default
  `~/.cache/kstrata/triton`).
- `engine_cache` / `KSTRATA_ENGINE_CACHE`: the candidate engine's cache (default `~/.cache/kstrata/engine`).
- `report` / `KSTRATA_REPORT`: a JSON-lines file, one line per kernel (rewritten or not, and why; with the
  engine's candidate key, whether the build came from its cache and which build it duplicates).
- `only_inductor` / `KSTRATA_ONLY_INDUCTOR`: rewrite only Inductor's kernels (`triton_*`), default true.
- `tuned` / `KSTRATA_TUNED`: a tuned database (`kstrata optimize CACHE --out OUT` writes `OUT/tuned`;
  `kstrata tuned list`). A kernel whose content digest (location-free TTIR and lowering options), target
  and tool versions match a record gets the tuned variant's levels and binary (and its launch metadata);
  every other kernel is left exactly as Inductor made it: with `tuned` the pipeline is off unless
  `pipeline` is given too. The report says, per kernel, `tuned` (with the edit) or why none applied.
  Inductor autotunes a kernel over a few configs and the tuned variant is one of them; when its record shows
  it beat every other config Inductor compiled for that kernel here (`TunedRecord.beats_siblings`, each
  config matched by content digest), Inductor's autotuner is made to use it: after `CachingAutotuner.
  precompile` only the tuned config's launcher is kept (`_Session.choose_config`). Otherwise (a record made
  before configs were compared, or a config here it was not measured against) the autotuner chooses among
  all of them as before. Either way the report has an `autotune` line for the kernel saying which. The tuned
  config may be another than the one the recorded program ran (the compiled search starts from the fastest
  config): a variant of it, or that config as Inductor compiled it (`config(KEY)`, no edit: its levels are
  Inductor's own, and only the autotuner's restriction changes what runs); the recorded config is then one
  of those the record beat.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
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
               "report": "KSTRATA_REPORT", "only_inductor": "KSTRATA_ONLY_INDUCTOR", "tuned": "KSTRATA_TUNED",
               "engine_cache": "KSTRATA_ENGINE_CACHE"}


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
    engine_cache: str | None = None

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
        if config.pipeline and config.engine_cache:
            try:  # the engine's cache cannot be made: an error now, not a fallback of every kernel
                Path(config.engine_cache).expanduser().mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BackendOptionError(f"engine_cache {config.engine_cache!r} cannot be created: "
                                         f"{exc.strerror or exc}") from None
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
    #: "rewritten", "unchanged", "fallback", "tuned"; "autotune": what became of Inductor's autotuning of a kernel
    #: with a tuned config (restricted to it, or why not)
    status: str
    passes: list[str] = field(default_factory=list)
    reason: str = ""
    #: The engine's side of a rewrite: the candidate's key, its base digest and level, whether the build came
    #: from the engine cache (`cached`), and the key of the earlier build with the same binary (`duplicate_of`).
    engine: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Variant:
    """Levels to deploy in place of Triton's stage outputs (an engine build's, or a tuned variant's), and
    the launch metadata they change."""

    levels: Mapping[str, bytes]
    metadata_changes: Mapping[str, Any]

    def level(self, ext: str) -> bytes | None:
        return self.levels.get(ext)


def _triton_metadata(metadata: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Triton's metadata as it writes it (the target as a dict), with the kernel's name."""
    data: dict[str, Any] = json.loads(json.dumps(dict(metadata), default=vars))
    return {**data, "name": name}


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
        self._said: set[str] = set()
        self._engine: Any = None
        self._engine_lock = threading.Lock()
        if config.verify == "none" and self.pipeline is not None:
            log.warning("kstrata: verify=none no longer turns checks off: the candidate engine runs the pass "
                        "verifiers and its static checks before any rewrite is deployed")

    @property
    def engine(self) -> Any:
        """The candidate engine (made on the first rewrite; its worker pool lives as long as the session)."""
        with self._engine_lock:
            if self._engine is None:
                from kstrata.agents.engine import Engine

                self._engine = Engine(self.config.engine_cache)
            return self._engine

    def record(self, rec: KernelRecord) -> None:
        with self.lock:
            self.records.append(rec)
        if rec.status == "fallback":
            log.warning("kstrata: kernel %s left unmodified: %s", rec.name, rec.reason)
        elif rec.engine.get("cached"):
            log.info("kstrata: kernel %s: %s from the engine cache (candidate %s)", rec.name, rec.status,
                     rec.engine.get("candidate"))
        if self.config.report:
            path = Path(self.config.report)
            path.parent.mkdir(parents=True, exist_ok=True)
            with self.lock, path.open("a") as f:
                f.write(json.dumps(dataclasses.asdict(rec)) + "\n")

    def choose_config(self, autotuner: Any) -> None:
        """After Inductor's `CachingAutotuner` compiled its configs: when one is a tuned variant whose record shows
        it beat each of the other configs compiled here (matched by content digest), keep only its launcher, so
        the autotuner uses it; otherwise leave the choice to the autotuner. Either way the report says which.
        On the H200 (2026-12-03) the MLP's silu kernel, tuned 1.215x in its 8-warp config, was compiled in and
        never ran: Inductor's autotuner chose the 4-warp config, and end to end was 1.000x."""
        from kstrata.agents.tuned import compiled_binary_digest, compiled_content_digest

        if self.tuned is None:
            return
        results, launchers = getattr(autotuner, "compile_results", None), getattr(autotuner, "launchers", None)
        if not isinstance(results, list) or not isinstance(launchers, list):
            self._say_once("autotuner-api", "kstrata: this torch's Inductor CachingAutotuner has no compile_results "
                           "and launchers lists: tuned configs are compiled in, but its autotuner chooses freely")
            return
        tuned = [(r, rec) for r in results
                 if (rec := self.tuned.by_binary(compiled_binary_digest(getattr(r, "kernel", None)))) is not None]
        if not tuned or len(results) < 2:
            return  # no tuned config, or nothing to choose between
        first = tuned[0][1]
        words = f"{first.kernel}: the tuned variant is one of the {len(results)} configs Inductor's autotuner compiled"
        chosen = [(r, rec) for r, rec in tuned if rec.beats_siblings]
        others = [r for r in results if all(r is not c for c, _ in chosen)]
        uncovered = [o for o in others if any(compiled_content_digest(getattr(o, "kernel", None)) not in rec.sibling_contents
                                              for _, rec in chosen)]
        keep = [launcher for launcher in launchers if any(getattr(launcher, "config", None) is r.config for r, _ in chosen)]
        why = ("its record was not measured against the kernel's other configs (a record made before they were "
               "compared)" if not chosen else
               f"{len(uncovered)} of the other configs compiled here were not among those it was measured against"
               if uncovered else
               "no launcher of the tuned config was found" if len(keep) != len(chosen) else None)
        if why is not None:
            self.record(KernelRecord(first.kernel, first.target, "autotune", [first.edit],
                                     f"{words}; the autotuner chooses among them: {why}"))
            return
        autotuner.compile_results = [r for r, _ in chosen]
        autotuner.launchers = keep
        rec = chosen[0][1]
        beaten = "; ".join(f"{t.get('config', {}).get('words', '?')}: {t.get('speedup') or 0:.3f}x"
                           for t in rec.siblings or ())
        self.record(KernelRecord(rec.kernel, rec.target, "autotune", [rec.edit],
                                 f"{words}; restricted to the tuned config ({(rec.config or {}).get('words', '?')}): "
                                 f"on their own launch records it beat each other config ({beaten})"))

    def _say_once(self, key: str, message: str) -> None:
        with self.lock:
            if key in self._said:
                return
            self._said.add(key)
        log.warning(message)

    def hook(self, backend: Any, stages: dict[str, Callable[..., Any]], options: Any, language: Any,
             capability: Any) -> None:
        """Triton's stages inspection hook: wrap the stages the pipeline has passes for."""
        from kstrata.ir.target import Target

        target = Target.from_triton(backend.target)
        state: dict[str, Any] = {"levels": {}, "name": None, "skip": None, "changed": [], "failed": None,
                                 "tuned": None, "tuned_why": None, "built": None, "engine": {}}
        with_passes = {s.level for s in self.pipeline.stages if s.passes} if self.pipeline else set()
        # the rewrite level: the first of Triton's stages the pipeline has passes for
        first = next((lv for lv in stages if lv in with_passes), None)
        for level in list(stages):
            original = stages[level]
            stages[level] = self._wrap(level, original, target, state, first, backend, options, capability)

    def _wrap(self, level: str, original: Callable[..., Any], target: Any, state: dict[str, Any],
              first: str | None, backend: Any, options: Any, capability: Any) -> Callable[..., Any]:
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
                out = self._deployed_level(state["tuned"].level(level), state["tuned"].record.metadata_changes,
                                           level, out, metadata)
            elif state["built"] is not None:  # below the rewrite level: the engine's build, level by level
                out = self._deployed_level(state["built"].level(level), state["built"].metadata_changes, level, out,
                                           metadata)
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
            if state["skip"] or state["failed"] or state["built"] is not None or level != first:
                return out
            return self._rewrite(level, out, target, state, metadata)

        return stage

    @staticmethod
    def _deployed_level(data: bytes | None, changes: Mapping[str, Any], level: str, out: Any,
                        metadata: dict[str, Any]) -> Any:
        """A deployed variant's `level` in the form Triton's next stage takes (a module, text, bytes); at the
        binary, the launch metadata it changes (num_warps, shared, ptx options, …)."""
        if data is None:
            return out
        if isinstance(out, bytes):
            metadata.update(changes)
            return data
        text = data.decode()
        return _parse_mlir(text, level, out) if level in ("ttir", "ttgir") else text

    def _rewrite(self, level: str, out: Any, target: Any, state: dict[str, Any], metadata: dict[str, Any]) -> Any:
        """At the rewrite level: the candidate through the engine; deploy its build when its checks passed."""
        from kstrata.agents.engine import Candidate, PipelineEdit, Provenance
        from kstrata.ir.bundle import KernelBundle
        from kstrata.ir.triton_layout import load_any

        bundle = KernelBundle(state["name"], target, dict(state["levels"]), _triton_metadata(metadata, state["name"]))
        try:
            engine = self.engine
            base = engine.add_stage_kernel(bundle)
            candidate = Candidate(base, level, PipelineEdit(self.config.pipeline),
                                  provenance=Provenance("torch.compile backend", None, "ir"))
            built = engine.build(candidate)
            state["engine"] = {"candidate": built.key, "base": base, "level": level, "cached": built.cached,
                               "duplicate_of": built.duplicate_of}
            if built.status == "failed":  # not deployed: Triton's own output, and the record says why
                state["failed"] = f"the candidate engine refused the rewrite at {level}: {built.error}"
                return out
            if built.status == "unchanged":
                return out
            loaded, errors = load_any(engine.built_entry(built))
            if errors or not loaded:
                raise errors[0] if errors else KstrataError("the engine's build left no kernel")
        except Exception as exc:  # a kernel is never lost: keep Triton's output and say why
            state["failed"] = f"{level}: the candidate engine could not build the rewrite: {type(exc).__name__}: {exc}"
            return out
        new = loaded[0]
        levels = {lv: art if isinstance(art, bytes) else str(art).encode() for lv, art in new.levels.items()}
        state["built"] = _Variant(levels, dict(built.metadata_changes))
        state["levels"].update({lv: str(art) for lv, art in new.levels.items() if not isinstance(art, bytes)})
        state["changed"] = [str(r.get("spelling")) for r in built.passes if r.get("status") == "changed"]
        return self._deployed_level(state["built"].level(level), {}, level, out, metadata)

    def _finish(self, state: dict[str, Any], target: Any) -> None:
        if state["tuned"] is not None:
            r = state["tuned"].record
            over = (f"; {r.speedup_vs_recorded:.3f}x over the config the recorded program ran "
                    f"({(r.recorded_config or {}).get('words', '?')})" if r.speedup_vs_recorded else "")
            what = (f"config choice {r.slug}: this config as Inductor compiled it ({(r.config or {}).get('words', '?')})"
                    if r.config_choice else f"tuned variant {r.slug}: {r.speedup:.3f}x over its config's original")
            self.record(KernelRecord(r.kernel, str(target), "tuned", [r.edit], f"{what}{over}, measured on {r.device} "
                                     f"({r.measured_at})"))
            return
        if self.tuned is not None and state["tuned_why"] and state["skip"] != "not an Inductor kernel" \
                and not state["changed"]:
            self.record(KernelRecord(state["name"] or "?", str(target), "unchanged", [], state["tuned_why"]))
            return
        if state["skip"]:
            return
        engine = dict(state["engine"])
        if state["failed"]:
            self.record(KernelRecord(state["name"] or "?", str(target), "fallback", state["changed"], state["failed"],
                                     engine))
        elif state["built"] is not None:
            # Only the pass verifiers and the engine's static checks ran: the rewrite is unproven (`kstrata
            # verify` with a launch record gives it dynamic evidence), never counted as verified.
            where = "; built by the candidate engine" + (" (from the engine cache)" if engine.get("cached") else "") + \
                (f", the same binary as build {engine['duplicate_of']}" if engine.get("duplicate_of") else "")
            self.record(KernelRecord(state["name"], str(target), "rewritten", state["changed"],
                                     "verification: unproven (static checks only)" + where, engine))
        else:
            self.record(KernelRecord(state["name"] or "?", str(target), "unchanged", [], "", engine))


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
def _autotuner_choice(session: _Session) -> Iterator[None]:
    """While compiling with a tuned database: `CachingAutotuner.precompile` (compile every config, make their
    launchers; in torch 2.11 and 2.13) followed by `session.choose_config`, then restore it."""
    if session.tuned is None:
        yield
        return
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner

        original = CachingAutotuner.precompile
    except (ImportError, AttributeError) as exc:
        import torch

        session._say_once("autotuner-api", f"kstrata: Inductor's CachingAutotuner.precompile is not there in torch "
                          f"{torch.__version__} ({exc}): tuned configs are compiled in, but its autotuner chooses freely")
        yield
        return

    @functools.wraps(original)
    def precompile(autotuner: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(autotuner, *args, **kwargs)
        if not kwargs.get("warm_cache_only", args[0] if args else False):  # a compile worker's warm-up: no launchers
            session.choose_config(autotuner)
        return out

    CachingAutotuner.precompile = precompile  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        CachingAutotuner.precompile = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _installed(config: BackendConfig) -> Iterator[_Session]:
    """While compiling: the stages hook and the pipeline-keyed Triton cache directory (and, with a tuned
    database, the autotuner's choice of a tuned config: `_autotuner_choice`), then restore them.

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
    with knobs.cache.scope(), knobs.runtime.scope(), _autotuner_choice(session):
        knobs.cache.dir = str(cache)
        knobs.runtime.add_stages_inspection_hook = session.hook
        try:
            yield session
        finally:
            CompiledTritonKernels.cache_clear()  # type: ignore[no-untyped-call]
            PyCodeCache.cache_clear()


def _inputs_on_gpu(example_inputs: list[Any]) -> bool:
    import torch

    return any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)


def kstrata_backend(gm: Any, example_inputs: list[Any], options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """The torch.compile backend: Inductor, with Triton kernels rewritten by the configured pipeline."""
    global _said_no_triton
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    config = BackendConfig.from_options(options)
    if not _inputs_on_gpu(example_inputs):
        if not _said_no_triton:
            log.warning("kstrata: the inputs are not on a GPU, so Inductor generates no Triton kernels; "
                        "compiling with Inductor unchanged")
            _said_no_triton = True
        return cast("Callable[..., Any]", compile_fx(gm, example_inputs))
    # In this process (the hook is not in Inductor's compile workers), without the FX graph cache (a hit
    # would load kernels compiled without the pipeline) and without Inductor's autotuning cache: its best
    # config was chosen among kernels as Inductor made them (a plain torch.compile of the model before, in
    # this process or another), so with it Inductor compiles only that config and a tuned or rewritten
    # variant of another never competes (on the H200 the MLP's silu kernel, tuned at 1.23x in its 8-warp
    # config, was not deployed: the cached choice was the 4-warp config, which the recorded run had not
    # chosen). Without it every config is compiled here, through the hook, and benchmarked as deployed.
    # And without Inductor's static launcher: it loads the cubin from `$TRITON_CACHE_DIR/<hash>/`, Inductor's own
    # cache, not the directory Triton compiled into here, and the hook is not part of Triton's cache key, so a
    # deployed kernel has the original's hash: the original's binary (a plain torch.compile of the same model
    # put it there) would be launched with the deployed variant's launch metadata (its num_warps, its shared
    # memory). Triton's own launcher runs the binary Triton loaded.
    with _installed(config), inductor_config.patch(compile_threads=1, fx_graph_cache=False,
                                                   autotune_local_cache=False, autotune_remote_cache=False,
                                                   use_static_cuda_launcher=False):
        compiled = cast("Callable[..., Any]", compile_fx(gm, example_inputs))
    return compiled


def report() -> list[dict[str, Any]]:
    """What the backend did to every kernel so far in this process."""
    return [dataclasses.asdict(r) for s in _sessions.values() for r in s.records]
