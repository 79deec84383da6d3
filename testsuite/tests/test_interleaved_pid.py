"""The interleaved-pid rewrite executed: on the interpreter, the renumbering it inserts is
`(pid % slices) * (programs / slices) + pid / slices` and a permutation, and the original order on grids that
are not whole slices; the rewritten broadcast kernel (a LayerNorm's affine step, as Inductor writes it)
computes bit for bit what the original does, at TTIR and at TTGIR; the pass is offered only where a load
repeats with the program id, and refuses kernels whose programs are not independent; the compiled-kernel
search tries it first on pointwise kernels; on a GPU the rebuilt binary gives bit-identical outputs."""

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
from kstrata.testsuite.kernels.broadcast_rows import BROADCAST_ROWS
from kstrata.testsuite.kernels.build import bundle_for
from kstrata.testsuite.kernels.launch import suite_launch_record
from kstrata.testsuite.tests.conftest import assert_rewrite_bit_exact_in_interpreter, has_cuda

INPUTS = Path(__file__).resolve().parents[1] / "filecheck"

#: Writes, at slot `pid`, the program id it works as (times 1000) plus a weight it loads at `pid % k` (zeros):
#: what each program does becomes visible, and the load repeats with the program id.
ORDER = """module {
  tt.func public @order(%w: !tt.ptr<i32>, %order: !tt.ptr<i32>, %k: i32) attributes {noinline = false} {
    %c1000 = arith.constant 1000 : i32
    %pid = tt.get_program_id x : i32
    %col = arith.remsi %pid, %k : i32
    %wp = tt.addptr %w, %col : !tt.ptr<i32>, i32
    %wv = tt.load %wp : !tt.ptr<i32>
    %scaled = arith.muli %pid, %c1000 : i32
    %v = arith.addi %scaled, %wv : i32
    %slot = tt.addptr %order, %pid : !tt.ptr<i32>, i32
    tt.store %slot, %v : !tt.ptr<i32>
    tt.return
  }
}
"""


def _bare(text: str, name: str, level: str = "ttir") -> KernelBundle:
    return KernelBundle(name, Target.parse("cuda:90"), {level: text}, {"name": name})


def _rewritten_order(slices: int) -> str:
    """ORDER rewritten, then with its store slot put back on the hardware program id."""
    outcome = apply_passes(_bare(ORDER, "order"), parse_pipeline(f"ttir(interleaved-pid{{slices={slices}}})"))
    assert outcome.records[0].status == "changed", outcome.messages()
    module = parse_triton(outcome.text)
    pid = next(op for op in module.ops() if op.name == "tt.get_program_id")
    slot = [op for op in module.ops() if op.name == "tt.addptr"][-1]
    assert slot.operands[1] is not pid.results[0]  # renumbered by the pass
    slot.operands[1] = pid.results[0]
    return print_triton(module)


def _run_order(text: str, programs: int) -> list[int]:
    order = np.full(programs, -1, np.int32)
    run_kernel(text, (programs, 1, 1), [np.zeros(7, np.int32), order, 7])
    return [v // 1000 for v in order.tolist()]


@pytest.mark.parametrize(("programs", "slices"), [(64, 16), (48, 4), (32, 16), (16, 16), (128, 64)])
def test_the_renumbering_interleaves_the_slices_and_is_a_permutation(programs: int, slices: int) -> None:
    got = _run_order(_rewritten_order(slices), programs)
    per = programs // slices
    assert got == [(p % slices) * per + p // slices for p in range(programs)]
    assert sorted(got) == list(range(programs))  # every program's work done once
    if per > 1:
        assert got != list(range(programs))
        # the first `slices` programs in flight are at the same position of every slice
        assert [g % per for g in got[:slices]] == [0] * slices


@pytest.mark.parametrize(("programs", "slices"), [(50, 16), (7, 4), (3, 16), (65, 64)])
def test_grids_that_are_not_whole_slices_keep_the_original_order(programs: int, slices: int) -> None:
    assert _run_order(_rewritten_order(slices), programs) == list(range(programs))


@pytest.mark.parametrize("name", sorted(BROADCAST_ROWS))
def test_the_rewritten_broadcast_kernel_is_bit_exact_in_the_interpreter(name: str, tmp_path: Path) -> None:
    """norm_apply_rows: 128 programs in 16 slices of 8 (reordered); norm_apply_rows_odd: 125 programs (kept)."""
    assert_rewrite_bit_exact_in_interpreter(BROADCAST_ROWS[name], "ttir(interleaved-pid{slices=16})", tmp_path)


def test_the_ttgir_rewrite_reorders_and_is_bit_exact_in_the_interpreter() -> None:
    """At TTGIR (after Triton's layouts): the same outputs, and the programs really run in another order (a
    kernel that records its order, rewritten at TTGIR, shows it)."""
    text = (INPUTS / "ttgir" / "inputs" / "norm_apply_rows.ttgir").read_text()
    outcome = apply_passes(_bare(text, "norm_apply_rows_kernel", "ttgir"), parse_pipeline("ttgir(interleaved-pid)"))
    assert outcome.records[0].status == "changed", outcome.messages()
    rows, cols = 16, 1024
    rng = np.random.default_rng(3)
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    mean, rstd = rng.standard_normal(rows, dtype=np.float32), rng.random(rows, dtype=np.float32) + 0.5
    w, b = rng.standard_normal(cols, dtype=np.float32), rng.standard_normal(cols, dtype=np.float32)
    results = []
    for t in (text, outcome.text):
        out = np.full((rows, cols), np.nan, np.float32)
        run_kernel(t, (rows * cols // 128, 1, 1), [x, mean, rstd, w, b, out, rows * cols])
        results.append(out)
    assert not np.isnan(results[0]).any()
    assert np.array_equal(results[0], results[1])


def test_it_is_offered_only_where_a_load_repeats_and_the_programs_are_independent() -> None:
    cls = get_pass("interleaved-pid")
    offered = cls.schedule_space(bundle_for(BROADCAST_ROWS["norm_apply_rows"], Target.parse("cuda:90")))
    assert [c.spelling() for c in offered] == ["interleaved-pid{slices=16}", "interleaved-pid{slices=4}",
                                               "interleaved-pid{slices=64}"]
    plain = cls.schedule_space(bundle_for(get_kernel("vector_add"), Target.parse("cuda:90")))
    assert not plain and "no load repeats" in (plain.reason or "")
    # the index wraps, but only the store uses it: nothing is read twice
    store_only = ORDER.replace("%wp = tt.addptr %w, %col", "%wp = tt.addptr %w, %k").replace(
        "%slot = tt.addptr %order, %pid", "%slot = tt.addptr %order, %col")
    outcome = apply_passes(_bare(store_only, "order"), parse_pipeline("ttir(interleaved-pid)"))
    assert outcome.records[0].status == "skipped" and "no load's address uses it" in outcome.messages()[0]
    # a program that could read what another writes is refused, as grouped-pid refuses it
    inplace = (INPUTS / "ttir" / "inputs" / "inplace_tiles.ttir").read_text()
    outcome = apply_passes(_bare(inplace, "inplace_tiles"), parse_pipeline("ttir(interleaved-pid)"))
    assert outcome.records[0].status == "skipped" and "also stores to" in outcome.messages()[0]


def _record_with_storage(tmp_path: Path, name: str, overlap: bool) -> str:
    """The broadcast kernel's launch record with buffer addresses (as `kstrata record` writes them): every
    buffer apart, or the output over the input."""
    from kstrata.ir.launch import LaunchRecord

    record = suite_launch_record(BROADCAST_ROWS["norm_apply_rows"], "cuda:90", snapshot_dir=tmp_path)
    storage = {a.name: [(i + 1) << 30, 1 << 20] for i, a in enumerate(record.args) if hasattr(a, "dtype")}
    if overlap:
        storage["out_ptr"] = list(storage["x_ptr"])
    data = {**record.to_json(), "extra": {**record.extra, "storage": storage}}
    path = tmp_path / f"{name}.json"
    LaunchRecord.from_json(data).save(path)
    return str(path)


def test_the_compiled_search_drafts_it_first_where_the_buffers_never_overlap(tmp_path: Path) -> None:
    from kstrata.agents.compiled.spaces import kernel_spaces, kind_first

    bundle = bundle_for(BROADCAST_ROWS["norm_apply_rows"], Target.parse("cuda:90"))
    apart = kernel_spaces(bundle, [_record_with_storage(tmp_path, "apart", overlap=False)])
    atoms = [a for s in apart for a in s.atoms]
    assert any(a.pass_name == "interleaved-pid" for a in atoms)
    assert kind_first("pointwise", atoms)[0].spelling == "interleaved-pid{slices=16}"
    assert all(a.pass_name != "interleaved-pid" for a in kind_first("reduction", atoms)[:5])
    # an output over an input (or no addresses at all): reordering the programs is not offered, and why is said
    for records in ([_record_with_storage(tmp_path, "overlap", overlap=True)], []):
        spaces = kernel_spaces(bundle, records)
        assert not any(a.pass_name == "interleaved-pid" for s in spaces for a in s.atoms)
        skipped = [why for s in spaces for name, why in s.skipped if name == "interleaved-pid"]
        assert skipped and "needs buffers that never overlap" in skipped[0]


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("name", sorted(BROADCAST_ROWS))
def test_the_rebuilt_binary_is_bit_exact_on_the_gpu(name: str, tmp_path: Path) -> None:
    import torch

    kernel = BROADCAST_ROWS[name]
    target = f"cuda:{''.join(map(str, torch.cuda.get_device_capability()))}"
    original = bundle_for(kernel, Target.parse(target))
    outcome = run_pipeline(original, parse_pipeline("ttir(interleaved-pid{slices=16})"))
    assert outcome.changed
    record = suite_launch_record(kernel, target, snapshot_dir=tmp_path)
    report = verify(original, outcome.bundle, record, seeds=2, device="cuda", timeout=300)
    differential = [c for c in report.checks if c.name.startswith("differential")]
    assert differential and all(c.verdict == "pass" for c in differential), [c.__dict__ for c in report.checks]
    assert report.ok


def test_on_inductors_corpus_it_skips_gemms_that_already_group_and_kernels_without_a_repeating_load() -> None:
    """The kernels Inductor generated for real models (testsuite/corpus): offered on some (norms, batch norm with
    pooling, transposes), never on the GEMM templates (their GROUP_SIZE_M order is the one made for L2) or on a
    kernel without a `% n` index."""
    from kstrata.ir.triton_layout import load_cache_root

    loaded = load_cache_root(INPUTS.parent / "corpus" / "triton")
    bundles = loaded[0] if isinstance(loaded, tuple) else loaded
    cls = get_pass("interleaved-pid")
    spaces = {b.name: cls.schedule_space(b) for b in bundles}
    offered = {name for name, sp in spaces.items() if sp}
    assert any("layer_norm" in name or "group_norm" in name for name in offered)
    assert spaces["triton_mm"].reason and "already groups" in spaces["triton_mm"].reason
    assert not any(name.startswith(("triton_mm", "triton_tem")) for name in offered)
    assert any("no load repeats" in (sp.reason or "") for sp in spaces.values())


def test_on_gfx942_the_rewrite_rebuilds_a_changed_code_object_and_is_bit_exact_in_the_interpreter(
        tmp_path: Path) -> None:
    """The AMD path up to execution (no AMD GPU here): the TTIR edit lowers through Triton's AMD backend to a new
    hsaco, and its TTIR computes bit for bit what the original's does in the interpreter."""
    original, rewritten = assert_rewrite_bit_exact_in_interpreter(
        BROADCAST_ROWS["norm_apply_rows"], "ttir(interleaved-pid{slices=16})", tmp_path, target="hip:gfx942")
    assert rewritten.level("hsaco") != original.level("hsaco")


def test_the_renumbering_without_its_guard_is_caught_by_the_interpreter(tmp_path: Path) -> None:
    """A planted miscompile of this rewrite: the guard dropped, so on 125 programs (not 16 whole slices) the
    renumbering is no permutation (some programs' work is done twice, some never). `verify` on the CPU says
    `different`: the interpreter's runs find the elements no program wrote."""
    import re

    from kstrata.backends.verify import Verdict

    kernel = BROADCAST_ROWS["norm_apply_rows_odd"]
    original = bundle_for(kernel, Target.parse("cuda:90"))
    rewritten = apply_passes(_bare(original.text("ttir"), original.name), parse_pipeline("ttir(interleaved-pid)")).text
    guard = re.search(r"(%\d+) = arith.select (%\d+), (%\d+), %offs ", rewritten)
    assert guard is not None
    unguarded = rewritten.replace(guard.group(0), f"{guard.group(1)} = arith.select {guard.group(2)}, "
                                                  f"{guard.group(3)}, {guard.group(3)} ")
    record = suite_launch_record(kernel, "cuda:90", snapshot_dir=tmp_path)
    report = verify(original, _bare(unguarded, original.name), record, seeds=1, device="cpu", timeout=300)
    assert report.verdict is Verdict.DIFFERENT
    assert any(c.name.startswith("interpreter") and c.verdict == "fail" for c in report.checks)
    # the guarded rewrite on the same launch: equivalent
    assert verify(original, _bare(rewritten, original.name), record, seeds=1, device="cpu", timeout=300).ok
