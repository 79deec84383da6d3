"""torch.compile(model, backend="kstrata"): registration, options, the CPU path, and (on a GPU) kernels
rewritten through the pipeline with outputs equal to Inductor's."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from kstrata.tools.torch_backend import BackendConfig, BackendOptionError

from .conftest import has_cuda


def test_registered_as_a_dynamo_backend() -> None:
    from kstrata.tools.torch_backend import kstrata_backend

    # torch finds backends of the `torch_dynamo_backends` entry-point group when one is asked for by name
    assert torch._dynamo.lookup_backend("kstrata") is kstrata_backend
    assert "kstrata" in torch._dynamo.list_backends()


def test_options_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    from kstrata.passes.pipeline import PipelineSyntaxError

    with pytest.raises(BackendOptionError, match="unknown kstrata backend options"):
        BackendConfig.from_options({"pipelin": "ptx(cache-hints)"})
    with pytest.raises(BackendOptionError, match="verify must be"):
        BackendConfig.from_options({"verify": "sometimes"})
    with pytest.raises(PipelineSyntaxError, match="pipeline:1:5"):
        BackendConfig.from_options({"pipeline": "ptx(nope)"})
    monkeypatch.setenv("KSTRATA_PIPELINE", "ptx(cache-hints{loads=cg})")
    monkeypatch.setenv("KSTRATA_ONLY_INDUCTOR", "false")
    config = BackendConfig.from_options(None)
    assert config.pipeline == "ptx(cache-hints{loads=cg})" and config.only_inductor is False
    assert BackendConfig.from_options({"pipeline": "ptx(cache-hints)"}).pipeline == "ptx(cache-hints)"
    assert config.cache_key() != BackendConfig.from_options({"pipeline": "ptx(cache-hints)"}).cache_key()
    with pytest.raises(BackendOptionError, match=r"engine_cache .* cannot be created"):
        BackendConfig.from_options({"engine_cache": "/dev/null/engine"})


def test_cpu_model_matches_eager_and_the_backend_says_why_once() -> None:
    code = """
import logging, torch
logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")
model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.GELU(), torch.nn.LayerNorm(48))
x = torch.randn(16, 32)
y = torch.compile(model, backend="kstrata")(x)
torch.compile(torch.nn.Tanh(), backend="kstrata")(x)
torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)
print("matches eager")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "matches eager" in proc.stdout
    assert proc.stderr.count("generates no Triton kernels") == 1  # two compiles, said once


def test_the_backend_compiles_every_autotuning_config_through_its_hook(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """Inductor's autotuning cache holds the best config chosen among kernels as Inductor made them; with it
    a later compile builds only that config, so a tuned variant of another config never competes (on the
    H200 the MLP's silu kernel, tuned in its 8-warp config, was not deployed end to end: the cached choice
    was the 4-warp one). While the backend compiles, that cache is off, the compile runs in this process
    and the stages hook is installed. Inductor's static launcher is off too: it loads the cubin from Inductor's
    own Triton cache by the kernel's hash, which a deployed variant shares with the original (the hook is not
    in Triton's cache key), so it would launch the original's binary with the variant's launch metadata."""
    import torch
    from torch._inductor import compile_fx as compile_fx_module
    from torch._inductor import config as inductor_config
    from triton import knobs

    import kstrata.tools.torch_backend as tb

    seen: dict[str, object] = {}

    def fake_compile_fx(gm: object, example_inputs: object) -> object:
        seen.update(local=inductor_config.autotune_local_cache, remote=inductor_config.autotune_remote_cache,
                    static=inductor_config.use_static_cuda_launcher,
                    threads=inductor_config.compile_threads, fx=inductor_config.fx_graph_cache,
                    hook=knobs.runtime.add_stages_inspection_hook is not None)
        return gm

    monkeypatch.setattr(tb, "_inputs_on_gpu", lambda inputs: True)
    monkeypatch.setattr(compile_fx_module, "compile_fx", fake_compile_fx)
    db = tmp_path / "tuned"
    from kstrata.agents.tuned import TunedDB

    TunedDB(db).create()
    tb.kstrata_backend(torch.nn.Identity(), [torch.zeros(1)], {"tuned": str(db), "cache_dir": str(tmp_path / "c")})
    assert seen == {"local": False, "remote": False, "static": False, "threads": 1, "fx": False, "hook": True}
    assert inductor_config.autotune_local_cache is True  # restored after the compile


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_gpu_kernels_are_rewritten_and_outputs_equal_inductors(tmp_path: object) -> None:
    code = r'''
import json, sys, torch
import kstrata.tools.torch_backend as tb
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256),
                        torch.nn.LayerNorm(256)).cuda()
x = torch.randn(512, 256, device="cuda")
ours = torch.compile(m, backend="kstrata", options={"cache_dir": sys.argv[1], "engine_cache": sys.argv[2]})
ours(x)
# compared on other inputs, ours first, then Inductor after a reset: no buffer of ours holds a correct value
# left by another run, so a kernel leaving elements unwritten shows
x2 = torch.randn(512, 256, device="cuda")
out = ours(x2)
torch._dynamo.reset()
ref = torch.compile(m)(x2)
print(json.dumps({"equal": bool(torch.equal(ref, out)), "report": tb.report()}))
'''
    runs = []
    root = Path(str(tmp_path))
    # the second process finds the rewritten kernels in Triton's cache; the third, with another Triton cache,
    # compiles again and takes every rewrite from the engine's cache
    for cache in ("triton", "triton", "triton-2"):
        proc = subprocess.run([sys.executable, "-c", code, str(root / cache), str(root / "engine")],
                              capture_output=True, text=True, timeout=900, check=False,
                              env={**os.environ, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second, third = runs
    assert first["equal"] and second["equal"] and third["equal"]
    assert any(r["status"] == "rewritten" for r in first["report"])
    assert not any(r["status"] == "fallback" for r in first["report"])
    assert second["report"] == []  # no rewriting work the second time
    rewritten = [r for r in third["report"] if r["status"] == "rewritten"]
    assert rewritten and all(r["engine"]["cached"] for r in rewritten)


# ---------------------------------------------------------------------------------------------------
# Through the candidate engine, on the CPU: Triton compiles for cuda:90 here, so the stages hook is driven
# by real compiles of an Inductor-named kernel (test_tuned.py's); only launching the result needs a GPU.
# ---------------------------------------------------------------------------------------------------
_HOOKED_COMPILE = r'''
import hashlib, json, sys
from pathlib import Path
from triton import knobs
from kstrata.testsuite.tests.test_tuned import _compile, _cubin, triton_poi_scale
from kstrata.tools.torch_backend import BackendConfig, _Session

root, tag, pipeline = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
session = _Session(BackendConfig.from_options({"pipeline": pipeline, "cache_dir": str(root / ("bk-" + tag)),
                                                "engine_cache": str(root / "engine")}))
with knobs.runtime.scope():
    knobs.runtime.add_stages_inspection_hook = session.hook
    entry = _compile(triton_poi_scale, root / ("hooked-" + tag))  # a fresh Triton cache: Triton compiles
print(json.dumps({"records": [r.__dict__ for r in session.records], "cubin": hashlib.sha256(_cubin(entry)).hexdigest(),
                  "ptx": next(entry.glob("*.ptx")).read_text(), "stats": session.engine.stats.to_json()}))
'''


def _hooked_compile(root: Path, tag: str, pipeline: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", _HOOKED_COMPILE, str(root), tag, pipeline], capture_output=True,
                          text=True, timeout=300, check=False, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["log"] = proc.stderr
    return out


def test_backend_rewrites_through_the_engine_and_a_fresh_process_takes_the_cached_build(tmp_path: Path) -> None:
    from kstrata.testsuite.tests.test_tuned import _compile, _cubin, triton_poi_scale

    plain = hashlib.sha256(_cubin(_compile(triton_poi_scale, tmp_path / "plain"))).hexdigest()
    first = _hooked_compile(tmp_path, "1", "ptx(cache-hints)")
    [rec] = first["records"]
    assert rec["status"] == "rewritten" and rec["passes"] == ["cache-hints{loads=cs stores=cs}"], rec
    assert rec["engine"]["cached"] is False and rec["engine"]["level"] == "ptx" and first["stats"]["builds"] == 1
    assert first["cubin"] != plain and "ld.global.cs" in first["ptx"]  # the rewrite is what Triton cached
    built = tmp_path / "engine" / "builds" / rec["engine"]["candidate"]
    assert json.loads((built / "build.json").read_text())["static_checks"]["ptx_entry"]  # checked before use
    # another process, another Triton cache: Triton compiles again, and the engine answers from its cache
    second = _hooked_compile(tmp_path, "2", "ptx(cache-hints)")
    [again] = second["records"]
    assert again["status"] == "rewritten" and again["engine"]["cached"] is True
    assert again["engine"]["candidate"] == rec["engine"]["candidate"] and second["cubin"] == first["cubin"]
    assert second["stats"]["builds"] == 0 and second["stats"]["build_cache_hits"] == 1
    assert "from the engine cache" in again["reason"]
    # another pipeline with the same binary (noalias-args changes no instruction here): built, deduplicated
    third = _hooked_compile(tmp_path, "3", "llir(noalias-args{assume=true}),ptx(cache-hints)")
    [dup] = third["records"]
    assert dup["engine"]["duplicate_of"] == rec["engine"]["candidate"] and third["cubin"] == first["cubin"]


_PLANTED_PASS = '''
from dataclasses import dataclass
from kstrata.passes.base import KernelPass, PassResult


@dataclass(frozen=True)
class ExtraParam(KernelPass):
    """Planted bug: adds a parameter to the PTX entry (valid PTX; a launcher would pass the wrong arguments)."""

    name = "planted-extra-param"
    level = "ptx"
    backends = ("cuda",)

    def apply(self, ctx):
        text = ctx.text.replace("_param_0,", "_param_0,\\n\\t.param .u32 planted_extra,", 1)
        return PassResult(text, notes=["one parameter added"])
'''


def test_backend_does_not_deploy_a_rewrite_the_engines_static_checks_refuse(tmp_path: Path) -> None:
    """A third-party pass (entry point) that changes the kernel's ABI: the engine's build refuses it, Triton's
    own binary is used, and the record and the log say why."""
    from kstrata.testsuite.tests.test_tuned import _compile, _cubin, triton_poi_scale

    plugin = tmp_path / "plugin"
    (plugin / "planted_pass").mkdir(parents=True)
    (plugin / "planted_pass" / "__init__.py").write_text(_PLANTED_PASS)
    info = plugin / "planted_pass-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: planted-pass\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kstrata.passes]\nplanted-extra-param = planted_pass:ExtraParam\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")])}
    plain = hashlib.sha256(_cubin(_compile(triton_poi_scale, tmp_path / "plain"))).hexdigest()
    out = _hooked_compile(tmp_path, "1", "ptx(planted-extra-param)", env)
    [rec] = out["records"]
    assert rec["status"] == "fallback" and "refused the rewrite at ptx" in rec["reason"], rec
    assert "launch ABI changed" in rec["reason"] and "planted_extra" in rec["reason"]  # the static check's words
    assert out["cubin"] == plain and "planted_extra" not in out["ptx"]  # Triton's own kernel, not the rewrite
    assert "left unmodified" in out["log"] and "refused the rewrite" in out["log"]
