"""The grouped-pid rewrite (GROUP_SIZE_M program-id ordering) executed: on the interpreter, the
rewritten row-major GEMM computes bit for bit what the original does; the renumbering it inserts is
the grouped order and a permutation, and falls back to the original order on grids that are not whole
tile rows; the precondition refuses kernels whose programs are not independent; on a GPU the rebuilt
binary gives bit-identical outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kstrata.backends.verify import verify
from kstrata.ir.bundle import KernelBundle
from kstrata.ir.interp import run_kernel
from kstrata.ir.target import Target
from kstrata.ir.triton_ir import parse_triton, print_triton
from kstrata.passes.pipeline import apply_passes, parse_pipeline, run_pipeline
from kstrata.passes.registry import get_pass
from kstrata.testsuite.kernels import get_kernel
from kstrata.testsuite.kernels.build import bundle_for
from kstrata.testsuite.kernels.launch import suite_launch_record
from kstrata.testsuite.kernels.matmul_rowmajor import ROWMAJOR_MATMULS
from kstrata.testsuite.tests.conftest import assert_rewrite_bit_exact_in_interpreter, has_cuda

INPUTS = Path(__file__).resolve().parents[1] / "filecheck" / "ttir" / "inputs"

#: A kernel that writes, at slot `pid`, the tile (row * 1000 + column) it computes from its program id.
TILE_ORDER = """module {
  tt.func public @tile_order(%order: !tt.ptr<i32>, %tiles_n: i32) attributes {noinline = false} {
    %c1000 = arith.constant 1000 : i32
    %pid = tt.get_program_id x : i32
    %pid_m = arith.divsi %pid, %tiles_n : i32
    %pid_n = arith.remsi %pid, %tiles_n : i32
    %row = arith.muli %pid_m, %c1000 : i32
    %tile = arith.addi %row, %pid_n : i32
    %slot = tt.addptr %order, %pid : !tt.ptr<i32>, i32
    tt.store %slot, %tile : !tt.ptr<i32>
    tt.return
  }
}
"""


def _bare(text: str, name: str) -> KernelBundle:
    return KernelBundle(name, Target.parse("cuda:90"), {"ttir": text}, {"name": name})


def _grouped_order(programs: int, tiles_n: int, group: int) -> list[int]:
    """Triton's GROUP_SIZE_M ordering (the tutorial's formulas), as row * 1000 + column per program."""
    tiles_m = programs // tiles_n
    out = []
    for pid in range(programs):
        first_m = (pid // (group * tiles_n)) * group
        rows = min(tiles_m - first_m, group)
        out.append((first_m + (pid % (group * tiles_n)) % rows) * 1000 + (pid % (group * tiles_n)) // rows)
    return out


def _rewritten_order(group: int) -> str:
    """TILE_ORDER rewritten, then with its store slot put back on the hardware program id: what each
    program computes becomes visible (the rewrite itself renumbers every use, the slot included)."""
    outcome = apply_passes(_bare(TILE_ORDER, "tile_order"), parse_pipeline(f"ttir(grouped-pid{{group={group}}})"))
    assert outcome.records[0].status == "changed", outcome.messages()
    module = parse_triton(outcome.text)
    pid = next(op for op in module.ops() if op.name == "tt.get_program_id")
    addptr = next(op for op in module.ops() if op.name == "tt.addptr")
    assert addptr.operands[1] is not pid.results[0]  # renumbered by the pass
    addptr.operands[1] = pid.results[0]
    return print_triton(module)


@pytest.mark.parametrize(("programs", "tiles_n", "group"), [(12, 3, 2), (15, 3, 2), (6, 2, 2), (64, 8, 4),
                                                            (60, 5, 8), (6, 6, 4)])
def test_the_renumbering_is_the_grouped_order(programs: int, tiles_n: int, group: int) -> None:
    order = np.full(programs, -1, np.int32)
    run_kernel(_rewritten_order(group), (programs, 1, 1), [order, tiles_n])
    assert order.tolist() == _grouped_order(programs, tiles_n, group)
    row_major = sorted(p // tiles_n * 1000 + p % tiles_n for p in range(programs))
    assert sorted(order.tolist()) == row_major  # a permutation: every tile once
    if programs // tiles_n > 1 and tiles_n > 1:
        assert order.tolist() != row_major  # and not the identity


@pytest.mark.parametrize(("programs", "tiles_n"), [(13, 3), (7, 2), (3, 8)])
def test_grids_that_are_not_whole_tile_rows_keep_the_original_order(programs: int, tiles_n: int) -> None:
    order = np.full(programs, -1, np.int32)
    run_kernel(_rewritten_order(4), (programs, 1, 1), [order, tiles_n])
    expected = np.full(programs, -1, np.int32)
    run_kernel(TILE_ORDER, (programs, 1, 1), [expected, tiles_n])
    assert order.tolist() == expected.tolist()


@pytest.mark.slow  # about 30 s each on an idle 2-core machine; the in-process TTIR check below is ~1 s
@pytest.mark.parametrize("name", ["matmul_rowmajor_fp32", "matmul_rowmajor_fp16"])
def test_rewritten_gemm_is_bit_exact_in_the_interpreter(name: str, tmp_path: Path) -> None:
    # 3 x 2 tiles: groups of 2 rows, then 1
    assert_rewrite_bit_exact_in_interpreter(ROWMAJOR_MATMULS[name], "ttir(grouped-pid{group=2})", tmp_path)


def test_the_ttgir_rewrite_is_bit_exact_in_the_interpreter() -> None:
    """The same rewrite on TTGIR (after Triton's layouts and software pipelining): same output."""
    text = (INPUTS.parent.parent / "ttgir" / "inputs" / "matmul_rowmajor.ttgir").read_text()
    bundle = KernelBundle("matmul_rowmajor_kernel", Target.parse("cuda:90"), {"ttgir": text},
                          {"name": "matmul_rowmajor_kernel"})
    outcome = apply_passes(bundle, parse_pipeline("ttgir(grouped-pid{group=2})"))
    assert outcome.records[0].status == "changed", outcome.messages()
    m, n, k = 157, 91, 123
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    results = []
    for t in (text, outcome.text):
        c = np.full((m, n), np.nan, np.float32)
        run_kernel(t, (6, 1, 1), [a, b, c, m, n, k, k, n, n])
        results.append(c)
    assert not np.isnan(results[0]).any()
    assert np.array_equal(results[0], results[1])


def test_the_interpreter_sees_a_wrong_renumbering() -> None:
    """The execution check has teeth: a renumbering that is not a permutation changes the output."""
    text = (INPUTS / "matmul_rowmajor.ttir").read_text()
    outcome = apply_passes(_bare(text, "matmul_rowmajor_kernel"), parse_pipeline("ttir(grouped-pid{group=2})"))
    broken = outcome.text.replace("arith.select %9, %23, %pid", "arith.select %9, %20, %pid")  # row only
    assert broken != outcome.text
    m, n, k = 157, 91, 123
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    results = []
    for t in (text, outcome.text, broken):
        c = np.full((m, n), np.nan, np.float32)
        run_kernel(t, (6, 1, 1), [a, b, c, m, n, k, k, n, n])
        results.append(c)
    assert np.array_equal(results[0], results[1], equal_nan=True)
    assert not np.array_equal(results[0], results[2], equal_nan=True)


@pytest.mark.parametrize(("source", "reason"), [
    ("inplace_tiles.ttir", "loads from x, which it also stores to"),
    ("atomic_tiles.ttir", "uses `tt.atomic_rmw`"),
    ("matmul_tf32.ttir", "already groups its program ids"),
    ("vector_add.ttir", "not split into a tile row and column"),
])
def test_precondition_refuses_and_says_why(source: str, reason: str) -> None:
    bundle = _bare((INPUTS / source).read_text(), source)
    outcome = apply_passes(bundle, parse_pipeline("ttir(grouped-pid)"))
    assert outcome.records[0].status == "skipped" and reason in outcome.records[0].reason
    assert outcome.text == bundle.text("ttir")
    space = get_pass("grouped-pid").schedule_space(bundle)
    assert not space and space.reason is not None and reason in space.reason


def test_schedule_space_of_a_row_major_gemm() -> None:
    bundle = _bare((INPUTS / "matmul_rowmajor.ttir").read_text(), "matmul_rowmajor_kernel")
    space = get_pass("grouped-pid").schedule_space(bundle)
    assert space.spellings() == ["grouped-pid{group=4}", "grouped-pid{group=8}", "grouped-pid{group=16}"]


def test_suite_gemm_is_refused_as_already_grouped() -> None:
    outcome = run_pipeline(bundle_for(get_kernel("matmul_fp16"), Target.parse("cuda:90")),
                           parse_pipeline("ttir(grouped-pid)"))
    assert not outcome.changed and "already groups" in outcome.records[0].reason


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("name", ["matmul_rowmajor_fp32", "matmul_rowmajor_fp16"])
def test_rewritten_gemm_is_bit_exact_on_the_gpu(name: str, tmp_path: Path) -> None:
    kernel = ROWMAJOR_MATMULS[name]
    original = bundle_for(kernel, Target.parse("cuda:90"))
    outcome = run_pipeline(original, parse_pipeline("ttir(grouped-pid{group=2})"))
    assert outcome.changed
    record = suite_launch_record(kernel, "cuda:90", snapshot_dir=tmp_path)
    report = verify(original, outcome.bundle, record, seeds=2, device="cuda", timeout=300)
    gpu = [c for c in report.checks if c.name.startswith("differential")]
    assert gpu and all(c.verdict == "pass" for c in gpu), [c.__dict__ for c in report.checks]
    assert report.ok, [c.__dict__ for c in report.checks if c.verdict == "fail"]


def test_a_volatile_load_is_refused_and_a_plain_one_is_not() -> None:
    text = (INPUTS / "inplace_tiles.ttir").read_text()
    # two buffers: the kernel reads x and writes y, so the programs are independent
    two = (text.replace("%x: !tt.ptr<f32>,", "%x: !tt.ptr<f32>, %y: !tt.ptr<f32>,")
           .replace("%dst = tt.addptr %x, %next", "%dst = tt.addptr %y, %next"))
    plain = apply_passes(_bare(two, "k"), parse_pipeline("ttir(grouped-pid)"))
    assert plain.records[0].status == "changed", plain.messages()
    volatile = two.replace("tt.load %src : !tt.ptr<f32>", "tt.load %src {isVolatile = true} : !tt.ptr<f32>")
    assert volatile != two
    refused = apply_passes(_bare(volatile, "k"), parse_pipeline("ttir(grouped-pid)"))
    assert refused.records[0].status == "skipped" and "volatile load" in refused.records[0].reason
