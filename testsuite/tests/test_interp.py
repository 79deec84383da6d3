"""The Triton-IR interpreter (`kstrata.ir.interp`): the whole suite at TTIR and TTGIR, and each op family on small IR.

Suite kernels run on their own inputs with outputs poisoned beforehand and are compared with their
PyTorch reference within the kernel's tolerance, at TTIR (cuda:90) and TTGIR (cuda:90, hip:gfx942);
a few are also compared with Triton's own interpreter. The hand-written IR checks what the suite
cannot show: wrapping and unsigned integer ops, NaN and -0.0, masks, out-of-bounds reports,
divergent control flow, async-copy waits, atomics in program order, and refusal of unsupported ops.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.interp import Buffer, InterpError, run_bundle, run_kernel
from kstrata.ir.triton_ir import parse_triton
from kstrata.ir.triton_layout import load_cache_entry, read_index
from kstrata.testsuite.kernels import all_kernels, get_kernel
from kstrata.testsuite.kernels.run import first_mismatch, poison_
from kstrata.testsuite.kernels.spec import SuiteKernel

from .conftest import computed_once

# ---------------------------------------------------------------------------------------------------
# the suite
# ---------------------------------------------------------------------------------------------------
LEVELS = (("cuda:90", "ttir"), ("cuda:90", "ttgir"), ("hip:gfx942", "ttgir"))

@pytest.fixture(scope="module")
def suite_bundles(suite_cache: Path) -> dict[tuple[str, str], KernelBundle]:
    index = read_index(suite_cache)
    return {(rec["suite_kernel"], rec["target"]): load_cache_entry(suite_cache / key, index)
            for key, rec in index.items()}


def _suite_cases() -> list[Any]:
    cases = []
    for kernel in all_kernels():
        for target, level in LEVELS:
            marks = [pytest.mark.skip(reason=f"not built for {target}")] \
                if target.split(":")[0] in kernel.unsupported_backends else []
            cases.append(pytest.param(kernel.name, target, level, id=f"{kernel.name}-{target}-{level}", marks=marks))
    return cases


def run_suite_kernel(kernel: SuiteKernel, bundle: KernelBundle, level: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Run `kernel` under the interpreter on its own inputs (outputs poisoned); return its outputs and check them."""
    args = kernel.make_args(torch.Generator().manual_seed(seed))
    expected = kernel.reference({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in args.items()})
    for out in kernel.outputs:
        if out not in kernel.inout:
            poison_(args[out])
    params = {p.name for p in bundle.params}
    # Integer arguments equal to 1 were specialized into the IR as constants by Triton's JIT.
    interp_args = {k: (Buffer.from_torch(v) if isinstance(v, torch.Tensor) else v) for k, v in args.items() if k in params}
    grid = tuple(kernel.grid(args))
    run_bundle(bundle, level, grid + (1,) * (3 - len(grid)), interp_args)
    for out in kernel.outputs:
        mismatch = first_mismatch(out, args[out], expected[out], kernel.atol, kernel.rtol)
        assert mismatch is None, f"{kernel.name} at {bundle.target} {level}: {mismatch}"
    return {out: args[out] for out in kernel.outputs}


@pytest.mark.parametrize(("name", "target", "level"), _suite_cases())
def test_suite_kernel_matches_reference(name: str, target: str, level: str,
                                        suite_bundles: dict[tuple[str, str], KernelBundle]) -> None:
    kernel = get_kernel(name)
    run_suite_kernel(kernel, suite_bundles[(name, target)], level)


#: Every suite kernel is compared with Triton's own interpreter too (bit for bit where the outputs are
#: integers; floating outputs within twice the kernel's tolerance against its reference, since both
#: interpreters are held to that tolerance and may sit on either side of the reference).
TRITON_INTERPRETER_KERNELS = tuple(k.name for k in all_kernels())

_TRITON_INTERPRETER_SCRIPT = """
import os, sys, json
os.environ["TRITON_INTERPRET"] = "1"
import torch
from kstrata.testsuite.kernels import get_kernel
from kstrata.testsuite.kernels.run import poison_, launch
out_dir, names = sys.argv[1], json.loads(sys.argv[2])
for name in names:
    k = get_kernel(name)
    args = k.make_args(torch.Generator().manual_seed(0))
    for o in k.outputs:
        if o not in k.inout:
            poison_(args[o])
    launch(k, args)
    for o in k.outputs:
        torch.save(args[o], os.path.join(out_dir, f"{name}.{o}.pt"))
"""


@pytest.fixture(scope="module")
def triton_interpreter_outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    def run(out: Path) -> None:
        subprocess.run([sys.executable, "-c", _TRITON_INTERPRETER_SCRIPT, str(out),
                        json.dumps(TRITON_INTERPRETER_KERNELS)], check=True, timeout=300, capture_output=True)

    return computed_once(tmp_path_factory, "triton-interpreter-outputs", run)


@pytest.mark.parametrize("name", TRITON_INTERPRETER_KERNELS)
def test_agrees_with_triton_interpreter(name: str, suite_bundles: dict[tuple[str, str], KernelBundle],
                                        triton_interpreter_outputs: Path) -> None:
    kernel = get_kernel(name)
    ours = run_suite_kernel(kernel, suite_bundles[(name, "cuda:90")], "ttgir")
    for out, got in ours.items():
        theirs = torch.load(triton_interpreter_outputs / f"{name}.{out}.pt")
        if got.dtype.is_floating_point:
            torch.testing.assert_close(got, theirs, atol=2 * kernel.atol, rtol=2 * kernel.rtol, equal_nan=True)
        else:
            assert torch.equal(got, theirs), f"{name}.{out} differs from Triton's interpreter"


# ---------------------------------------------------------------------------------------------------
# hand-written IR
# ---------------------------------------------------------------------------------------------------
def kernel_ir(params: str, body: str) -> str:
    return f"module {{\n  tt.func public @k({params}) {{\n{body}\n    tt.return\n  }}\n}}\n"


def elementwise(op: str, ty: str, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any] | None = None,
                out_ty: str | None = None, out_dtype: Any = None) -> np.ndarray[Any, Any]:
    """Run `%r = <op> %a[, %b] : ...` over tensors loaded from `a` (and `b`); return the stored result."""
    n = a.size
    out_ty = out_ty or ty
    out = np.zeros(n, dtype=out_dtype or a.dtype)
    load_b = "" if b is None else f"""
    %pb = tt.splat %b : !tt.ptr<{ty}> -> tensor<{n}x!tt.ptr<{ty}>>
    %qb = tt.addptr %pb, %r : tensor<{n}x!tt.ptr<{ty}>>, tensor<{n}xi32>
    %vb = tt.load %qb : tensor<{n}x!tt.ptr<{ty}>>"""
    operands = "%va" if b is None else "%va, %vb"
    cast = out_ty != ty and not op.startswith("arith.cmp")
    types = f"tensor<{n}x{ty}> to tensor<{n}x{out_ty}>" if cast else f"tensor<{n}x{ty}>"
    body = f"""
    %r = tt.make_range {{end = {n} : i32, start = 0 : i32}} : tensor<{n}xi32>
    %pa = tt.splat %a : !tt.ptr<{ty}> -> tensor<{n}x!tt.ptr<{ty}>>
    %qa = tt.addptr %pa, %r : tensor<{n}x!tt.ptr<{ty}>>, tensor<{n}xi32>
    %va = tt.load %qa : tensor<{n}x!tt.ptr<{ty}>>{load_b}
    %v = {op} {operands} : {types}
    %po = tt.splat %o : !tt.ptr<{out_ty}> -> tensor<{n}x!tt.ptr<{out_ty}>>
    %qo = tt.addptr %po, %r : tensor<{n}x!tt.ptr<{out_ty}>>, tensor<{n}xi32>
    tt.store %qo, %v : tensor<{n}x!tt.ptr<{out_ty}>>"""
    params = f"%a: !tt.ptr<{ty}>, %b: !tt.ptr<{ty}>, %o: !tt.ptr<{out_ty}>"
    run_kernel(kernel_ir(params, body), (1, 1, 1), [a, a if b is None else b, out])
    return out


def test_integer_ops_wrap() -> None:
    a = np.array([2**31 - 1, -(2**31), 7, -7], dtype=np.int32)
    b = np.array([1, -1, 2, 2], dtype=np.int32)
    assert elementwise("arith.addi", "i32", a, b).tolist() == [-(2**31), 2**31 - 1, 9, -5]
    assert elementwise("arith.muli", "i32", a, b).tolist() == [2**31 - 1, -(2**31), 14, -14]
    # Signed division truncates toward zero; the remainder takes the dividend's sign.
    assert elementwise("arith.divsi", "i32", a, b)[2:].tolist() == [3, -3]
    assert elementwise("arith.remsi", "i32", a, b)[2:].tolist() == [1, -1]
    c = np.array([-128, 127, 100, -1], dtype=np.int8)
    assert elementwise("arith.addi", "i8", c, c).tolist() == [0, -2, -56, -2]


def test_division_by_one_power_of_two_truncates_as_the_general_path() -> None:
    """A divisor that is the same power of two in every lane (Inductor's `x // 4194304`, `x % 512`) is a shift and
    a mask; toward zero and with the dividend's sign like any other divisor, on every width's extremes."""
    def trunc(x: int, y: int) -> int:
        q = abs(x) // abs(y)
        return q if (x >= 0) == (y > 0) else -q

    rng = np.random.default_rng(0)
    for ty, dt in (("i32", np.int32), ("i64", np.int64)):
        info = np.iinfo(dt)
        a = np.concatenate([np.array([info.min, info.min + 1, info.max, -1, 0, 1, -4097, 4097], dtype=dt),
                            rng.integers(info.min, info.max, 56, dtype=dt)])
        for k in (0, 1, 9, 22, info.bits - 2):
            b = np.full(a.shape, 1 << k, dtype=dt)
            q = [trunc(x, 1 << k) for x in a.tolist()]
            assert elementwise("arith.divsi", ty, a, b).tolist() == q, (ty, k)
            assert elementwise("arith.remsi", ty, a, b).tolist() == [x - y * (1 << k) for x, y in zip(a.tolist(), q, strict=True)]
            u = a.astype(dt).view(np.uint32 if dt == np.int32 else np.uint64)
            assert elementwise("arith.divui", ty, a, b).view(u.dtype).tolist() == (u >> k).tolist(), (ty, k)
            assert elementwise("arith.remui", ty, a, b).view(u.dtype).tolist() == (u & ((1 << k) - 1)).tolist()
    # a lane with another divisor: the general path, the same answers
    a = np.array([-7, 7, -8, 9], dtype=np.int32)
    assert elementwise("arith.divsi", "i32", a, np.array([4, 4, 4, 3], dtype=np.int32)).tolist() == [-1, 1, -2, 3]


def test_unsigned_integer_ops() -> None:
    a = np.array([-1, -8, 7, 2**31], dtype=np.int64).astype(np.int32)
    b = np.array([2, 3, 2, 2], dtype=np.int32)
    assert elementwise("arith.divui", "i32", a, b).tolist() == [2**31 - 1, (2**32 - 8) // 3, 3, 2**30]
    assert elementwise("arith.remui", "i32", a, b).tolist() == [1, (2**32 - 8) % 3, 1, 0]
    assert elementwise("arith.shrui", "i32", a, b).tolist() == [2**30 - 1, (2**32 - 8) >> 3, 1, 2**29]
    assert elementwise("arith.shrsi", "i32", a, b).tolist() == [-1, -1, 1, -(2**29)]
    assert elementwise("arith.maxui", "i32", a, b).tolist() == [-1, -8, 7, -(2**31)]
    assert elementwise("arith.cmpi ult,", "i32", a, b, out_ty="i1", out_dtype=np.bool_).tolist() == \
        [False, False, False, False]
    assert elementwise("arith.cmpi slt,", "i32", a, b, out_ty="i1", out_dtype=np.bool_).tolist() == \
        [True, True, False, True]
    hi = elementwise("tt.mulhiui", "i32", a, np.full(4, -1, dtype=np.int32))
    expect = [((x % 2**32) * (2**32 - 1)) >> 32 for x in a.tolist()]
    assert (hi.astype(np.int64) % 2**32).tolist() == expect
    small = np.array([-1, 5, -128, 0], dtype=np.int8)
    assert elementwise("arith.extui", "i8", small, out_ty="i32", out_dtype=np.int32).tolist() == [255, 5, 128, 0]
    assert elementwise("arith.extsi", "i8", small, out_ty="i32", out_dtype=np.int32).tolist() == [-1, 5, -128, 0]
    wide = np.array([300, -1, 2**31 - 1, 128], dtype=np.int32)
    assert elementwise("arith.trunci", "i32", wide, out_ty="i8", out_dtype=np.int8).tolist() == [44, -1, -1, -128]


def test_bit_counting_and_extended_multiply() -> None:
    a = np.array([0, 1, -1, 0x00F0], dtype=np.int32)
    assert elementwise("math.ctpop", "i32", a).tolist() == [0, 1, 32, 4]
    assert elementwise("math.ctlz", "i32", a).tolist() == [32, 31, 0, 24]
    assert elementwise("math.cttz", "i32", a).tolist() == [32, 0, 0, 4]
    x = np.array([-3, 2**31 - 1, -(2**31), 5], dtype=np.int32)
    y = np.array([7, 2**31 - 1, -1, -1], dtype=np.int32)
    body = """
    %r = tt.make_range {end = 4 : i32, start = 0 : i32} : tensor<4xi32>
    %pa = tt.splat %a : !tt.ptr<i32> -> tensor<4x!tt.ptr<i32>>
    %qa = tt.addptr %pa, %r : tensor<4x!tt.ptr<i32>>, tensor<4xi32>
    %va = tt.load %qa : tensor<4x!tt.ptr<i32>>
    %pb = tt.splat %b : !tt.ptr<i32> -> tensor<4x!tt.ptr<i32>>
    %qb = tt.addptr %pb, %r : tensor<4x!tt.ptr<i32>>, tensor<4xi32>
    %vb = tt.load %qb : tensor<4x!tt.ptr<i32>>
    %lo, %hi = arith.mulsi_extended %va, %vb : tensor<4xi32>
    tt.store %qa, %lo : tensor<4x!tt.ptr<i32>>
    tt.store %qb, %hi : tensor<4x!tt.ptr<i32>>"""
    lo, hi = x.copy(), y.copy()
    run_kernel(kernel_ir("%a: !tt.ptr<i32>, %b: !tt.ptr<i32>", body), (1, 1, 1), [lo, hi])
    exact = [int(p) * int(q) for p, q in zip(x.tolist(), y.tolist(), strict=True)]
    assert hi.tolist() == [e >> 32 for e in exact]
    assert (lo.astype(np.int64) % 2**32).tolist() == [e % 2**32 for e in exact]


def test_shift_by_width_or_more() -> None:
    a = np.array([1, -1, 1, -1], dtype=np.int32)
    b = np.array([32, 40, 31, 33], dtype=np.int32)
    assert elementwise("arith.shli", "i32", a, b).tolist() == [0, 0, -(2**31), 0]
    assert elementwise("arith.shrsi", "i32", a, b).tolist() == [0, -1, 0, -1]


NAN = float("nan")


def _bits(x: np.ndarray[Any, Any]) -> list[int]:
    return x.view(np.uint32).tolist()  # type: ignore[no-any-return]


def test_min_max_nan_and_signed_zero() -> None:
    a = np.array([NAN, 1.0, -0.0, 0.0, NAN], dtype=np.float32)
    b = np.array([1.0, NAN, 0.0, -0.0, NAN], dtype=np.float32)
    mx = elementwise("arith.maximumf", "f32", a, b)
    assert np.isnan(mx[:2]).all() and np.isnan(mx[4])
    assert _bits(mx[2:4]) == _bits(np.array([0.0, 0.0], dtype=np.float32))
    mn = elementwise("arith.minimumf", "f32", a, b)
    assert np.isnan(mn[:2]).all()
    assert _bits(mn[2:4]) == _bits(np.array([-0.0, -0.0], dtype=np.float32))
    mxn = elementwise("arith.maxnumf", "f32", a, b)
    assert mxn[:2].tolist() == [1.0, 1.0] and np.isnan(mxn[4])
    assert _bits(mxn[2:4]) == _bits(np.array([0.0, 0.0], dtype=np.float32))
    mnn = elementwise("arith.minnumf", "f32", a, b)
    assert mnn[:2].tolist() == [1.0, 1.0]
    assert _bits(mnn[2:4]) == _bits(np.array([-0.0, -0.0], dtype=np.float32))
    # Ordered compares are false on NaN, unordered ones true; -0.0 == +0.0.
    olt = elementwise("arith.cmpf olt,", "f32", a, b, out_ty="i1", out_dtype=np.bool_)
    ult = elementwise("arith.cmpf ult,", "f32", a, b, out_ty="i1", out_dtype=np.bool_)
    oeq = elementwise("arith.cmpf oeq,", "f32", a, b, out_ty="i1", out_dtype=np.bool_)
    assert olt.tolist() == [False, False, False, False, False]
    assert ult.tolist() == [True, True, False, False, True]
    assert oeq.tolist() == [False, False, True, True, False]


def test_narrow_float_rounding() -> None:
    a = np.array([1.0, 2048.0, 65504.0, 0.1], dtype=np.float16)
    b = np.array([2.0**-11, 1.0, 32.0, 0.2], dtype=np.float16)
    got = elementwise("arith.addf", "f16", a, b)
    with np.errstate(over="ignore"):
        want = (a.astype(np.float64) + b.astype(np.float64)).astype(np.float16)  # one rounding of the exact sum
    assert got.view(np.uint16).tolist() == want.view(np.uint16).tolist()
    x = np.array([1.0 + 2.0**-8, 3.0, -1.0 - 2.0**-8], dtype=np.float32)
    bf = elementwise("arith.truncf", "f32", x, out_ty="bf16", out_dtype=ml_dtypes.bfloat16)
    assert bf.astype(np.float32).tolist() == [1.0, 3.0, -1.0]  # ties to even
    y = np.array([1.99, -1.99, 0.3, 1000.0, -np.inf], dtype=np.float32)
    f8 = elementwise("arith.truncf", "f32", y, out_ty="f8E4M3FN", out_dtype=ml_dtypes.float8_e4m3fn)
    assert f8.astype(np.float32).tolist() == [2.0, -2.0, 0.3125, 448.0, -448.0]  # satfinite


def test_fp_to_fp_round_toward_zero() -> None:
    x = np.array([1.99, -1.99, 0.33], dtype=np.float32)
    n = x.size
    body = f"""
    %r = tt.make_range {{end = {n} : i32, start = 0 : i32}} : tensor<{n}xi32>
    %pa = tt.splat %a : !tt.ptr<f32> -> tensor<{n}x!tt.ptr<f32>>
    %qa = tt.addptr %pa, %r : tensor<{n}x!tt.ptr<f32>>, tensor<{n}xi32>
    %va = tt.load %qa : tensor<{n}x!tt.ptr<f32>>
    %v = tt.fp_to_fp %va, rounding = rtz : tensor<{n}xf32> -> tensor<{n}xf16>
    %po = tt.splat %o : !tt.ptr<f16> -> tensor<{n}x!tt.ptr<f16>>
    %qo = tt.addptr %po, %r : tensor<{n}x!tt.ptr<f16>>, tensor<{n}xi32>
    tt.store %qo, %v : tensor<{n}x!tt.ptr<f16>>"""
    out = np.zeros(n, dtype=np.float16)
    run_kernel(kernel_ir("%a: !tt.ptr<f32>, %o: !tt.ptr<f16>", body), (1, 1, 1), [x, out])
    assert (np.abs(out.astype(np.float64)) <= np.abs(x.astype(np.float64))).all()
    assert np.abs(out.astype(np.float64) - x).max() < 2.0**-9


VECTOR_COPY = """
    %pid = tt.get_program_id x : i32
    %c4 = arith.constant 4 : i32
    %base = arith.muli %pid, %c4 : i32
    %r = tt.make_range {end = 4 : i32, start = 0 : i32} : tensor<4xi32>
    %bs = tt.splat %base : i32 -> tensor<4xi32>
    %offs = arith.addi %bs, %r : tensor<4xi32>
    %ns = tt.splat %n : i32 -> tensor<4xi32>
    %mask = arith.cmpi slt, %offs, %ns : tensor<4xi32>
    %other = arith.constant dense<-1.0> : tensor<4xf32>
    %pa = tt.splat %a : !tt.ptr<f32> -> tensor<4x!tt.ptr<f32>>
    %qa = tt.addptr %pa, %offs : tensor<4x!tt.ptr<f32>>, tensor<4xi32>
    %v = tt.load %qa, %mask, %other : tensor<4x!tt.ptr<f32>>
    %po = tt.splat %o : !tt.ptr<f32> -> tensor<4x!tt.ptr<f32>>
    %qo = tt.addptr %po, %offs : tensor<4x!tt.ptr<f32>>, tensor<4xi32>
    tt.store %qo, %v {STORE_MASK}: tensor<4x!tt.ptr<f32>> loc("copy.py":7:5)"""


def _copy_ir(store_mask: bool) -> str:
    return kernel_ir("%a: !tt.ptr<f32>, %o: !tt.ptr<f32>, %n: i32",
                     VECTOR_COPY.replace(" {STORE_MASK}", ", %mask " if store_mask else " "))


def test_masked_load_with_other() -> None:
    a = np.arange(6, dtype=np.float32)
    out = np.zeros(8, dtype=np.float32)
    run_kernel(_copy_ir(store_mask=False), (2, 1, 1), [a, out, 6])
    # Lanes 6 and 7 are masked off: they read `other` and never touch `a` (which has only 6 elements).
    assert out.tolist() == [0, 1, 2, 3, 4, 5, -1, -1]


def test_out_of_bounds_store_names_op_location_and_program() -> None:
    a = np.arange(6, dtype=np.float32)
    out = np.zeros(6, dtype=np.float32)
    with pytest.raises(InterpError) as info:
        run_kernel(_copy_ir(store_mask=False), (2, 1, 1), [a, out, 6], origin="copy.ttir")
    message = str(info.value)
    assert "tt.store" in message and "copy.py:7:5" in message and "program (1, 0, 0)" in message
    assert "outside every buffer" in message and "past the end of buffer 'o'" in message
    assert out.tolist() == [0] * 6  # every lane is checked before any is written
    # With the store masked too, the same launch is fine.
    run_kernel(_copy_ir(store_mask=True), (2, 1, 1), [a, out, 6])
    assert out.tolist() == [0, 1, 2, 3, 4, 5]


def test_a_text_run_again_is_parsed_once_and_runs_on_its_new_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    import kstrata.ir.interp as interp
    import kstrata.ir.triton_ir as triton_ir

    parsed: list[Any] = []
    real = triton_ir.parse_triton
    monkeypatch.setattr(triton_ir, "parse_triton", lambda text, path=None, **kw: parsed.append(path) or real(text, path, **kw))
    monkeypatch.setattr(interp, "_PARSED", type(interp._PARSED)())
    text = _copy_ir(store_mask=True)
    for first in (0, 10):  # the second run reads its own inputs, not the first run's
        out = np.zeros(6, dtype=np.float32)
        run_kernel(text, (2, 1, 1), [np.arange(first, first + 6, dtype=np.float32), out, 6], origin="copy.ttir")
        assert out.tolist() == list(range(first, first + 6))
    assert parsed == ["copy.ttir"]
    with pytest.raises(InterpError, match="past the end of buffer 'o'"):  # names still come from the one parse
        run_kernel(_copy_ir(store_mask=False), (2, 1, 1), [np.zeros(6, np.float32), np.zeros(6, np.float32), 6])
    run_kernel(text, (1, 1, 1), [np.zeros(4, np.float32), np.zeros(4, np.float32), 4], origin="other.ttir")
    assert parsed == ["copy.ttir", None, "other.ttir"]  # another text or origin is parsed on its own
    for n in range(interp._PARSED_KEPT):  # only the last few texts are kept
        run_kernel(kernel_ir("%a: !tt.ptr<f32>", f"    %c = arith.constant {n}.0 : f32\n    tt.store %a, %c : !tt.ptr<f32>"),
                   (1, 1, 1), [np.zeros(1, np.float32)])
    assert len(interp._PARSED) == interp._PARSED_KEPT and ("copy.ttir" not in {k[1] for k in interp._PARSED})


def test_misaligned_access_is_an_error() -> None:
    body = """
    %p = tt.bitcast %a : !tt.ptr<f32> -> !tt.ptr<i8>
    %c1 = arith.constant 1 : i32
    %q = tt.addptr %p, %c1 : !tt.ptr<i8>, i32
    %f = tt.bitcast %q : !tt.ptr<i8> -> !tt.ptr<f32>
    %v = tt.load %f : !tt.ptr<f32>
    tt.store %a, %v : !tt.ptr<f32>"""
    with pytest.raises(InterpError, match="misaligned"):
        run_kernel(kernel_ir("%a: !tt.ptr<f32>", body), (1, 1, 1), [np.zeros(4, dtype=np.float32)])


def test_buffer_offset_and_scalar_store() -> None:
    body = """
    %pid = tt.get_program_id x : i32
    %np = tt.get_num_programs x : i32
    %q = tt.addptr %a, %pid : !tt.ptr<i32>, i32
    tt.store %q, %np : !tt.ptr<i32>"""
    storage = np.zeros(8, dtype=np.int32)
    run_kernel(kernel_ir("%a: !tt.ptr<i32>", body), (3, 1, 1), [Buffer(storage, 2)])
    assert storage.tolist() == [0, 0, 3, 3, 3, 0, 0, 0]
    # An already parsed module runs too; a 2-D grid counts all its programs.
    module = parse_triton(kernel_ir("%a: !tt.ptr<i32>", body)).module
    run_kernel(module, (2, 2, 1), [Buffer(storage, 4)])
    assert storage.tolist() == [0, 0, 3, 3, 2, 2, 0, 0]


PER_PROGRAM_LOOP = """
    %pid = tt.get_program_id x : i32
    %c0 = arith.constant 0 : i32
    %c1 = arith.constant 1 : i32
    %s = scf.for %i = %c0 to %pid step %c1 iter_args(%acc = %c0) -> (i32)  : i32 {
      %q = tt.addptr %a, %i : !tt.ptr<i32>, i32
      %x = tt.load %q : !tt.ptr<i32>
      %t = arith.addi %acc, %x : i32
      scf.yield %t : i32
    }
    %o = tt.addptr %out, %pid : !tt.ptr<i32>, i32
    tt.store %o, %s : !tt.ptr<i32>"""


def test_loop_bounds_differ_between_programs() -> None:
    a = np.arange(1, 9, dtype=np.int32)
    out = np.zeros(8, dtype=np.int32)
    # Program p loads a[0..p): a load past a[p-1] by a finished program would be caught (a has 8 elements).
    run_kernel(kernel_ir("%a: !tt.ptr<i32>, %out: !tt.ptr<i32>", PER_PROGRAM_LOOP), (8, 1, 1), [a[:7].copy(), out])
    assert out.tolist() == [sum(range(1, p + 1)) for p in range(8)]


def test_scf_if_diverges_per_program() -> None:
    body = """
    %pid = tt.get_program_id x : i32
    %c2 = arith.constant 2 : i32
    %r = arith.remsi %pid, %c2 : i32
    %c0 = arith.constant 0 : i32
    %even = arith.cmpi eq, %r, %c0 : i32
    %v = scf.if %even -> (i32) {
      %q = tt.addptr %a, %pid : !tt.ptr<i32>, i32
      %x = tt.load %q : !tt.ptr<i32>
      scf.yield %x : i32
    } else {
      %m = arith.muli %pid, %c2 : i32
      scf.yield %m : i32
    }
    %o = tt.addptr %out, %pid : !tt.ptr<i32>, i32
    tt.store %o, %v : !tt.ptr<i32>"""
    a = np.array([10, -1, 12, -1, 14], dtype=np.int32)
    out = np.zeros(6, dtype=np.int32)
    run_kernel(kernel_ir("%a: !tt.ptr<i32>, %out: !tt.ptr<i32>", body), (5, 1, 1), [a, out])
    assert out.tolist() == [10, 2, 12, 6, 14, 0]


def test_scf_while_runs_until_every_program_is_done() -> None:
    body = """
    %pid = tt.get_program_id x : i32
    %c0 = arith.constant 0 : i32
    %c1 = arith.constant 1 : i32
    %r:2 = scf.while (%n = %pid, %steps = %c0) : (i32, i32) -> (i32, i32) {
      %go = arith.cmpi sgt, %n, %c0 : i32
      scf.condition(%go) %n, %steps : i32, i32
    } do {
    ^bb0(%n2: i32, %s2: i32):
      %n3 = arith.shrsi %n2, %c1 : i32
      %s3 = arith.addi %s2, %c1 : i32
      scf.yield %n3, %s3 : i32, i32
    }
    %o = tt.addptr %out, %pid : !tt.ptr<i32>, i32
    tt.store %o, %r#1 : !tt.ptr<i32>"""
    out = np.zeros(9, dtype=np.int32)
    run_kernel(kernel_ir("%out: !tt.ptr<i32>", body), (9, 1, 1), [out])
    assert out.tolist() == [int(p).bit_length() for p in range(9)]


def test_atomics_run_in_program_order() -> None:
    body = """
    %pid = tt.get_program_id x : i32
    %c1 = arith.constant 1 : i32
    %one = arith.addi %pid, %c1 : i32
    %old = tt.atomic_rmw add, acq_rel, gpu, %cnt, %one : (!tt.ptr<i32>, i32) -> i32
    %o = tt.addptr %out, %pid : !tt.ptr<i32>, i32
    tt.store %o, %old : !tt.ptr<i32>
    %c0 = arith.constant 0 : i32
    %prev = tt.atomic_cas acq_rel, gpu, %lock, %c0, %one : (!tt.ptr<i32>, i32, i32) -> i32
    %o2 = tt.addptr %out2, %pid : !tt.ptr<i32>, i32
    tt.store %o2, %prev : !tt.ptr<i32>
    %x = tt.atomic_rmw exch, acq_rel, gpu, %last, %one : (!tt.ptr<i32>, i32) -> i32"""
    cnt, lock, last = (np.zeros(1, dtype=np.int32) for _ in range(3))
    out, out2 = np.zeros(4, dtype=np.int32), np.zeros(4, dtype=np.int32)
    params = "%cnt: !tt.ptr<i32>, %lock: !tt.ptr<i32>, %last: !tt.ptr<i32>, %out: !tt.ptr<i32>, %out2: !tt.ptr<i32>"
    run_kernel(kernel_ir(params, body), (4, 1, 1), [cnt, lock, last, out, out2])
    assert cnt.tolist() == [10] and out.tolist() == [0, 1, 3, 6]  # exclusive prefix sums: program order
    assert lock.tolist() == [1] and out2.tolist() == [0, 1, 1, 1]  # program 0 wins the compare-and-swap
    assert last.tolist() == [4]


def test_tensor_atomics_with_shared_addresses_and_masks() -> None:
    body = """
    %pid = tt.get_program_id x : i32
    %r = tt.make_range {end = 4 : i32, start = 0 : i32} : tensor<4xi32>
    %c2 = arith.constant dense<2> : tensor<4xi32>
    %slot = arith.remsi %r, %c2 : tensor<4xi32>
    %ps = tt.splat %u : !tt.ptr<i32> -> tensor<4x!tt.ptr<i32>>
    %qs = tt.addptr %ps, %slot : tensor<4x!tt.ptr<i32>>, tensor<4xi32>
    %pids = tt.splat %pid : i32 -> tensor<4xi32>
    %c1 = arith.constant dense<1> : tensor<4xi32>
    %val = arith.subi %pids, %c1 : tensor<4xi32>
    %c3 = arith.constant dense<3> : tensor<4xi32>
    %on = arith.cmpi slt, %r, %c3 : tensor<4xi32>
    %x = tt.atomic_rmw umax, relaxed, gpu, %qs, %val, %on : (tensor<4x!tt.ptr<i32>>, tensor<4xi32>, tensor<4xi1>) -> tensor<4xi32>
    %pf = tt.splat %f : !tt.ptr<f32> -> tensor<4x!tt.ptr<f32>>
    %z = arith.constant dense<0> : tensor<4xi32>
    %qf = tt.addptr %pf, %z : tensor<4x!tt.ptr<f32>>, tensor<4xi32>
    %half = arith.constant dense<0.5> : tensor<4xf32>
    %old = tt.atomic_rmw fadd, relaxed, gpu, %qf, %half, %on : (tensor<4x!tt.ptr<f32>>, tensor<4xf32>, tensor<4xi1>) -> tensor<4xf32>
    %c4 = arith.constant 4 : i32
    %base = arith.muli %pid, %c4 : i32
    %bs = tt.splat %base : i32 -> tensor<4xi32>
    %offs = arith.addi %bs, %r : tensor<4xi32>
    %po = tt.splat %o : !tt.ptr<f32> -> tensor<4x!tt.ptr<f32>>
    %qo = tt.addptr %po, %offs : tensor<4x!tt.ptr<f32>>, tensor<4xi32>
    tt.store %qo, %old, %on : tensor<4x!tt.ptr<f32>>"""
    u = np.zeros(2, dtype=np.int32)
    f = np.zeros(1, dtype=np.float32)
    o = np.full(8, -1.0, dtype=np.float32)
    run_kernel(kernel_ir("%u: !tt.ptr<i32>, %f: !tt.ptr<f32>, %o: !tt.ptr<f32>", body), (2, 1, 1), [u, f, o])
    # Program 0 stores -1 (the largest unsigned value) to both slots; lane 3 is masked off.
    assert u.tolist() == [-1, -1]
    assert f.tolist() == [3.0]  # six unmasked lanes add 0.5 each
    assert o.tolist() == [0.0, 0.5, 1.0, -1.0, 1.5, 2.0, 2.5, -1.0]  # old values in program, then lane order


def test_chunked_grid_gives_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    import kstrata.ir.interp as interp

    a = np.arange(1, 40, dtype=np.int32)
    want = np.zeros(40, dtype=np.int32)
    run_kernel(kernel_ir("%a: !tt.ptr<i32>, %out: !tt.ptr<i32>", PER_PROGRAM_LOOP), (40, 1, 1), [a, want])
    monkeypatch.setattr(interp, "CHUNK_ELEMENTS", 3)
    got = np.zeros(40, dtype=np.int32)
    run_kernel(kernel_ir("%a: !tt.ptr<i32>, %out: !tt.ptr<i32>", PER_PROGRAM_LOOP), (40, 1, 1), [a, got])
    assert got.tolist() == want.tolist()


def test_dot_input_precision() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(16 * 16).astype(np.float32)
    b = rng.standard_normal(16 * 16).astype(np.float32)
    exact = a.reshape(16, 16).astype(np.float64) @ b.reshape(16, 16).astype(np.float64)

    def dot(precision: str) -> np.ndarray[Any, Any]:
        body = f"""
    %r = tt.make_range {{end = 256 : i32, start = 0 : i32}} : tensor<256xi32>
    %pa = tt.splat %a : !tt.ptr<f32> -> tensor<256x!tt.ptr<f32>>
    %qa = tt.addptr %pa, %r : tensor<256x!tt.ptr<f32>>, tensor<256xi32>
    %va = tt.load %qa : tensor<256x!tt.ptr<f32>>
    %pb = tt.splat %b : !tt.ptr<f32> -> tensor<256x!tt.ptr<f32>>
    %qb = tt.addptr %pb, %r : tensor<256x!tt.ptr<f32>>, tensor<256xi32>
    %vb = tt.load %qb : tensor<256x!tt.ptr<f32>>
    %ma = tt.reshape %va : tensor<256xf32> -> tensor<16x16xf32>
    %mb = tt.reshape %vb : tensor<256xf32> -> tensor<16x16xf32>
    %z = arith.constant dense<0.000000e+00> : tensor<16x16xf32>
    %d = tt.dot %ma, %mb, %z, inputPrecision = {precision} : tensor<16x16xf32> * tensor<16x16xf32> -> tensor<16x16xf32>
    %flat = tt.reshape %d : tensor<16x16xf32> -> tensor<256xf32>
    %po = tt.splat %o : !tt.ptr<f32> -> tensor<256x!tt.ptr<f32>>
    %qo = tt.addptr %po, %r : tensor<256x!tt.ptr<f32>>, tensor<256xi32>
    tt.store %qo, %flat : tensor<256x!tt.ptr<f32>>"""
        out = np.zeros(256, dtype=np.float32)
        run_kernel(kernel_ir("%a: !tt.ptr<f32>, %b: !tt.ptr<f32>, %o: !tt.ptr<f32>", body), (1, 1, 1), [a, b, out])
        return np.abs(out.reshape(16, 16) - exact).max()  # type: ignore[no-any-return]

    ieee, tf32, tf32x3, bf16x3 = dot("ieee"), dot("tf32"), dot("tf32x3"), dot("bf16x3")
    assert ieee < 1e-5 and tf32x3 < 1e-5 and bf16x3 < 1e-4
    assert tf32 > 1e-4  # 10-bit mantissas lose accuracy the 3-pass forms recover


def test_reduce_and_scan_with_combine_regions() -> None:
    body = """
    %r = tt.make_range {end = 8 : i32, start = 0 : i32} : tensor<8xi32>
    %pa = tt.splat %a : !tt.ptr<i32> -> tensor<8x!tt.ptr<i32>>
    %qa = tt.addptr %pa, %r : tensor<8x!tt.ptr<i32>>, tensor<8xi32>
    %v = tt.load %qa : tensor<8x!tt.ptr<i32>>
    %m:2 = "tt.reduce"(%v, %r) <{axis = 0 : i32}> ({
    ^bb0(%x: i32, %xi: i32, %y: i32, %yi: i32):
      %gt = arith.cmpi sgt, %y, %x : i32
      %bv = arith.select %gt, %y, %x : i32
      %bi = arith.select %gt, %yi, %xi : i32
      tt.reduce.return %bv, %bi : i32, i32
    }) : (tensor<8xi32>, tensor<8xi32>) -> (i32, i32)
    tt.store %mx, %m#0 : !tt.ptr<i32>
    tt.store %mi, %m#1 : !tt.ptr<i32>
    %s = "tt.scan"(%v) <{axis = 0 : i32, reverse = false}> ({
    ^bb0(%x: i32, %y: i32):
      %t = arith.addi %x, %y : i32
      tt.scan.return %t : i32
    }) : (tensor<8xi32>) -> tensor<8xi32>
    %ps = tt.splat %cs : !tt.ptr<i32> -> tensor<8x!tt.ptr<i32>>
    %qs = tt.addptr %ps, %r : tensor<8x!tt.ptr<i32>>, tensor<8xi32>
    tt.store %qs, %s : tensor<8x!tt.ptr<i32>>"""
    a = np.array([3, 9, -2, 9, 5, 0, 1, 7], dtype=np.int32)
    mx, mi, cs = np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(8, np.int32)
    run_kernel(kernel_ir("%a: !tt.ptr<i32>, %mx: !tt.ptr<i32>, %mi: !tt.ptr<i32>, %cs: !tt.ptr<i32>", body),
               (1, 1, 1), [a, mx, mi, cs])
    assert mx.tolist() == [9] and mi.tolist() == [1]  # first of the ties: combine(left, right) keeps left
    assert cs.tolist() == np.cumsum(a).tolist()


ASYNC_TTGIR = """#shared = #ttg.swizzled_shared<{vec = 1, perPhase = 1, maxPhase = 1, order = [0]}>
#smem = #ttg.shared_memory
module attributes {"ttg.num-ctas" = 1 : i32, "ttg.num-warps" = 4 : i32, ttg.target = "cuda:90", "ttg.threads-per-warp" = 32 : i32} {
  tt.func public @k(%a: !tt.ptr<f32>, %o: !tt.ptr<f32>) {
    %c0 = arith.constant 0 : i32
    %r = tt.make_range {end = 4 : i32, start = 0 : i32} : tensor<4xi32>
    %pa = tt.splat %a : !tt.ptr<f32> -> tensor<4x!tt.ptr<f32>>
    %qa = tt.addptr %pa, %r : tensor<4x!tt.ptr<f32>>, tensor<4xi32>
    %buf = ttg.local_alloc : () -> !ttg.memdesc<2x4xf32, #shared, #smem, mutable>
    %slot = ttg.memdesc_index %buf[%c0] : !ttg.memdesc<2x4xf32, #shared, #smem, mutable> -> !ttg.memdesc<4xf32, #shared, #smem, mutable>
    %t = ttg.async_copy_global_to_local %qa, %slot : tensor<4x!tt.ptr<f32>> -> <4xf32, #shared, #smem, mutable>
    %g = ttg.async_commit_group tokens %t
    %w = ttg.async_wait %g {num = WAIT : i32}
    %v = ttg.local_load %slot token %w : !ttg.memdesc<4xf32, #shared, #smem, mutable> -> tensor<4xf32>
    %po = tt.splat %o : !tt.ptr<f32> -> tensor<4x!tt.ptr<f32>>
    %qo = tt.addptr %po, %r : tensor<4x!tt.ptr<f32>>, tensor<4xi32>
    tt.store %qo, %v : tensor<4x!tt.ptr<f32>>
    ttg.local_dealloc %buf : !ttg.memdesc<2x4xf32, #shared, #smem, mutable>
    tt.return
  }
}
"""


def test_async_copy_needs_its_wait() -> None:
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    out = np.zeros(4, dtype=np.float32)
    run_kernel(ASYNC_TTGIR.replace("WAIT", "0"), (2, 1, 1), [a, out])
    assert out.tolist() == [1, 2, 3, 4]
    # `num = 1` leaves the only group outstanding: the local_load reads data that may not have arrived.
    with pytest.raises(InterpError, match=r"no ttg\.async_wait has waited for"):
        run_kernel(ASYNC_TTGIR.replace("WAIT", "1"), (2, 1, 1), [a, out])


def test_dropped_wait_in_suite_matmul_is_caught(suite_bundles: dict[tuple[str, str], KernelBundle]) -> None:
    bundle = suite_bundles[("matmul_fp16", "cuda:90")]
    ttgir = bundle.text("ttgir")
    assert "num = 2 : i32" in ttgir
    kernel = get_kernel("matmul_fp16")
    args = kernel.make_args(torch.Generator().manual_seed(0))
    params = [p.name for p in bundle.params]
    values = [Buffer.from_torch(args[n]) if isinstance(args[n], torch.Tensor) else args[n] for n in params]
    grid = tuple(kernel.grid(args))
    with pytest.raises(InterpError, match=r"ttng\.warp_group_dot .*async_wait"):
        run_kernel(ttgir.replace("num = 2 : i32", "num = 5 : i32"), grid + (1,) * (3 - len(grid)), values)


def test_unsupported_op_is_refused_before_running() -> None:
    body = """
    %v = tt.elementwise_inline_asm "mov.b32 $0, $1;" {constraints = "=r,r", packed_element = 1 : i32, pure = true} %n : i32 -> i32
    tt.store %a, %v : !tt.ptr<i32>"""
    out = np.zeros(1, dtype=np.int32)
    with pytest.raises(InterpError, match=r"tt\.elementwise_inline_asm is not supported by the interpreter"):
        run_kernel(kernel_ir("%a: !tt.ptr<i32>, %n: i32", body), (1, 1, 1), [out, 3])
    assert out.tolist() == [0]


def test_extern_elementwise_libdevice() -> None:
    x = np.array([0.25, 0.5, 1.0, 3.0], dtype=np.float32)
    for symbol, want in (("__nv_tanhf", np.tanh(x)), ("__ocml_exp_f32", np.exp(x)), ("__nv_rsqrtf", 1 / np.sqrt(x))):
        body = f"""
    %r = tt.make_range {{end = 4 : i32, start = 0 : i32}} : tensor<4xi32>
    %pa = tt.splat %a : !tt.ptr<f32> -> tensor<4x!tt.ptr<f32>>
    %qa = tt.addptr %pa, %r : tensor<4x!tt.ptr<f32>>, tensor<4xi32>
    %va = tt.load %qa : tensor<4x!tt.ptr<f32>>
    %v = tt.extern_elementwise %va {{libname = "", libpath = "", pure = true, symbol = "{symbol}"}} : (tensor<4xf32>) -> tensor<4xf32>
    tt.store %qa, %v : tensor<4x!tt.ptr<f32>>"""
        got = x.copy()
        run_kernel(kernel_ir("%a: !tt.ptr<f32>", body), (1, 1, 1), [got])
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_device_assert() -> None:
    body = """
    %pid = tt.get_program_id x : i32
    %c2 = arith.constant 2 : i32
    %ok = arith.cmpi slt, %pid, %c2 : i32
    %s = tt.splat %ok : i1 -> tensor<2xi1>
    tt.assert %s, "pid too large" : tensor<2xi1>"""
    run_kernel(kernel_ir("", body), (2, 1, 1), [])
    with pytest.raises(InterpError, match=r"in program \(2, 0, 0\): device assertion failed: pid too large"):
        run_kernel(kernel_ir("", body), (3, 1, 1), [])


def test_run_bundle_maps_arguments_by_name(suite_bundles: dict[tuple[str, str], KernelBundle]) -> None:
    bundle = suite_bundles[("vector_add", "cuda:90")]
    x, y = np.arange(2000, dtype=np.float32), np.ones(2000, dtype=np.float32)
    out = np.zeros(2000, dtype=np.float32)
    run_bundle(bundle, "ttir", (2, 1, 1), {"x_ptr": x, "y_ptr": y, "out_ptr": out, "n": 2000})
    assert (out == x + 1).all()
    with pytest.raises(InterpError, match="missing"):
        run_bundle(bundle, "ttir", (2, 1, 1), {"x_ptr": x, "y_ptr": y, "out_ptr": out})


def test_off_by_one_mask_in_suite_kernel_is_caught(suite_bundles: dict[tuple[str, str], KernelBundle]) -> None:
    bundle = suite_bundles[("vector_add", "cuda:90")]
    ttir = bundle.text("ttir")
    assert ttir.count("arith.cmpi slt") == 1
    n = 1000
    x, y, out = (np.zeros(n, dtype=np.float32) for _ in range(3))
    with pytest.raises(InterpError, match=r"tt\.load at .*elementwise\.py:\d+:\d+ in program \(0, 0, 0\): "
                                          r"address 0x[0-9a-f]+ is outside every buffer; nearest: 0 bytes past "
                                          r"the end of buffer 'x_ptr'"):
        run_kernel(ttir.replace("arith.cmpi slt", "arith.cmpi sle"), (1, 1, 1), [x, y, out, n])
