"""Rebuild `features/`: kernels that use Triton features the suite and the Inductor corpus lack (tensor
descriptors and TMA, block pointers, split/join/cat/reshape, histogram, atomic_cas, print, precise math,
extern calls, tf32x3 dots, pipelined dots), compiled on a CPU for cuda:90 and hip:gfx942.

    python testsuite/corpus/features/build.py      # needs kstrata and Triton 3.6; no GPU
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kernels  # noqa: E402

SPECS = {
    "k_block_ptr": ({"a_ptr": "*fp32", "b_ptr": "*fp32", "M": "i32", "N": "i32", "sm": "i32", "sn": "i32",
                     "BM": "constexpr", "BN": "constexpr"}, {"BM": 32, "BN": 32}),
    "k_misc": ({"x_ptr": "*fp32", "y_ptr": "*fp32", "z_ptr": "*fp32", "lock": "*i32", "n": "i32",
                "BLOCK": "constexpr"}, {"BLOCK": 128}),
    "k_dot": ({"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32", "BM": "constexpr", "BN": "constexpr",
               "BK": "constexpr"}, {"BM": 32, "BN": 32, "BK": 32}),
    "k_desc": ({"a_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "BM": "constexpr", "BN": "constexpr"},
               {"BM": 64, "BN": 64}),
    "k_mma_pipe": ({"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "K": "i32", "BM": "constexpr",
                    "BN": "constexpr", "BK": "constexpr"}, {"BM": 64, "BN": 64, "BK": 32}),
}


def main() -> None:
    from kstrata.ir.errors import KstrataError
    from kstrata.ir.target import Target
    from kstrata.ir.triton_layout import compile_jit

    for spelling in ("cuda:90", "hip:gfx942"):
        out_root = HERE / spelling.replace(":", "_")
        shutil.rmtree(out_root, ignore_errors=True)
        for name, (signature, constexprs) in SPECS.items():
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    bundle = compile_jit(getattr(kernels, name), signature, Target.parse(spelling), constexprs,
                                         cache_dir=tmp)
                except KstrataError as exc:  # k_misc does not assemble for cuda:90 (ptxas); k_dot's tf32x3 is CUDA-only
                    print(f"{spelling} {name}: {exc.message.splitlines()[0][:200]}")
                    continue
                entry = Path(bundle.origin or "")
                out = out_root / entry.name
                out.mkdir(parents=True)
                kept = [f"{name}.ttir", f"{name}.ttgir", f"{name}.json"]
                for f in kept:
                    shutil.copy2(entry / f, out / f)
                (out / f"__grp__{name}.json").write_text(json.dumps({"child_paths": {f: f for f in kept}}))
                print(f"{spelling} {name}: ok")


if __name__ == "__main__":
    main()
