"""How the interpreter represents Triton IR types with numpy: dtypes, shapes, and rounding to narrow floats.

Every SSA value is an ndarray whose leading axis is the *program axis*: a `tensor<128xf32>` is an array
of shape `[L, 128]` and a scalar `i32` one of shape `[L]`, where `L` is either the number of programs
being run or 1 for a value every program shares (constants, `tt.make_range`, splats of kernel
arguments). Ops broadcast the two forms against each other with numpy's rules.

Integers are held in signed numpy dtypes of their width (`i1` as `bool`); ops with unsigned semantics
reinterpret them as the unsigned dtype of the same width. Pointers are `int64` byte addresses.
`bf16` and the fp8 types use `ml_dtypes`; arithmetic on them goes through `float32` and is rounded
back to the IR type after each op.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
from xdsl.dialects.builtin import IndexType, IntegerType, TensorType
from xdsl.ir import Attribute

from kstrata.ir.dialects.tt import PointerType
from kstrata.ir.dialects.ttg import MemDescType

Arr = npt.NDArray[Any]

_FLOATS: dict[str, np.dtype[Any]] = {
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f8E4M3FN": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "f8E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "f8E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
}
_SIGNED: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.bool_), 8: np.dtype(np.int8), 16: np.dtype(np.int16), 32: np.dtype(np.int32), 64: np.dtype(np.int64)}
_UNSIGNED: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8), 8: np.dtype(np.uint8), 16: np.dtype(np.uint16), 32: np.dtype(np.uint32),
    64: np.dtype(np.uint64)}
#: Types numpy computes on natively and rounds correctly; the others go through float32.
_NATIVE_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class UnsupportedType(Exception):
    """An IR type the interpreter has no numpy representation for (turned into an InterpError by the caller)."""


def element_type(t: Attribute) -> Attribute:
    if isinstance(t, TensorType | MemDescType):
        return t.element_type
    return t


def shape_of(t: Attribute) -> tuple[int, ...]:
    if isinstance(t, TensorType | MemDescType):
        return tuple(t.get_shape())
    return ()


def dtype_of(t: Attribute) -> np.dtype[Any]:
    """The numpy dtype of values of type `t` (a scalar type or the element type of a tensor)."""
    e = element_type(t)
    if isinstance(e, PointerType):
        return np.dtype(np.int64)
    if isinstance(e, IntegerType):
        width = e.width.data
        if width not in _SIGNED:
            raise UnsupportedType(f"integer type {e}")
        return _SIGNED[width]
    if isinstance(e, IndexType):
        return np.dtype(np.int64)
    dt = _FLOATS.get(str(e))
    if dt is None:
        raise UnsupportedType(f"type {e}")
    return dt


def memory_dtype(t: Attribute) -> np.dtype[Any]:
    """The dtype of a value of type `t` in memory: `i1` is stored as one byte, as Triton does."""
    dt = dtype_of(t)
    return np.dtype(np.uint8) if dt == np.bool_ else dt


def bit_width(t: Attribute) -> int:
    e = element_type(t)
    if isinstance(e, IntegerType):
        return int(e.width.data)
    return dtype_of(e).itemsize * 8


def is_float(dt: np.dtype[Any]) -> bool:
    return dt.kind == "f" or dt in _FLOATS.values()


def unsigned(x: Arr, width: int) -> Arr:
    """`x` reinterpreted as an unsigned integer of `width` bits (two's complement)."""
    if x.dtype == np.bool_:
        return x.astype(np.uint8)
    return x.astype(_UNSIGNED[width])


def signed(x: Arr, width: int) -> Arr:
    """`x` as a signed integer of `width` bits; `i1` true is -1, as MLIR's signed i1 semantics say."""
    if x.dtype == np.bool_:
        return -x.astype(np.int8)
    return x.astype(_SIGNED[width])


def from_int_bits(x: Arr, width: int) -> Arr:
    """Truncate an integer array to `width` bits (wrapping) in the IR's representation."""
    if width == 1:
        return (x & 1).astype(np.bool_)
    return x.astype(_UNSIGNED[width]).astype(_SIGNED[width])


def wrap_int(value: int, width: int) -> int:
    """A Python int wrapped to a signed `width`-bit value (constants print unsigned values sometimes)."""
    if width == 1:
        return value & 1
    value &= (1 << width) - 1
    return value - (1 << width) if value >= 1 << (width - 1) else value


def to_compute(x: Arr) -> Arr:
    """A float array in a dtype numpy computes on correctly (narrow ml_dtypes go to float32)."""
    if x.dtype in _NATIVE_FLOATS:
        return x
    return x.astype(np.float32)


def round_to(x: Arr, dt: np.dtype[Any]) -> Arr:
    """Round a float array to `dt` (round to nearest even)."""
    return x if x.dtype == dt else x.astype(dt)


def round_toward_zero(x: Arr, dt: np.dtype[Any]) -> Arr:
    """Round a float array to `dt` toward zero: round to nearest, then step one ulp back where it grew."""
    r = x.astype(dt)
    wide = x.astype(np.float64)
    back = r.astype(np.float64)
    grew = np.isfinite(wide) & (np.abs(back) > np.abs(wide))
    if not grew.any():
        return r
    bits = r.view(_UNSIGNED[dt.itemsize * 8]).copy()
    # Sign-magnitude encodings: one less in the magnitude bits is one ulp toward zero (inf becomes max).
    bits[grew] -= 1
    return bits.view(dt)


def round_mantissa(x: Arr, bits: int, *, ties_away: bool = False) -> Arr:
    """Round float32 values to `bits` explicit mantissa bits (tf32: 10), keeping the float32 container."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    drop = 23 - bits
    half = np.uint64(1 << (drop - 1))
    if ties_away:
        rounded = u + half
    else:
        lsb = (u >> np.uint64(drop)) & np.uint64(1)
        rounded = u + half - np.uint64(1) + lsb
    rounded &= ~np.uint64((1 << drop) - 1)
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(f), out, f)
