"""The optimizer's `ir` space: the standalone deployer makes Triton compile the rewritten kernel in a fresh
process (also after a warm cache hit of the original), raises when the rewritten kernel is not what Triton
returns or launches, the proposer says why it proposes nothing on the CPU, and its plumbing from a recorded
program's kernels to a standalone TaskCandidate. On a GPU: level1/19 (LayerNorm, Inductor) end to end."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kstrata.agents.optimize.irspace import IrPassProposer, IrWinner, Prepared, original_digest, render_ir_source

from .conftest import has_cuda

KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def ir_rowsum(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + row, tl.sum(x, axis=0))
'''

#: Compiles the kernel for sm_90 on the CPU; with MODEL set, inside that model_new.py's forward (its deployer
#: acts there), then "launches" it (LAUNCH: the compiled kernel, `original`: the un-rewritten binary as a stale
#: cache would give it, `none`: nothing).
COMPILE = '''
import hashlib, importlib.util, json, os, sys
sys.path.insert(0, os.environ["KDIR"])
model = None
if os.environ.get("MODEL"):
    spec = importlib.util.spec_from_file_location("model_new", os.environ["MODEL"])
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import CompiledKernel
from kern import ir_rowsum
src = ASTSource(ir_rowsum, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 1024})
res = {}


def build():
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    res.update(ptx=hashlib.sha256(k.asm["ptx"].encode()).hexdigest(), cubin=hashlib.sha256(k.asm["cubin"]).hexdigest(),
               num_warps=k.metadata.num_warps, cache_dir=knobs.cache.dir)
    return k


if model is None:
    build()
else:
    def on_forward():
        k = build()
        knobs.runtime.launch_enter_hook = None  # Triton's launch_metadata then touches no driver (none on the CPU)
        launch = os.environ.get("LAUNCH", "rewritten")
        if launch == "original":
            k = CompiledKernel(src, json.load(open(os.environ["ORIGINAL_GROUP"]))["child_paths"], "stale")
        if launch != "none":
            k._run = lambda *args: None  # the driver's launcher (none on the CPU)
            if os.environ.get("LAUNCHER") == "inductor":
                # Inductor's launcher without a launch_enter_hook: `bin.run` taken once, launch_metadata never called
                runner = k.run
                runner(1, 1, 1, 0, None, None, None, None, None)
            else:  # Triton's JIT: launch_metadata, then run
                k.launch_metadata((1, 1, 1), 0)
                k.run(1, 1, 1, 0, None, None, None, None, None)

    model.ON_FORWARD = on_forward
    try:
        model.ModelNew()(1.0)
        res["forward"] = "ok"
    except Exception as exc:
        res["forward"] = type(exc).__name__ + ": " + str(exc)
    res["after_dir"] = knobs.cache.dir  # restored once the forward is over
    res["after_hook"] = knobs.runtime.add_stages_inspection_hook is None
print(json.dumps(res))
'''

MODEL = '''
import torch

ON_FORWARD = None


class ModelNew(torch.nn.Module):
    def forward(self, x):
        if ON_FORWARD is not None:
            ON_FORWARD()
        return x
'''


def _child(tmp: Path, cache: Path, *, model: Path | None = None, tmpdir: Path | None = None,
           **env: str) -> dict[str, Any]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_KERNEL", "TRITON_OVERRIDE", "TRITON_ALWAYS"))}
    e.update(KDIR=str(tmp), TRITON_CACHE_DIR=str(cache), MODEL=str(model or ""), TMPDIR=str(tmpdir or tmp / "t"), **env)
    e.pop("TRITON_INTERPRET", None)
    Path(e["TMPDIR"]).mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, str(tmp / "compile.py")], capture_output=True, text=True, timeout=300,
                          env=e, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The kernel compiled on the CPU into a warm cache, and the engine's `num-warps{n=8}` build of it."""
    from kstrata.agents.engine import Candidate, Engine, PipelineEdit

    tmp = tmp_path_factory.mktemp("ir")
    (tmp / "kern.py").write_text(KERNEL)
    (tmp / "compile.py").write_text(COMPILE)
    cache = tmp / "warm-cache"
    first = _child(tmp, cache)
    entry = next(p.parent for p in cache.rglob("ir_rowsum.cubin"))
    with Engine(tmp / "engine") as engine:
        base = engine.add_kernel(entry)
        built = engine.build(Candidate(base, "ttgir", PipelineEdit("ttgir(num-warps{n=8})"), "reduction-order"))
    assert built.status == "changed" and built.entry, built.error
    name, digest = original_digest(entry)
    winner = IrWinner(name, digest, str(entry), built.entry, "ttgir(num-warps{n=8})", "reduction-order", "equivalent",
                      "gpu differential run (fake for this test)", 1.25, [1.2, 1.3], 10.0, 8.0, 0.9)
    built_files = {p.suffix[1:]: p for p in Path(built.entry).iterdir()}
    return {"tmp": tmp, "cache": cache, "entry": entry, "first": first, "winner": winner,
            "ptx": hashlib.sha256(built_files["ptx"].read_bytes()).hexdigest(),
            "cubin": hashlib.sha256(built_files["cubin"].read_bytes()).hexdigest()}


def _model(r: dict[str, Any], path: Path) -> Path:
    path.write_text(render_ir_source(MODEL, [r["winner"]]))
    return path


def test_the_deployer_makes_a_fresh_process_compile_the_rewritten_kernel_after_a_warm_hit(rewritten: dict[str, Any]) -> None:
    r = rewritten
    assert r["first"]["num_warps"] == 4 and r["first"]["ptx"] != r["ptx"]
    again = _child(r["tmp"], r["cache"])  # the warm cache answers with the original
    assert again["cubin"] == r["first"]["cubin"]
    model = _model(r, r["tmp"] / "model_new.py")
    for attempt in ("compiles", "hits its own cache"):
        got = _child(r["tmp"], r["cache"], model=model, tmpdir=r["tmp"] / "t-deploy")
        assert got["forward"] == "ok", (attempt, got)
        assert got["ptx"] == r["ptx"] and got["cubin"] == r["cubin"] and got["num_warps"] == 8, attempt
        assert Path(got["cache_dir"]).is_relative_to(r["tmp"] / "t-deploy")  # its own cache, never the user's
        assert got["after_dir"] == str(r["cache"]) and got["after_hook"]  # only while the model ran
    # without the deployer the user's cache is untouched and still answers with the original
    assert _child(r["tmp"], r["cache"])["cubin"] == r["first"]["cubin"]


def test_the_deployer_leaves_other_compiles_in_the_process_alone(rewritten: dict[str, Any], tmp_path: Path) -> None:
    r = rewritten
    model = _model(r, tmp_path / "model_new.py")
    script = (r["tmp"] / "compile.py").read_text().replace("if model is None:", "if True:", 1)
    other = tmp_path / "other.py"  # the deployer is installed (model_new imported), but the compile is outside it
    other.write_text(script.replace("    model.ON_FORWARD = on_forward", "    model.ON_FORWARD = None"))
    e = {**os.environ, "KDIR": str(r["tmp"]), "TRITON_CACHE_DIR": str(r["cache"]), "MODEL": str(model),
         "TMPDIR": str(tmp_path), "LAUNCH": "none"}
    proc = subprocess.run([sys.executable, str(other)], capture_output=True, text=True, timeout=300, env=e, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["cubin"] == r["first"]["cubin"] and got["num_warps"] == 4 and got["cache_dir"] == str(r["cache"])


def test_the_deployer_raises_when_triton_returns_the_original(rewritten: dict[str, Any], tmp_path: Path) -> None:
    r = rewritten
    model = _model(r, tmp_path / "model_new.py")
    spec = json.loads(ast.literal_eval(next(ln.split(" = ", 1)[1] for ln in model.read_text().splitlines()
                                            if ln.startswith("_KSTRATA_IR_SPEC = "))))
    tmpdir = tmp_path / "t"
    stale = tmpdir / f"kstrata-ir-{spec['digest'][:20]}" / "triton-cache"
    shutil.copytree(r["cache"], stale)  # the deployer's own cache holds the un-rewritten binary
    stale.parent.chmod(0o700)  # this user's, whatever the umask: only the stale binary is under test here
    got = _child(r["tmp"], r["cache"], model=model, tmpdir=tmpdir)
    assert got["forward"].startswith("IrDeployError") and "a cache hit returned" in got["forward"], got


@pytest.mark.parametrize("launcher", ["jit", "inductor"])
def test_the_deployer_checks_what_the_model_launches(rewritten: dict[str, Any], tmp_path: Path, launcher: str) -> None:
    r = rewritten
    model = _model(r, tmp_path / "model_new.py")
    group = next(r["entry"].glob("__grp__*.json"))
    ok = _child(r["tmp"], r["cache"], model=model, tmpdir=tmp_path / "t", LAUNCH="rewritten", LAUNCHER=launcher)
    assert ok["forward"] == "ok", ok
    stale = _child(r["tmp"], r["cache"], model=model, tmpdir=tmp_path / "t", LAUNCH="original",
                   ORIGINAL_GROUP=str(group), LAUNCHER=launcher)
    assert stale["forward"].startswith("IrDeployError") and "other than the rewritten" in stale["forward"], stale
    never = _child(r["tmp"], r["cache"], model=model, tmpdir=tmp_path / "t", LAUNCH="none")
    assert never["forward"].startswith("IrDeployError") and "never launched" in never["forward"], never


@pytest.fixture
def fresh_deployer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The deployer module with no deployment installed in this process, its installs undone after the test."""
    from triton import knobs
    from triton.compiler.compiler import CompiledKernel

    from kstrata.agents.optimize import deployer

    monkeypatch.setattr(CompiledKernel, "run", CompiledKernel.__dict__["run"])  # the install patches these two
    monkeypatch.setattr(knobs.compilation, "listener", None)
    monkeypatch.setattr(deployer, "_DEPLOYMENTS", {})
    monkeypatch.setattr(deployer, "_INSTALLED", {})
    monkeypatch.setattr(deployer, "_NAMES", set())
    monkeypatch.setattr(deployer.tempfile, "tempdir", str(tmp_path))
    return deployer


def _spec(digest: str, cubin: bytes) -> dict[str, Any]:
    return {"digest": digest * 64, "kernels": [{"name": "k", "digest": digest, "pipeline": f"p{digest}",
                                                 "cubin_sha256": hashlib.sha256(cubin).hexdigest()}]}


def _cached_kernel(name: str, cubin: bytes) -> Any:
    """A compiled kernel as Triton's cache gives it, with a launcher that does nothing (no driver here)."""
    from triton.compiler.compiler import CompiledKernel

    k = object.__new__(CompiledKernel)
    k.name, k.asm, k._run = name, {"cubin": cubin}, lambda *args: None
    return k


def test_the_deployer_wraps_a_model_new_that_names_itself_in_super(fresh_deployer: Any) -> None:
    deployer = fresh_deployer
    dep = deployer._kstrata_ir_install(_spec("a", b"A"))
    kernel = _cached_kernel("k", b"A")
    scope: list[bool] = []

    class ModelNew(torch.nn.Module):  # the KernelBench idiom: the class by its module-level name
        def __init__(self) -> None:
            super(ModelNew, self).__init__()  # noqa: UP008 -- the idiom under test
            scope.append(dep.active)

        def forward(self, x: Any) -> Any:
            scope.append(dep.active)
            kernel.run(1, 1, 1)
            return x

    ModelNew = deployer._kstrata_ir_checked(ModelNew, dep)  # what model_new.py's last line does
    model = ModelNew()
    assert model(2.0) == 2.0 and scope == [True, True] and type(model).__name__ == "ModelNew"


def test_the_deployer_refuses_a_cache_directory_others_may_write(fresh_deployer: Any, tmp_path: Path) -> None:
    deployer = fresh_deployer
    planted = tmp_path / f"kstrata-ir-{'a' * 20}"  # made before the model ran, writable by every user
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(deployer.IrDeployError, match="only it may write"):
        deployer._kstrata_ir_install(_spec("a", b"A"))
    planted.chmod(0o700)
    dep = deployer._kstrata_ir_install(_spec("a", b"A"))
    assert Path(dep.cache_dir).parent == planted


def test_a_launch_after_the_checked_calls_that_runs_another_binary_raises(fresh_deployer: Any) -> None:
    deployer = fresh_deployer
    dep = deployer._kstrata_ir_install(_spec("a", b"A"))
    kernels = {c: _cached_kernel("k", c) for c in (b"A", b"original")}
    launches = [b"A"] * deployer.VERIFY_CALLS + [b"A", b"original"]  # a recompile once the checks are over

    class Model(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            kernels[launches.pop(0)].run(1, 1, 1)
            return x

    model = deployer._kstrata_ir_checked(Model, dep)()
    for _ in range(deployer.VERIFY_CALLS + 1):
        model(1.0)
    with pytest.raises(deployer.IrDeployError, match="other than the rewritten"):
        model(1.0)


def test_the_deployer_scope_restores_the_process_when_entering_or_leaving_it_raises(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_deployer: Any) -> None:
    from torch._inductor import config as inductor_config
    from triton import knobs

    deployer = fresh_deployer
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "user-cache"))
    dep = deployer._kstrata_ir_install({"digest": "0" * 64, "kernels": []})

    def process() -> tuple[Any, ...]:
        return (knobs.cache.dir, os.environ.get("TRITON_CACHE_DIR"), knobs.runtime.add_stages_inspection_hook,
                inductor_config.fx_graph_cache, inductor_config.compile_threads, dep.active)

    before = process()
    for failing in (1, 2):  # the cache clearing on entering, then on leaving
        calls: list[int] = []

        def clear(failing: int = failing, calls: list[int] = calls) -> None:
            calls.append(1)
            if len(calls) == failing:
                raise RuntimeError("clearing failed")

        monkeypatch.setattr(deployer, "_clear_inductor_caches", clear)
        with pytest.raises(RuntimeError, match="clearing failed"):
            with deployer._Scope(dep, clear=True):
                assert knobs.cache.dir == dep.cache_dir and inductor_config.compile_threads == 1
                # a process started here (no hook in it) compiles into the user's cache, never the deployment's
                assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "user-cache")
        assert process() == before, failing
    monkeypatch.setattr(knobs.compilation, "listener", None)  # someone replaced the deployer's listener
    with pytest.raises(deployer.IrDeployError, match="listener"):
        with deployer._Scope(dep):
            pass
    assert process() == before


def _compile_rowsum(path: Path, **options: Any) -> Any:
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location(f"kern_{abs(hash(str(path)))}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = ASTSource(mod.ir_rowsum, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 1024})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def test_the_kernel_digest_matches_across_processes_and_tells_compile_options_apart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    from kstrata.agents.optimize.deployer import _options_dict, kernel_digest

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    for d, pad in (("a", ""), ("b", "\n# an Inductor cache elsewhere: other paths and lines\n\n")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "kern.py").write_text(pad + KERNEL)
    a, b = _compile_rowsum(tmp_path / "a" / "kern.py"), _compile_rowsum(tmp_path / "b" / "kern.py")
    assert a.asm["ttir"] != b.asm["ttir"]  # the locations differ
    digest = kernel_digest(a.asm["ttir"], a.metadata._asdict())
    assert kernel_digest(b.asm["ttir"], b.metadata._asdict()) == digest
    # the stages hook sees the options object, the recording the cache's JSON metadata: one digest
    options = make_backend(GPUTarget("cuda", 90, 32)).parse_options({})
    assert kernel_digest(a.asm["ttir"], _options_dict(options)) == digest
    assert kernel_digest(a.asm["ttir"], json.loads(json.dumps(a.metadata._asdict(), default=vars))) == digest
    for option, value in (("num_warps", 8), ("maxnreg", 128), ("launch_pdl", True), ("enable_reflect_ftz", False)):
        other = _compile_rowsum(tmp_path / "a" / "kern.py", **{option: value})
        assert kernel_digest(other.asm["ttir"], other.metadata._asdict()) != digest, option
    # num_ctas=2 does not compile this kernel for sm_90 here; its metadata alone must tell the kernels apart
    assert kernel_digest(a.asm["ttir"], {**a.metadata._asdict(), "num_ctas": 2}) != digest
    assert _compile_rowsum(tmp_path / "a" / "kern.py", launch_pdl=True).asm["ttir"] == a.asm["ttir"]  # TTIR alone collides


def test_two_ir_candidates_deploy_in_one_process_each_in_its_own_scope(fresh_deployer: Any) -> None:
    deployer = fresh_deployer

    # the incumbent (an ir candidate) and the next ir candidate, loaded by one measurement process
    a, b = deployer._kstrata_ir_install(_spec("a", b"A")), deployer._kstrata_ir_install(_spec("b", b"B"))
    assert deployer._kstrata_ir_install(_spec("a", b"A")) is a and a.cache_dir != b.cache_dir
    kernels = {c: _cached_kernel("k", c) for c in (b"A", b"B")}
    other_model = _cached_kernel("baseline_kernel", b"X")  # another model's kernel: its launcher, unwrapped
    assert other_model.run is other_model._run
    for dep, mine, other in ((a, b"A", b"B"), (b, b"B", b"A")):
        with deployer._Scope(dep, inductor=False):
            dep.begin_call()
            kernels[mine].run(1, 1, 1)
            dep.check_call()
            dep.begin_call()
            kernels[other].run(1, 1, 1)  # the other model's binary, launched in this one's scope
            with pytest.raises(deployer.IrDeployError, match="other than the rewritten"):
                dep.check_call()


def test_the_deployer_accepts_two_deployed_binaries_of_one_kernel_name() -> None:
    from kstrata.agents.optimize.deployer import IrDeployError, _Deployment

    # one @triton.jit kernel specialised twice (two block sizes), each rewritten: the "all winners together" candidate
    kernels = [{"name": "ir_rowsum", "digest": d, "pipeline": p, "cubin_sha256": hashlib.sha256(c).hexdigest()}
               for d, p, c in (("d1", "ttgir(num-warps{n=8})", b"one"), ("d2", "ttgir(num-warps{n=2})", b"two"))]
    dep = _Deployment({"digest": "0" * 64, "kernels": kernels})
    launch = [SimpleNamespace(name="ir_rowsum", asm={"cubin": c}) for c in (b"one", b"two", b"original")]
    dep.begin_call()
    dep.watch(launch[0])
    with pytest.raises(IrDeployError, match="never launched"):
        dep.check_call()  # the second binary has not run yet
    dep.begin_call()
    dep.watch(launch[1])
    dep.check_call()
    dep.begin_call()
    dep.watch(launch[2])
    with pytest.raises(IrDeployError, match="other than the rewritten"):
        dep.check_call()


def _state(device: str, source: str = MODEL, space: str = "baseline", params: dict[str, Any] | None = None,
           policy: str = "strict") -> Any:
    node = SimpleNamespace(key="inc0", space=space, candidate=SimpleNamespace(
        source=source, description="baseline compile", params=params or {}, policy=policy))
    notes: dict[str, str] = {}
    return SimpleNamespace(device=device, parent=None, incumbent=node, tried=frozenset(), notes=notes,
                           note=lambda name, why: notes.__setitem__(name, why))


def test_the_ir_space_on_the_cpu_says_why_it_proposes_nothing() -> None:
    p = IrPassProposer()
    state = _state("cpu")
    assert p.prepare(state, SimpleNamespace()) is None  # nothing recorded, nothing searched
    assert p.propose(state) == []
    assert "NVIDIA GPU" in state.notes["ir-passes"] and "interpreter" in state.notes["ir-passes"]
    ir_node = _state("cuda", space="ir")
    assert p.propose(ir_node) == [] and "ir candidate already" in ir_node.notes["ir-passes"]
    # another space's refinement of an ir candidate carries its deployer: a second one would meet it
    refined = _state("cuda", source=MODEL + "\n_KSTRATA_IR_SPEC = '{}'\n", space="compiler")
    assert p.prepare(refined, SimpleNamespace()) is None
    assert p.propose(refined) == [] and "ir candidate already" in refined.notes["ir-passes"]


def _assert_standalone(source: str, kernels: int) -> None:
    """`source` imports torch, triton and the standard library only (never kstrata), also in the deployer it
    carries, compiles, and deploys `kernels` kernels."""
    tree = ast.parse(source)
    consts = {getattr(n.targets[0], "id", ""): n.value for n in tree.body if isinstance(n, ast.Assign)}
    deployer = consts["_KSTRATA_IR_DEPLOYER"]
    assert isinstance(deployer, ast.Constant) and isinstance(deployer.value, str)
    for t in (tree, ast.parse(deployer.value)):
        mods = {a.name for n in ast.walk(t) if isinstance(n, ast.Import) for a in n.names} | \
            {n.module or "" for n in ast.walk(t) if isinstance(n, ast.ImportFrom)}
        assert not [m for m in mods if m.split(".")[0] not in ("torch", "triton", "__future__") and
                    m.split(".")[0] not in sys.stdlib_module_names], mods
    compile(source, "model_new.py", "exec")
    assert len(json.loads(ast.literal_eval(consts["_KSTRATA_IR_SPEC"]))["kernels"]) == kernels


def test_the_proposer_turns_a_recorded_programs_winner_into_a_standalone_candidate(rewritten: dict[str, Any]) -> None:
    from kstrata.agents.compiled.program import load_program
    from kstrata.agents.optimize.irspace import rank_kernels

    r = rewritten
    program = load_program(r["cache"], None)  # a program of kernels compiled on the CPU, no records: all kept
    ranked = rank_kernels(program, {"kernels": [{"name": "ir_rowsum", "share": 0.8}, {"name": "other", "share": 0.2}]})
    assert [k.name for k in ranked] == ["ir_rowsum"] and ranked[0].share == pytest.approx(0.8)
    p = IrPassProposer()
    state = _state("cuda")
    p._prepared["inc0"] = Prepared(winners=[r["winner"]])
    (cand,) = p.propose(state)
    assert cand.space == "ir" and cand.parent == "inc0" and "num-warps{n=8}" in cand.description
    assert cand.params["kernels"][0]["pipeline"] == "ttgir(num-warps{n=8})"
    assert cand.params["kernels"][0]["speedup"] == 1.25 and cand.params["kernels"][0]["verdict"] == "equivalent"
    _assert_standalone(cand.source, 1)
    # two winners: each alone, and all of them together
    second = dataclasses.replace(r["winner"], name="ir_rowsum_b", digest="e" * 64, pipeline="ttgir(num-warps{n=2})")
    p._prepared["inc0"] = Prepared(winners=[r["winner"], second])
    cands = p.propose(_state("cuda"))
    assert sorted(len(c.params["kernels"]) for c in cands) == [1, 1, 2]
    for c in cands:
        _assert_standalone(c.source, len(c.params["kernels"]))
    # a winner whose build has no binary: its candidates are not made, the other winner's still are, and the note says so
    broken = dataclasses.replace(second, built=str(r["tmp"]))
    p._prepared["inc0"] = Prepared(winners=[r["winner"], broken])
    noted = _state("cuda")
    (only,) = p.propose(noted)
    assert only.params["kernels"][0]["name"] == "ir_rowsum" and "has no cubin" in noted.notes["ir-passes"]
    empty = _state("cuda")
    p._prepared["inc0"] = Prepared(note="2 kernels searched; no rewrite beat its original beyond the noise")
    assert p.propose(empty) == [] and "beyond the noise" in empty.notes["ir-passes"]


def test_an_ir_candidate_of_a_generated_node_keeps_its_sandbox_and_precision_policy(
        rewritten: dict[str, Any], tmp_path: Path) -> None:
    from kstrata.agents.optimize.irspace import record_node

    p = IrPassProposer()
    p._prepared["inc0"] = Prepared(winners=[rewritten["winner"]])
    (cand,) = p.propose(_state("cuda", params={"sandbox": True}, policy="tf32"))
    assert cand.params.get("sandbox") is True and cand.policy == "tf32"
    (plain,) = p.propose(_state("cuda"))
    assert "sandbox" not in plain.params and plain.policy == "strict"
    jobs: list[dict[str, Any]] = []

    def run_job(job: dict[str, Any], timeout_s: float, **kw: Any) -> Any:
        jobs.append(kw)
        return SimpleNamespace(ok=False, error="no GPU here", data={})

    services = SimpleNamespace(evaluator=SimpleNamespace(run_job=run_job), task=tmp_path / "task.py", timeout_s=60.0,
                               time_left_s=lambda: 600.0)
    node = _state("cuda", params={"sandbox": True}).incumbent
    with pytest.raises(RuntimeError, match="no GPU here"):
        record_node(node, services, tmp_path / "work")
    assert jobs[0]["sandbox"] is True  # the recording runs the generated code in the sandbox too


def test_two_strategy_workers_reaching_the_ir_space_at_once_search_its_node_once(
        rewritten: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from kstrata.agents.optimize import irspace

    searched: list[str] = []

    def slow_search(node: Any, services: Any, findings: tuple[str, ...] = ()) -> Prepared:
        searched.append(node.key)
        time.sleep(0.5)  # the recording and the kernel-level search take minutes on a GPU
        return Prepared(winners=[rewritten["winner"]])

    monkeypatch.setattr(irspace, "search_node", slow_search)
    p = IrPassProposer()
    services = SimpleNamespace(budget=4, time_left_s=lambda: 3600.0)
    summaries: list[Any] = []
    threads = [threading.Thread(target=lambda: summaries.append(p.prepare(_state("cuda"), services))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert searched == ["inc0"] and sum(s is not None for s in summaries) == 1
    assert len(p.propose(_state("cuda"))) == 1  # the worker that waited proposes the same winner


UNRANKED = "gated on the CPU only; nothing ranks the candidates here (no launch record to time on)"


def _fake_search_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record_s: float = 0.0) -> Any:
    """`irspace.search_node` on two recorded kernels, with the recording (taking `record_s`), the program, the
    engine and the kernel search (unranked: no launch record) faked; returns (search_node, services, node)."""
    import contextlib
    import time

    from kstrata.agents import engine as engine_mod
    from kstrata.agents.compiled import program as program_mod
    from kstrata.agents.compiled import run as run_mod
    from kstrata.agents.optimize import irspace

    def record(node: Any, services: Any, work: Path) -> Any:
        time.sleep(record_s)
        return tmp_path, tmp_path, {}

    kernels = [SimpleNamespace(name=n, share=sh, entry=f"/e/{n}") for n, sh in (("k_big", 0.6), ("k_small", 0.3))]
    monkeypatch.setattr(irspace, "record_node", record)
    monkeypatch.setattr(program_mod, "load_program", lambda cache, records: None)
    monkeypatch.setattr(irspace, "rank_kernels", lambda program, profile: kernels)
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(run_mod, "search_one", lambda *a, **kw: calls.append((a, kw)) or SimpleNamespace(
        mode="unranked", mode_note=UNRANKED, trials=[SimpleNamespace(status="equivalent", pipeline="p", speedup=None)],
        best=None, llm=[]))
    monkeypatch.setattr(irspace, "SEARCH_CALLS", calls, raising=False)
    monkeypatch.setattr(engine_mod, "Engine", lambda *a, **kw: contextlib.nullcontext())
    monkeypatch.setattr(engine_mod, "WorkerPool", lambda **kw: SimpleNamespace(close=lambda: None))
    services = SimpleNamespace(workdir=tmp_path, evaluator=SimpleNamespace(workers=SimpleNamespace(name="ray")),
                               timeout_s=60.0, time_left_s=lambda: 3600.0, progress=lambda msg: None)
    node = SimpleNamespace(key="inc0", candidate=SimpleNamespace(description="baseline compile"))
    return irspace.search_node, services, node


def test_the_recording_and_the_kernel_searches_share_one_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kstrata.agents.optimize import irspace

    monkeypatch.setattr(irspace, "TIME_FRACTION", 0.3 / 3600)  # 0.3 s of the task's hour
    monkeypatch.setattr(irspace, "MIN_SECONDS", 0.0)
    search_node, services, node = _fake_search_node(tmp_path, monkeypatch, record_s=0.5)
    out = search_node(node, services)  # the recording took the whole share
    assert [r.get("skipped") for r in out.kernels if "kernel" in r] == ["the task's time for the ir space ran out"] * 2


def test_a_kernel_search_that_could_not_time_on_the_gpu_is_said_not_called_a_loss(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    search_node, services, node = _fake_search_node(tmp_path, monkeypatch)
    note = UNRANKED
    out = search_node(node, services)  # a Ray cluster's workers: the first row is a note, not a kernel
    assert not out.winners and "2 kernels searched (k_big, k_small)" in out.note, out.note
    assert "2 of them not timed on the GPU" in out.note and "no launch record" in out.note, out.note
    assert "beyond the noise" not in out.note
    assert [r.get("unmeasured") for r in out.kernels if "kernel" in r] == [note, note]


def test_a_models_kernel_answers_join_each_kernel_search_of_the_ir_space(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With `--llm --llm-spaces ir,asm` the loop lends its KernelLLM to the ir space, which hands it (and the task's
    findings) to every kernel search, with the program so that a winner is timed against the kernel's other
    autotuning configs too."""
    from kstrata.agents.optimize import irspace

    search_node, services, node = _fake_search_node(tmp_path, monkeypatch)
    hook = object()
    services.kernel_llm = hook
    search_node(node, services, ("memory-bound at 40% of the copy bandwidth",))
    calls = irspace.SEARCH_CALLS  # type: ignore[attr-defined]
    assert len(calls) == 2
    for args, kw in calls:
        opts = args[3]
        assert opts.llm is hook and opts.llm_findings == ("memory-bound at 40% of the copy bandwidth",)
        assert "program" in kw
    seen: list[tuple[str, ...]] = []
    monkeypatch.setattr(irspace, "search_node", lambda n, s, f=(): seen.append(f) or Prepared())
    state = _state("cuda")
    state.findings = [SimpleNamespace(text="launch-bound: 12 kernels")]
    IrPassProposer().prepare(state, SimpleNamespace(budget=4, time_left_s=lambda: 3600.0))
    assert seen == [("launch-bound: 12 kernels",)]


def test_the_loop_prepares_the_ir_space_through_its_services_and_judges_its_candidate(
        rewritten: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kstrata.agents.optimize import irspace
    from kstrata.agents.optimize.state import LoopServices

    from .test_optimize import FakeEvaluator, _rule_us, _search

    seen: list[Any] = []

    def fake_search(node: Any, services: LoopServices, findings: tuple[str, ...] = ()) -> Prepared:
        seen.append((node.candidate.description, services))
        return Prepared(winners=[rewritten["winner"]], kernels=[{"kernel": "ir_rowsum", "trials": 3}], seconds=1.0)

    monkeypatch.setattr(irspace, "search_node", fake_search)
    ev = FakeEvaluator(tmp_path, lambda src: 70.0 if "_KSTRATA_IR_SPEC" in src else _rule_us(src))
    s = _search(tmp_path, ev, spaces=("ir",), budget=2)
    r = s.run()
    (desc, services), = seen  # prepared once, for the incumbent (the compile baseline), with the loop's evaluator
    assert desc == "baseline compile" and services.evaluator is ev and services.time_left_s() > 0
    traj = list(s.traj.replay())
    prep = [e for e in traj if e["type"] == "prepare"]
    assert len(prep) == 1 and prep[0]["space"] == "ir" and prep[0]["summary"]["winners"][0]["pipeline"] == \
        "ttgir(num-warps{n=8})"
    (cand,) = [e for e in traj if e["type"] == "candidate" and e["space"] == "ir"]
    k = cand["edit"]["params"]["kernels"][0]
    assert (k["name"], k["pipeline"], k["verdict"], k["speedup"]) == ("ir_rowsum", "ttgir(num-warps{n=8})",
                                                                     "equivalent", 1.25)
    assert r.chosen_space == "ir" and r.speedup == pytest.approx(90 / 70)
    from kstrata.agents.optimize.report import render_task_report

    report = render_task_report(s, r, [])
    row = next(ln for ln in report.splitlines() if ln.startswith("| ") and "`ir_rowsum`" in ln)
    assert "`ttgir(num-warps{n=8})`" in row and "| equivalent |" in row and "1.250" in row, row


@pytest.mark.gpu
@pytest.mark.slow  # a task optimized for 7 minutes
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_the_ir_space_improves_inductor_layernorm_on_the_gpu(tmp_path: Path) -> None:
    """The ir space end to end on the GPU, with a model's kernel-level answers (`--llm --llm-spaces ir`, a scripted
    server answering a pipeline) joining its kernel searches: built, gated and timed like the passes' own."""
    from kstrata.agents.llm.client import LLMClient
    from kstrata.agents.llm.config import LLMConfig
    from kstrata.agents.llm.kernel import KernelLLM
    from kstrata.agents.optimize.search import Options, optimize
    from kstrata.testsuite.fake_llm import FakeLLMServer, chat

    task = tmp_path / "layernorm_small.py"
    src = (Path(__file__).resolve().parents[1] / "tasks" / "level1" / "19_layernorm_fp16.py").read_text()
    task.write_text(src.replace("batch = 32", "batch = 8").replace("seq = 2048", "seq = 1024"))
    events: list[str] = []
    with FakeLLMServer([chat("```pipeline\nttgir(num-warps{n=8})\n```")] * 8, lifetime_s=600) as server:
        llm = KernelLLM(LLMClient(LLMConfig(server.base_url, "fake-model", api_key="k", max_retries=0, timeout_s=5.0)),
                        spaces=("ir",), max_turns=1)
        results = optimize(task, tmp_path / "out", Options(budget=3, minutes=7, device="cuda", spaces=("ir",),
                                                           baselines=("eager", "compile"), progress=events.append,
                                                           ncu=False, kernel_llm=llm))
        asked = len(server.requests)
    (res,) = results
    traj = [json.loads(ln) for ln in (tmp_path / "out" / "trajectory.jsonl").read_text().splitlines()]
    prepared = [e for e in traj if e["type"] == "prepare"]
    assert prepared and prepared[0]["summary"]["kernels"], "\n".join(events[-30:])
    llm_rows = [a for k in prepared[0]["summary"]["kernels"] for a in k.get("llm", [])]
    assert asked >= 1 and llm_rows and all(a["outcome"] in ("accepted", "rejected") for a in llm_rows), llm_rows
    ir = [e for e in traj if e["type"] == "candidate" and e["space"] == "ir"]
    assert ir, f"no ir candidate: {prepared[0]['summary']}\n" + "\n".join(events[-30:])
    assert any(e["verdict"] and e["verdict"]["ok"] for e in ir), [e["verdict"] for e in ir]
    assert "IrDeployError" not in json.dumps(ir)
    assert res.status == "done"
