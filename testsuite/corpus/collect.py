"""Collect the Inductor corpus: compile small real models with `torch.compile` on an NVIDIA GPU and keep
the Triton kernels Inductor generated (Python source, TTIR, TTGIR, Triton's metadata).

    TRITON_CACHE_DIR=W/triton TORCHINDUCTOR_CACHE_DIR=W/inductor python3 collect.py run W [--budget 200]
    python3 collect.py pack W corpus.tar.gz

`run` compiles an MLP (bf16, with Triton GEMMs through max-autotune), a transformer block with attention
(fp16), norms (LayerNorm, RMSNorm, GroupNorm, BatchNorm; fp32/fp16), a conv block (fp16), reductions and
scans (fp32), dropout, and the project's KernelBench-format models and level-2 tasks at reduced sizes, as
long as the time budget lasts. `pack` keeps, per Triton cache entry, `<kernel>.ttir`, `.ttgir`, `.json`
and `.source`, and Inductor's generated kernel files, in one tar.gz. Needs torch and a GPU; no kstrata.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tarfile
import time
from pathlib import Path


def _models():  # torch is imported lazily: this file is also read on machines without it
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class MLP(nn.Module):
        def __init__(self, d: int, h: int, dtype: torch.dtype) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(d, h, dtype=dtype), nn.Linear(h, d, dtype=dtype)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.fc2(F.gelu(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self, d: int, heads: int, dtype: torch.dtype) -> None:
            super().__init__()
            self.heads = heads
            self.n1, self.n2 = nn.LayerNorm(d, dtype=dtype), nn.RMSNorm(d, dtype=dtype)
            self.qkv, self.out = nn.Linear(d, 3 * d, dtype=dtype), nn.Linear(d, d, dtype=dtype)
            self.mlp = MLP(d, 4 * d, dtype)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, d = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5
            mask = torch.ones(s, s, device=x.device, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(b, s, d)
            x = x + self.out(y)
            return self.mlp(self.n2(x))

    class Norms(nn.Module):
        def __init__(self, c: int, dtype: torch.dtype) -> None:
            super().__init__()
            self.ln, self.rms = nn.LayerNorm(c, dtype=dtype), nn.RMSNorm(c, dtype=dtype)
            self.gn, self.bn = nn.GroupNorm(4, c, dtype=dtype), nn.BatchNorm1d(c, dtype=dtype)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.rms(self.ln(x))
            return self.bn(self.gn(y.transpose(1, 2))).transpose(1, 2)

    class ConvBlock(nn.Module):
        def __init__(self, dtype: torch.dtype) -> None:
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(16, 32, 3, padding=1, dtype=dtype), nn.Conv2d(32, 32, 3, padding=1, dtype=dtype)
            self.bn = nn.BatchNorm2d(32, dtype=dtype)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.relu(self.bn(self.c1(x)))
            y = F.max_pool2d(F.silu(self.c2(y)) + y, 2)
            return y.mean(dim=(2, 3))

    class Reductions(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (x.sum(-1), x.amax(-1), x.argmax(-1), torch.cumsum(x, -1), torch.logsumexp(x, -1),
                    F.dropout(x, 0.1, training=True), torch.var_mean(x, -1)[0])

    dev = "cuda"
    f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
    return [
        ("mlp_bf16_autotune", MLP(256, 1024, bf16).to(dev), (torch.randn(64, 256, device=dev, dtype=bf16),), True),
        ("mlp_fp32", MLP(128, 512, f32).to(dev), (torch.randn(32, 128, device=dev),), False),
        ("block_fp16", Block(128, 4, f16).to(dev), (torch.randn(2, 64, 128, device=dev, dtype=f16),), False),
        ("norms_fp32", Norms(64, f32).to(dev).eval(), (torch.randn(8, 32, 64, device=dev),), False),
        ("norms_fp16", Norms(64, f16).to(dev).eval(), (torch.randn(8, 32, 64, device=dev, dtype=f16),), False),
        ("conv_fp16", ConvBlock(f16).to(dev).eval(), (torch.randn(4, 16, 32, 32, device=dev, dtype=f16),), False),
        ("reductions_fp32", Reductions().to(dev), (torch.randn(16, 1000, device=dev),), False),
    ]


def _shrink(module: object) -> None:
    """Task files are GPU-sized; shrink their module-level size constants for a quick compile."""
    for name in ("batch", "seq", "hidden", "M", "N", "K", "batch_size", "in_features", "out_features", "height",
                 "width", "channels", "in_channels", "out_channels", "depth", "experts", "tokens", "dim"):
        value = getattr(module, name, None)
        if isinstance(value, int) and value > 64:
            setattr(module, name, max(16, value // 8))


def _tasks(root: Path):
    import torch

    for path in sorted((root / "models").glob("[0-9]*.py")) + sorted((root / "level2").glob("[0-9]*.py")):
        spec = importlib.util.spec_from_file_location(f"task_{path.stem}", path)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _shrink(mod)
        model = mod.Model(*mod.get_init_inputs()).cuda().eval()
        inputs = tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in mod.get_inputs())
        yield f"task_{path.parent.name}_{path.stem}", model, inputs, False


def run(work: Path, budget: float, tasks_root: Path | None) -> None:
    import torch
    import torch._inductor.config as inductor_config

    start = time.time()
    done: dict[str, str] = {}
    entries = list(_models())
    candidates = entries + (list(_tasks(tasks_root)) if tasks_root else [])
    for name, model, inputs, autotune in candidates:
        if time.time() - start > budget:
            done[name] = "skipped: time budget spent"
            continue
        t0 = time.time()
        try:
            torch._dynamo.reset()
            with inductor_config.patch(max_autotune=autotune, max_autotune_gemm_backends="TRITON" if autotune else "ATEN,TRITON"):
                compiled = torch.compile(model, mode="max-autotune-no-cudagraphs" if autotune else None)
                with torch.no_grad():
                    compiled(*inputs)
            torch.cuda.synchronize()
            done[name] = f"ok {time.time() - t0:.1f}s"
        except Exception as exc:  # one model failing must not lose the others
            done[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        print(name, done[name], flush=True)
    (work / "models.json").write_text(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                                                  "models": done}, indent=1))


def pack(work: Path, archive: Path) -> None:
    keep_ext = {".ttir", ".ttgir", ".json", ".source"}
    with tarfile.open(archive, "w:gz") as tar:
        cache = work / "triton"
        for entry in sorted(p for p in cache.iterdir() if p.is_dir()) if cache.is_dir() else []:
            if not any(entry.glob("*.ttgir")):
                continue
            for f in sorted(entry.iterdir()):
                if f.suffix in keep_ext and not f.name.startswith("__grp__"):
                    tar.add(f, arcname=f"triton/{entry.name}/{f.name}")
        inductor = work / "inductor"
        for f in sorted(inductor.rglob("*.py")) if inductor.is_dir() else []:
            text = f.read_text(errors="replace")
            if "@triton.jit" in text and "def triton_" in text:
                tar.add(f, arcname=f"inductor/{f.name}")
        if (work / "models.json").exists():
            tar.add(work / "models.json", arcname="models.json")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        tasks = Path(sys.argv[sys.argv.index("--tasks") + 1]) if "--tasks" in sys.argv else None
        budget = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 200.0
        run(Path(sys.argv[2]), budget, tasks)
    elif sys.argv[1] == "pack":
        pack(Path(sys.argv[2]), Path(sys.argv[3]))
