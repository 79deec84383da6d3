"""Elementwise semantics: `arith`, `math`, and the elementwise `tt` ops (`mulhiui`, `precise_*`, `clampf`, externs).

Integers wrap (two's complement). Signed and unsigned variants reinterpret the same bits. Division
by zero is undefined in the IR; here it yields 0 (and `remsi`/`remui` the dividend) rather than trapping.
Shifts by the bit width or more give 0 (`shli`, `shrui`) or the sign fill (`shrsi`), as PTX's clamped
shifts do. `fptosi`/`fptoui` saturate, and NaN converts to 0, as PTX's `cvt.rzi` does.

Floats round to the IR type after every op: `f16`, `f32`, `f64` use numpy's correctly rounded
arithmetic; `bf16` and fp8 compute in `f32` and round to nearest even (double rounding through f32
is exact for add, sub, mul and div of these narrow types). Transcendentals (`math.exp`, …) use numpy's
`f32`/`f64` functions, so they may differ from CUDA's by an ulp or so.

NaN and signed zero:
- `arith.maximumf`/`minimumf` propagate NaN (either operand NaN gives NaN) and order -0.0 < +0.0.
- `arith.maxnumf`/`minnumf` return the non-NaN operand when one is NaN (NaN only if both are); of
  -0.0 and +0.0, `maxnumf` returns +0.0 and `minnumf` -0.0.
- `arith.cmpf` ordered predicates are false on NaN, unordered ones true; -0.0 == +0.0.
- `tt.clampf` with `propagateNan = all` returns NaN for a NaN input, otherwise `min(max(x, lo), hi)`
  with the NaN-dropping max/min above.
- `math.absf` clears the sign bit (of NaN and -0.0 too); `arith.negf` flips it.
- Conversions to `f8E4M3FN` and `f8E5M2` saturate (±inf and out-of-range values become the largest
  finite value, as the `cvt.rn.satfinite` of Triton's NVIDIA lowering does; AMD's lowering may
  differ); other narrowing conversions overflow to ±inf. NaN stays NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import DenseIntOrFPElementsAttr, FloatAttr, IntegerAttr
from xdsl.interpreter import Interpreter, InterpreterFunctions, PythonValues, impl, register_impls
from xdsl.ir import Operation

from kstrata.ir.dialects import TRITON_DIALECTS

from .state import Machine, lead_mask, unsupported
from .types import (
    Arr,
    bit_width,
    dtype_of,
    from_int_bits,
    is_float,
    round_mantissa,
    round_to,
    round_toward_zero,
    shape_of,
    signed,
    to_compute,
    unsigned,
    wrap_int,
)

OPS: dict[str, type[Operation]] = {op.name: op for d in TRITON_DIALECTS for op in d.operations}

Impl = Callable[[Any, Interpreter, Operation, PythonValues], PythonValues]


def register(cls: type[InterpreterFunctions], name: str, fn: Impl) -> None:
    """Attach `fn` as the implementation of the op called `name` (before `register_impls` runs).

    Ops the dialects do not define are skipped: the table here may name more than Triton emits.
    """
    if name not in OPS:
        return
    setattr(cls, "run_" + name.replace(".", "_"), impl(OPS[name])(fn))


def result_dtype(op: Operation) -> np.dtype[Any]:
    return dtype_of(op.results[0].type)


# ---------------------------------------------------------------------------------------------------
# integers
# ---------------------------------------------------------------------------------------------------
def _int_op(f: Callable[[Arr, Arr], Arr], *, kind: str = "signed") -> Callable[[Operation, Arr, Arr], Arr]:
    """An integer binary op on the bit patterns of its operands: `kind` is how they are read."""

    def run(op: Operation, a: Arr, b: Arr) -> Arr:
        width = bit_width(op.results[0].type)
        if kind == "unsigned":
            r = f(unsigned(a, width), unsigned(b, width))
        elif a.dtype == np.bool_:
            r = f(signed(a, width), signed(b, width))
        else:
            r = f(a, b)
        return from_int_bits(r, width) if width == 1 or r.dtype != a.dtype else r

    return run


def _safe(b: Arr) -> Arr:
    return np.where(b == 0, np.ones_like(b), b)


def _pow2_divisor(a: Arr, b: Arr) -> int | None:
    """k when every divisor in `b` is the same positive power of two 2**k and `a` is an integer array (Inductor's
    `x // 4194304`, `x % 512`): the divisions are then shifts and masks (gap task 01's kernel at its published size,
    2026-12-07 on the development CPU: 8.5-9.0 s -> 7.7 s a run). None otherwise."""
    if b.size == 0 or a.dtype.kind not in "iu" or b.dtype != a.dtype:
        return None
    v = int(b.flat[0])
    if v <= 0 or v & (v - 1) or (b.size > 1 and not (b == b.flat[0]).all()):
        return None
    return v.bit_length() - 1


def _broadcast(r: Arr, a: Arr, b: Arr) -> Arr:
    """`r`, computed from `a` alone, in the shape of `a` op `b`."""
    shape = np.broadcast_shapes(a.shape, b.shape)
    return r if r.shape == shape else np.broadcast_to(r, shape).copy()


def _shifted_quotient(a: Arr, k: int) -> Arr:
    """a / 2**k toward zero: a negative dividend is biased by 2**k - 1 before the arithmetic shift."""
    bias = (a >> (a.dtype.itemsize * 8 - 1)) & a.dtype.type((1 << k) - 1) if a.dtype.kind == "i" else 0
    q: Arr = (a + bias) >> a.dtype.type(k)
    return q


def _divsi(a: Arr, b: Arr) -> Arr:
    k = _pow2_divisor(a, b)
    if k is not None:
        return _broadcast(_shifted_quotient(a, k), a, b)
    bs = _safe(b)
    # numpy's // floors; C and LLVM truncate toward zero.
    q = a // bs
    q = q + ((q < 0) & (q * bs != a)).astype(q.dtype)
    return np.where(b == 0, np.zeros_like(q), q)


def _remsi(a: Arr, b: Arr) -> Arr:
    k = _pow2_divisor(a, b)
    if k is not None:  # the sign of the dividend, as C's and LLVM's remainder
        return _broadcast(a - (_shifted_quotient(a, k) << a.dtype.type(k)), a, b)
    q = _divsi(a, b)
    return np.where(b == 0, a, a - q * _safe(b))


def _divui(a: Arr, b: Arr) -> Arr:
    k = _pow2_divisor(a, b)
    if k is not None and a.dtype.kind == "u":
        return _broadcast(a >> a.dtype.type(k), a, b)
    return np.where(b == 0, np.zeros_like(a), a // _safe(b))


def _remui(a: Arr, b: Arr) -> Arr:
    k = _pow2_divisor(a, b)
    if k is not None and a.dtype.kind == "u":
        return _broadcast(a & a.dtype.type((1 << k) - 1), a, b)
    return np.where(b == 0, a, a % _safe(b))


def _shift(kind: str) -> Callable[[Operation, Arr, Arr], Arr]:
    def run(op: Operation, a: Arr, b: Arr) -> Arr:
        width = bit_width(op.results[0].type)
        if width == 1:
            return np.where(unsigned(b, 1) == 0, a, np.zeros_like(a) if kind != "shrsi" else a)
        amount = unsigned(b, width).astype(np.uint64)
        big = amount >= width
        amt = np.where(big, np.uint64(0), amount).astype(unsigned(a, width).dtype)
        if kind == "shli":
            r = from_int_bits(np.left_shift(unsigned(a, width), amt), width)
            return np.where(big, np.zeros_like(r), r)
        if kind == "shrui":
            r = from_int_bits(np.right_shift(unsigned(a, width), amt), width)
            return np.where(big, np.zeros_like(r), r)
        r = np.right_shift(a, amt.astype(a.dtype))
        return np.where(big, np.where(a < 0, -np.ones_like(a), np.zeros_like(a)), r)

    return run


def _extended_mul_hi(a: Arr, b: Arr, width: int) -> Arr:
    """High half of the unsigned product of two `width`-bit integers."""
    ua, ub = unsigned(a, width), unsigned(b, width)
    if width <= 32:
        prod = ua.astype(np.uint64) * ub.astype(np.uint64)
        return from_int_bits(prod >> np.uint64(width), width)
    mask = np.uint64(0xFFFFFFFF)
    a_lo, a_hi = ua & mask, ua >> np.uint64(32)
    b_lo, b_hi = ub & mask, ub >> np.uint64(32)
    lo_lo = a_lo * b_lo
    mid1 = a_hi * b_lo + (lo_lo >> np.uint64(32))
    mid2 = a_lo * b_hi + (mid1 & mask)
    hi = a_hi * b_hi + (mid1 >> np.uint64(32)) + (mid2 >> np.uint64(32))
    return np.asarray(hi.astype(np.int64))


def _bit_length(u: Arr) -> Arr:
    """Bits needed for each unsigned value (0 for 0), by a vectorized binary search."""
    x = u.astype(np.uint64)
    length = np.zeros(x.shape, dtype=np.int64)
    for s in (32, 16, 8, 4, 2, 1):
        t = x >> np.uint64(s)
        nz = t != 0
        length += np.where(nz, s, 0)
        x = np.where(nz, t, x)
    return np.asarray(length + (x != 0))


def _count_bits(kind: str) -> Callable[[Operation, Arr], Arr]:
    def run(op: Operation, a: Arr) -> Arr:
        width = bit_width(op.results[0].type)
        u = unsigned(a, width).astype(np.uint64)
        if kind == "ctpop":
            n = np.bitwise_count(u).astype(np.int64)
        elif kind == "ctlz":
            n = width - _bit_length(u)
        else:  # cttz: the position of the lowest set bit; the width for 0
            low = u & (~u + np.uint64(1))
            n = np.where(u == 0, width, _bit_length(low) - 1)
        return from_int_bits(n, width)

    return run


def _mul_extended(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
    a, b = args
    width = bit_width(op.results[0].type)
    low = from_int_bits(unsigned(a, width).astype(np.uint64) * unsigned(b, width).astype(np.uint64), width)
    high = _extended_mul_hi(a, b, width)
    if op.name == "arith.mulsi_extended":
        # Signed high half from the unsigned one: subtract b where a < 0 and a where b < 0 (mod 2**width).
        sa, sb = signed(a, width), signed(b, width)
        fix = np.where(sa < 0, unsigned(b, width), 0).astype(np.uint64) + \
            np.where(sb < 0, unsigned(a, width), 0).astype(np.uint64)
        high = from_int_bits(unsigned(high, width).astype(np.uint64) - fix, width)
    return (low, high)


def _add_extended(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
    a, b = args
    width = bit_width(op.results[0].type)
    total = from_int_bits(unsigned(a, width).astype(np.uint64) + unsigned(b, width).astype(np.uint64), width)
    return (total, unsigned(total, width) < unsigned(a, width))


_CMPI: dict[str, Callable[[Arr, Arr], Arr]] = {
    "eq": np.equal, "ne": np.not_equal, "slt": np.less, "sle": np.less_equal, "sgt": np.greater,
    "sge": np.greater_equal, "ult": np.less, "ule": np.less_equal, "ugt": np.greater, "uge": np.greater_equal,
}


def _cmpi(op: Operation, a: Arr, b: Arr) -> Arr:
    pred = op.MNEMONICS[op.properties["predicate"].value.data]  # type: ignore[attr-defined]
    width = bit_width(op.operands[0].type)
    if pred.startswith("u"):
        a, b = unsigned(a, width), unsigned(b, width)
    elif pred.startswith("s"):
        a, b = signed(a, width), signed(b, width)
    return np.asarray(_CMPI[pred](a, b))


# ---------------------------------------------------------------------------------------------------
# floats
# ---------------------------------------------------------------------------------------------------
def _float_op(f: Callable[..., Arr]) -> Callable[..., Arr]:
    """A float op computed in a correctly rounding dtype, then rounded to the result type."""

    def run(op: Operation, *xs: Arr) -> Arr:
        dt = result_dtype(op)
        return round_to(np.asarray(f(*(to_compute(x) for x in xs))), dt)

    return run


def _zero_pair(a: Arr, b: Arr) -> Arr:
    return np.asarray((a == 0) & (b == 0))


def _maximumf(a: Arr, b: Arr) -> Arr:
    r = np.maximum(a, b)  # propagates NaN
    return np.where(_zero_pair(a, b), a + b, r)  # -0 + +0 = +0: the larger zero


def _minimumf(a: Arr, b: Arr) -> Arr:
    r = np.minimum(a, b)
    return np.where(_zero_pair(a, b), -((-a) + (-b)), r)


def _maxnumf(a: Arr, b: Arr) -> Arr:
    r = np.fmax(a, b)  # drops NaN
    return np.where(_zero_pair(a, b), a + b, r)


def _minnumf(a: Arr, b: Arr) -> Arr:
    r = np.fmin(a, b)
    return np.where(_zero_pair(a, b), -((-a) + (-b)), r)


_CMPF: dict[str, Callable[[Arr, Arr], Arr]] = {
    "oeq": np.equal, "ogt": np.greater, "oge": np.greater_equal, "olt": np.less, "ole": np.less_equal,
    "one": np.not_equal, "ueq": np.equal, "ugt": np.greater, "uge": np.greater_equal, "ult": np.less,
    "ule": np.less_equal, "une": np.not_equal,
}


def _cmpf(op: Operation, a: Arr, b: Arr) -> Arr:
    pred = op.MNEMONICS[op.properties["predicate"].value.data]  # type: ignore[attr-defined]
    a, b = to_compute(a), to_compute(b)
    nan = np.isnan(a) | np.isnan(b)
    if pred == "false":
        return np.zeros(np.broadcast_shapes(a.shape, b.shape), dtype=np.bool_)
    if pred == "true":
        return np.ones(np.broadcast_shapes(a.shape, b.shape), dtype=np.bool_)
    if pred == "ord":
        return np.asarray(~nan)
    if pred == "uno":
        return np.asarray(nan)
    r = _CMPF[pred](a, b)
    return np.asarray((r & ~nan) if pred.startswith("o") else (r | nan))


def _erf(x: Arr) -> Arr:
    import torch

    return np.asarray(torch.special.erf(torch.from_numpy(np.ascontiguousarray(x))).numpy())


def _unary_float(f: Callable[[Arr], Arr]) -> Callable[[Operation, Arr], Arr]:
    return _float_op(f)


_MATH_UNARY: dict[str, Callable[[Arr], Arr]] = {
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p,
    "expm1": np.expm1, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "erf": _erf,
    "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "round": lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5),
    "roundeven": np.rint, "absf": np.abs, "cbrt": np.cbrt,
}


# ---------------------------------------------------------------------------------------------------
# casts
# ---------------------------------------------------------------------------------------------------
_SATFINITE: dict[np.dtype[Any], float] = {
    np.dtype(ml_dtypes.float8_e4m3fn): 448.0, np.dtype(ml_dtypes.float8_e5m2): 57344.0}

def _fp_to_int(op: Operation, x: Arr, *, is_unsigned: bool) -> Arr:
    width = bit_width(op.results[0].type)
    f = x.astype(np.float64)
    if width == 1:
        return np.asarray(np.trunc(np.nan_to_num(f)) != 0)
    lo, hi = (0.0, 2.0**width - 1) if is_unsigned else (-(2.0 ** (width - 1)), 2.0 ** (width - 1) - 1)
    t = np.clip(np.trunc(np.nan_to_num(f, nan=0.0, posinf=hi, neginf=lo)), lo, hi)
    if width == 64:
        # float64 cannot hold 2**63 - 1: the clip rounds up to 2**63, which would wrap.
        big = t >= 2.0 ** (63 if not is_unsigned else 64)
        if is_unsigned:
            r = np.where(big, np.uint64(2**64 - 1), t.astype(np.uint64)).astype(np.int64)
        else:
            r = np.where(big, np.int64(2**63 - 1), t.astype(np.int64))
        return r
    src = t.astype(np.uint64 if is_unsigned else np.int64)
    return from_int_bits(src, width)


def _int_to_fp(op: Operation, x: Arr, *, is_unsigned: bool) -> Arr:
    width = bit_width(op.operands[0].type)
    v = unsigned(x, width) if is_unsigned else signed(x, width)
    dt = result_dtype(op)
    if dt == np.float32 or dt == np.float64:
        return v.astype(dt)
    return v.astype(np.float64).astype(dt)


def _bitcast(op: Operation, x: Arr) -> Arr:
    dt = result_dtype(op)
    if x.dtype == dt:
        return x
    if x.dtype.itemsize != dt.itemsize:
        raise unsupported(op, f"bitcast {x.dtype} to {dt}")
    return np.ascontiguousarray(x).view(dt)


def _fp_to_fp(op: Operation, x: Arr) -> Arr:
    dt = result_dtype(op)
    limit = _SATFINITE.get(dt)
    if limit is not None and x.dtype != dt:
        # Triton's NVIDIA lowering converts with `cvt.rn.satfinite`: out-of-range values and ±inf
        # become the largest finite value of the sign; NaN stays NaN.
        x = np.clip(x.astype(np.float32), -limit, limit)
    rounding = op.properties.get("rounding")
    if dt.itemsize > x.dtype.itemsize or rounding is None or "rtne" in str(rounding):
        if x.dtype.itemsize == 1 or dt.itemsize == 1:
            return x.astype(np.float32).astype(dt)
        return x.astype(dt)
    return round_toward_zero(x.astype(np.float64), dt)


# ---------------------------------------------------------------------------------------------------
# extern functions (libdevice / ocml) by the name they compute
# ---------------------------------------------------------------------------------------------------
_EXTERN: dict[str, Callable[..., Arr]] = {
    **_MATH_UNARY, "fabs": np.abs, "pow": np.power, "powf": np.power, "fmax": np.fmax, "fmin": np.fmin,
    "atan2": np.arctan2, "fmod": np.fmod, "exp10": lambda x: np.power(10.0, x), "hypot": np.hypot,
    "isnan": np.isnan, "isinf": np.isinf, "signbit": np.signbit, "rint": np.rint, "nearbyint": np.rint,
    "rcp": lambda x: 1 / x, "fast_expf": np.exp, "fast_logf": np.log,
}


def _extern_name(symbol: str) -> str:
    name = symbol
    for prefix in ("__nv_", "__ocml_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    for suffix in ("_f32", "_f64", "_f16"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if name not in _EXTERN and name.endswith("f") and name[:-1] in _EXTERN:
        name = name[:-1]
    return name


class ArithFunctions(InterpreterFunctions):
    """`arith`, `math` and the elementwise `tt` ops; all are pure and computed for every program."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine


def _binary(f: Callable[[Operation, Arr, Arr], Arr]) -> Impl:
    def run(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        return (f(op, args[0], args[1]),)

    return run


def _unary(f: Callable[[Operation, Arr], Arr]) -> Impl:
    def run(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
        return (f(op, args[0]),)

    return run


def _constant(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
    value = op.properties.get("value")
    if value is None:
        value = op.attributes.get("value")
    t = op.results[0].type
    dt = dtype_of(t)
    shape = shape_of(t)
    if isinstance(value, IntegerAttr):
        v = wrap_int(value.value.data, bit_width(t)) if not is_float(dt) else value.value.data
        return (np.full((1, *shape), v, dtype=dt),)
    if isinstance(value, FloatAttr):
        return (np.full((1, *shape), value.value.data, dtype=np.float64).astype(dt),)
    if isinstance(value, DenseIntOrFPElementsAttr):
        vals = value.get_values()
        if is_float(dt):
            arr = np.asarray(vals, dtype=np.float64).astype(dt)
        else:
            width = bit_width(t)
            arr = np.asarray([wrap_int(int(v), width) for v in vals], dtype=np.int64).astype(dt)
        if arr.size == 1:
            return (np.broadcast_to(arr.reshape((1,) * (1 + len(shape))), (1, *shape)),)
        return (arr.reshape(1, *shape),)
    raise unsupported(op, f"constant {value}")


def _select(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
    c, a, b = args
    nd = max(a.ndim, b.ndim)
    return (np.where(lead_mask(c, nd), a, b),)


def _poison(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
    t = op.results[0].type
    return (np.zeros((1, *shape_of(t)), dtype=dtype_of(t)),)


def _fma(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
    a, b, c = (x.astype(np.float64) for x in args)
    # One rounding from the exact product-sum; float64 is exact enough for f32 and narrower inputs.
    return (round_to(a * b + c, result_dtype(op)),)


def _clampf(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
    x, lo, hi = (to_compute(v) for v in args)
    r = _minnumf(_maxnumf(x, lo), hi)
    if "all" in str(op.properties.get("propagateNan")):
        r = np.where(np.isnan(x), x, r)
    return (round_to(r, result_dtype(op)),)


def _extern(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
    symbol = op.properties["symbol"].data  # type: ignore[attr-defined]
    f = _EXTERN.get(_extern_name(symbol))
    if f is None:
        raise unsupported(op, f"extern function {symbol}")
    dt = result_dtype(op)
    xs = [to_compute(x) if is_float(x.dtype) else x for x in args]
    r = np.asarray(f(*xs))
    return (r.astype(dt) if r.dtype != dt else r,)


def _inline_asm(self: Any, interp: Interpreter, op: Operation, args: PythonValues) -> PythonValues:
    asm = op.properties["asm_string"].data.strip()  # type: ignore[attr-defined]
    if asm.startswith("cvt.rna.tf32.f32") and len(args) == 1 and len(op.results) == 1:
        return (round_mantissa(args[0], 10, ties_away=True),)
    raise unsupported(op, f"inline assembly {asm!r}")


def _plain(f: Callable[[Arr, Arr], Arr]) -> Callable[[Operation, Arr, Arr], Arr]:
    def run(op: Operation, a: Arr, b: Arr) -> Arr:
        return np.asarray(f(a, b))

    return run


def _int_binary(name: str, f: Callable[[Arr, Arr], Arr], kind: str = "signed") -> None:
    register(ArithFunctions, name, _binary(_int_op(f, kind=kind)))


def _install() -> None:
    cls = ArithFunctions
    register(cls, "arith.constant", _constant)
    register(cls, "arith.select", _select)
    register(cls, "ub.poison", _poison)
    # Integer ops: i1 goes through int8 and is truncated back (`addi` on i1 is xor, as modular arithmetic says).
    _int_binary("arith.addi", np.add)
    _int_binary("arith.subi", np.subtract)
    _int_binary("arith.muli", np.multiply)
    _int_binary("arith.divsi", _divsi)
    _int_binary("arith.remsi", _remsi)
    _int_binary("arith.divui", _divui, "unsigned")
    _int_binary("arith.remui", _remui, "unsigned")
    _int_binary("arith.ceildivsi", lambda a, b: -_divsi(-a, b))
    _int_binary("arith.floordivsi", lambda a, b: np.where(b == 0, np.zeros_like(a), a // _safe(b)))
    _int_binary("arith.ceildivui", lambda a, b: _divui(a + b - 1, b), "unsigned")
    _int_binary("arith.minsi", np.minimum)
    _int_binary("arith.maxsi", np.maximum)
    _int_binary("arith.minui", np.minimum, "unsigned")
    _int_binary("arith.maxui", np.maximum, "unsigned")
    bitwise: dict[str, Callable[[Arr, Arr], Arr]] = {
        "arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or, "arith.xori": np.bitwise_xor}
    for name, fb in bitwise.items():
        register(cls, name, _binary(_plain(fb)))
    for kind in ("shli", "shrui", "shrsi"):
        register(cls, f"arith.{kind}", _binary(_shift(kind)))
    register(cls, "arith.cmpi", _binary(_cmpi))
    register(cls, "tt.mulhiui", _binary(lambda op, a, b: _extended_mul_hi(a, b, bit_width(op.results[0].type))))
    # Floats.
    register(cls, "arith.addf", _binary(_float_op(np.add)))
    register(cls, "arith.subf", _binary(_float_op(np.subtract)))
    register(cls, "arith.mulf", _binary(_float_op(np.multiply)))
    register(cls, "arith.divf", _binary(_float_op(np.divide)))
    register(cls, "arith.remf", _binary(_float_op(np.fmod)))
    register(cls, "arith.maximumf", _binary(_float_op(_maximumf)))
    register(cls, "arith.minimumf", _binary(_float_op(_minimumf)))
    register(cls, "arith.maxnumf", _binary(_float_op(_maxnumf)))
    register(cls, "arith.minnumf", _binary(_float_op(_minnumf)))
    register(cls, "arith.negf", _unary(lambda op, x: -x))
    register(cls, "arith.cmpf", _binary(_cmpf))
    register(cls, "math.fma", _fma)
    register(cls, "math.powf", _binary(_float_op(np.power)))
    register(cls, "math.atan2", _binary(_float_op(np.arctan2)))
    register(cls, "math.copysign", _binary(_float_op(np.copysign)))
    for name, fu in _MATH_UNARY.items():
        register(cls, f"math.{name}", _unary(_unary_float(fu)))
    register(cls, "math.absi", _unary(lambda op, x: np.abs(x)))
    for kind in ("ctpop", "ctlz", "cttz"):
        register(cls, f"math.{kind}", _unary(_count_bits(kind)))
    register(cls, "arith.mului_extended", _mul_extended)
    register(cls, "arith.mulsi_extended", _mul_extended)
    register(cls, "arith.addui_extended", _add_extended)
    register(cls, "math.fpowi", _binary(lambda op, x, n: round_to(
        np.power(to_compute(x), n.astype(np.float64)).astype(to_compute(x).dtype), result_dtype(op))))
    register(cls, "tt.precise_sqrt", _unary(lambda op, x: round_to(np.sqrt(x.astype(np.float64)), result_dtype(op))))
    register(cls, "tt.precise_divf", _binary(
        lambda op, a, b: round_to(a.astype(np.float64) / b.astype(np.float64), result_dtype(op))))
    register(cls, "tt.clampf", _clampf)
    register(cls, "tt.extern_elementwise", _extern)
    register(cls, "tt.elementwise_inline_asm", _inline_asm)
    # Casts.
    register(cls, "arith.extsi", _unary(lambda op, x: signed(x, bit_width(op.operands[0].type)).astype(result_dtype(op))))
    register(cls, "arith.extui", _unary(
        lambda op, x: unsigned(x, bit_width(op.operands[0].type)).astype(result_dtype(op))))
    register(cls, "arith.trunci", _unary(lambda op, x: from_int_bits(x, bit_width(op.results[0].type))))
    register(cls, "arith.extf", _unary(lambda op, x: x.astype(result_dtype(op))))
    register(cls, "arith.truncf", _unary(_fp_to_fp))
    register(cls, "arith.sitofp", _unary(lambda op, x: _int_to_fp(op, x, is_unsigned=False)))
    register(cls, "arith.uitofp", _unary(lambda op, x: _int_to_fp(op, x, is_unsigned=True)))
    register(cls, "arith.fptosi", _unary(lambda op, x: _fp_to_int(op, x, is_unsigned=False)))
    register(cls, "arith.fptoui", _unary(lambda op, x: _fp_to_int(op, x, is_unsigned=True)))
    register(cls, "arith.index_cast", _unary(lambda op, x: x.astype(result_dtype(op))))
    register(cls, "arith.bitcast", _unary(_bitcast))
    register(cls, "tt.bitcast", _unary(_bitcast))
    register(cls, "tt.fp_to_fp", _unary(_fp_to_fp))
    register(cls, "tt.int_to_ptr", _unary(lambda op, x: x.astype(np.int64)))
    register(cls, "tt.ptr_to_int", _unary(lambda op, x: x.astype(result_dtype(op))))


_install()
register_impls(ArithFunctions)

__all__ = ["OPS", "ArithFunctions", "register", "result_dtype"]
