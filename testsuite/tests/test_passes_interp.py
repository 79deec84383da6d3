"""CPU execution twins of the TTIR and TTGIR passes: each rewritten kernel is verified against the
original on the suite kernel's own launch by our interpreter (`kstrata verify --device cpu`): random,
edge-value and recorded inputs, bit-exact unless the pass declares a tolerance."""

from __future__ import annotations

from pathlib import Path

import pytest

from kstrata.backends.verify import verify
from kstrata.ir.target import Target
from kstrata.passes.pipeline import parse_pipeline, run_pipeline
from kstrata.testsuite.kernels import get_kernel
from kstrata.testsuite.kernels.build import bundle_for
from kstrata.testsuite.kernels.launch import suite_launch_record

TWINS = [
    ("ttir(load-eviction)", "softmax_online"),
    ("ttir(load-eviction)", "vector_add"),
    ("ttir(dot-precision{precision=tf32x3})", "matmul_fp32_ieee"),
    ("ttir(dot-precision{precision=ieee})", "matmul_fp32_tf32"),
    ("ttgir(num-warps{n=8})", "layernorm_fwd"),
    ("ttgir(num-warps{n=2})", "row_argmax"),
    ("ttgir(num-stages{n=2})", "matmul_fp16"),
    ("ttgir(num-stages{n=4})", "flash_attention_fwd"),
]


@pytest.mark.parametrize(("spec", "kernel_name"), TWINS, ids=[f"{s}-{k}" for s, k in TWINS])
def test_pass_result_is_equivalent_in_the_interpreter(spec: str, kernel_name: str, tmp_path: Path) -> None:
    kernel = get_kernel(kernel_name)
    original = bundle_for(kernel, Target.parse("cuda:90"))
    pipeline = parse_pipeline(spec)
    outcome = run_pipeline(original, pipeline)
    assert outcome.changed, f"{spec} did not change {kernel_name}: {[r.reason for r in outcome.records]}"
    declared = pipeline.tolerance()
    record = suite_launch_record(kernel, "cuda:90", snapshot_dir=tmp_path)
    report = verify(original, outcome.bundle, record, seeds=1, device="cpu", tolerance=declared, timeout=300)
    interpreted = [c for c in report.checks if c.name.startswith("interpreter")]
    assert interpreted and all(c.verdict == "pass" for c in interpreted), [c.__dict__ for c in interpreted]
    assert report.ok, [c.__dict__ for c in report.checks if c.verdict == "fail"]
    # the rewrite must have been checked on the level it changed
    assert {c.level for c in interpreted} >= {pipeline.passes[0][0]}
