"""torch.compile(model, backend="kstrata"): registration, options, the CPU path, and (on a GPU) kernels
rewritten through the pipeline with outputs equal to Inductor's."""

from __future__ import annotations

import subprocess
import sys

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
ref = torch.compile(m)(x)
torch._dynamo.reset()
out = torch.compile(m, backend="kstrata", options={"cache_dir": sys.argv[1]})(x)
print(json.dumps({"equal": bool(torch.equal(ref, out)), "report": tb.report()}))
'''
    runs = []
    for _ in range(2):  # the second process finds the rewritten kernels in the cache
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                              timeout=900, check=False, env={**__import__("os").environ,
                                                             "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(__import__("json").loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["equal"] and second["equal"]
    assert any(r["status"] == "rewritten" for r in first["report"])
    assert not any(r["status"] == "fallback" for r in first["report"])
    assert second["report"] == []  # no rewriting work the second time
