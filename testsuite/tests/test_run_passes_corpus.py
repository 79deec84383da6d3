"""The CPU benchmark's corpus cache: Inductor kernels of `testsuite/corpus` recompiled from their TTIR
(cuda:90 and hip:gfx942) into a cache root that `run-passes` can rewrite (override keys indexed)."""

from __future__ import annotations

import shutil
from pathlib import Path

from kstrata.agents.run_passes import run_passes
from kstrata.ir.triton_layout import load_cache_root, read_index
from kstrata.tools.bench_run_passes import CORPUS_DIRS, build_corpus_cache

CORPUS = Path(__file__).resolve().parents[1] / "corpus"


def test_corpus_recompiles_and_run_passes_rewrites_it(tmp_path: Path) -> None:
    small = tmp_path / "corpus"
    for sub in CORPUS_DIRS.values():  # two kernels per target keep the test short
        for entry in sorted(d for d in (CORPUS / sub).iterdir() if d.is_dir())[:2]:
            shutil.copytree(entry, small / sub / entry.name)
    seconds, failures = build_corpus_cache(small, list(CORPUS_DIRS), tmp_path / "cache")
    assert failures == {} and len(seconds) == 4 and all(s > 0 for s in seconds)
    bundles, errors = load_cache_root(tmp_path / "cache")
    assert not errors and sorted(str(b.target) for b in bundles) == ["cuda:90", "cuda:90", "hip:gfx942", "hip:gfx942"]
    assert all({"cubin", "ptx"} <= set(b.levels) or {"hsaco", "amdgcn"} <= set(b.levels) for b in bundles)
    index = read_index(tmp_path / "cache")
    assert len(index) == 4 and all(e["override_key"] for e in index.values())
    report = run_passes(tmp_path / "cache", "llir(noalias-args{assume=true})", tmp_path / "out", jobs=2)
    assert report.counts() == {"changed": 4, "unchanged": 0, "failed": 0}, [k["error"] for k in report.kernels]
