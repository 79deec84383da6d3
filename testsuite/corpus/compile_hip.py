"""Recompile the corpus's Inductor kernels for `hip:gfx942` on this machine (no GPU needed).

    python -m kstrata.testsuite.corpus.compile_hip   # or: python testsuite/corpus/compile_hip.py

For each kept cuda:90 entry of `triton/`, the Inductor source named by its TTIR's `#loc` is loaded (with
Inductor's GPU-driver check disabled), and its `@triton.jit` function is compiled for gfx942 with the
signature, constants and argument attributes Inductor recorded (`triton_meta`) and the launch config whose
`num_warps` matches the CUDA entry (else the first). The result goes to `triton-hip/` in Triton cache
layout without binaries (TTIR, TTGIR, metadata, group file). Kernels that do not compile for gfx942 are
listed in `triton-hip/failures.json`.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _load_autotuner(path: Path, kernel: str) -> Any:
    from torch._inductor.runtime import triton_helpers

    triton_helpers.set_driver_to_gpu = lambda: None  # Inductor refuses to import its kernels without a GPU
    spec = importlib.util.spec_from_file_location(f"corpus_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, kernel)


def main() -> int:
    from kstrata.ir.errors import KstrataError
    from kstrata.ir.target import Target
    from kstrata.ir.triton_layout import compile_jit

    target = Target.parse("hip:gfx942")
    out = HERE / "triton-hip"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    failures: dict[str, str] = {}
    done = 0
    for entry in sorted((HERE / "triton").iterdir()):
        ttir = next(entry.glob("*.ttir"))
        name = ttir.stem
        meta = json.loads((entry / f"{name}.json").read_text())
        m = re.search(r'loc\("[^"]*/([^"/]+\.py)"', ttir.read_text())
        source = HERE / "inductor" / m.group(1) if m else None
        key = f"{entry.name}/{name}"
        if source is None or not source.exists():
            failures[key] = "no Inductor source"
            continue
        try:
            tuner = _load_autotuner(source, name)
            tm = tuner.triton_meta
            configs = list(tuner.configs) or [None]
            config = next((c for c in configs if c is not None and c.num_warps == meta["num_warps"]), configs[0])
            constexprs = dict(tm.get("constants", {}))
            options: dict[str, Any] = {"num_warps": meta["num_warps"], "num_stages": meta["num_stages"]}
            if config is not None:
                constexprs |= dict(config.kwargs)
                options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
            attrs = tm["configs"][0] if tm.get("configs") else {}
            with tempfile.TemporaryDirectory() as tmp:
                bundle = compile_jit(tuner.fn, tm["signature"], target, constexprs, attrs, options, cache_dir=tmp)
                src = Path(bundle.origin or "")
                dst = out / src.name
                dst.mkdir()
                kept = [f for f in src.iterdir() if f.suffix in (".ttir", ".ttgir", ".json") and not f.name.startswith("__grp__")]
                for f in kept:
                    shutil.copy2(f, dst / f.name)
                (dst / f"__grp__{bundle.name}.json").write_text(json.dumps({"child_paths": {f.name: f.name for f in kept}}))
            done += 1
        except (KstrataError, Exception) as exc:  # a kernel Triton cannot build for gfx942 is recorded, not fatal
            failures[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    (out / "failures.json").write_text(json.dumps(failures, indent=1, sort_keys=True) + "\n")
    print(f"{done} kernels compiled for {target}, {len(failures)} failed -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
