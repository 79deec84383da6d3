"""A CPU interpreter for Triton IR (TTIR and TTGIR): the reference semantics kstrata's equivalence checks use.

    run_kernel(ttir_text, grid=(n, 1, 1), args=[x, y, out, n])   # stores land in `out` in place

Built on xDSL's interpreter framework, vectorized with numpy over the whole grid: every SSA value
carries a leading program axis, so one pass over the IR runs every program of a chunk at once (see
`types.py` for the value representation, `state.py` for predicated control flow, `memory.py` for
memory and out-of-bounds detection). Programs are numbered x fastest, then y, then z, and chunks of
programs run in that order; within an op, memory effects happen in program order.

Ops the interpreter does not model raise `InterpError("op X is not supported by the interpreter")`
before anything runs, never a wrong result. Not modelled: block pointers (`tt.make_tensor_ptr`,
`tt.advance`), tensor descriptors and TMA (`tt.make_tensor_descriptor`, `tt.descriptor_*`,
`ttng.async_tma_*`, `ttng.tensormap_*`), mbarriers (`ttng.init_barrier`, `ttng.wait_barrier`, …),
`ttg.global_scratch_alloc`, inline assembly other than `cvt.rna.tf32.f32`, AMD buffer ops with a
stride operand, and `cf` branches whose condition differs between the active programs.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from xdsl.dialects.builtin import ArrayAttr, ModuleOp, TensorType
from xdsl.interpreter import Interpreter, OpImplResult, PythonValues
from xdsl.ir import Operation

from kstrata.ir.dialects.tt import PointerType
from kstrata.ir.dialects.ttg import MemDescType

from .arith_ops import ArithFunctions
from .memory import GlobalMemory
from .state import InterpError, Machine, op_location, unsupported
from .triton_ops import TritonFunctions
from .types import UnsupportedType, dtype_of, is_float, wrap_int

if TYPE_CHECKING:
    from kstrata.ir.bundle import KernelBundle

#: Programs run together so that no value holds more than about this many elements. Smaller chunks keep an op's
#: operands in the CPU's caches; a chunk's ops cost tens of microseconds of Python each. Measured on this project's
#: 2-core CPU machine (2026-12-07): gap task 01's LayerNorm kernel at its published size (131072 programs of 512)
#: took 10.1-11.8 s at 1 << 22 and 6.9-7.8 s at 1 << 20 (7.9 at 1 << 19, 8.1 at 1 << 21); a looped row
#: normalization (16384 rows of 4096, BLOCK 1024) 3.4 s against 1.9-2.1; with BLOCK 32, 1.5 s at both.
CHUNK_ELEMENTS = 1 << 20


@dataclass
class Buffer:
    """The memory behind one pointer argument: `storage` (1-D, mutated in place) and the element offset into it."""

    storage: np.ndarray[Any, Any]
    offset: int = 0

    @classmethod
    def from_torch(cls, tensor: Any) -> Buffer:
        """A Buffer sharing the memory of a CPU `torch.Tensor`: its whole storage, at its storage offset.

        Stores through the buffer land in the tensor; bf16 and fp8 tensors are seen through `ml_dtypes`.
        """
        import ml_dtypes
        import torch

        views = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
                 torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
                 torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
                 torch.float8_e4m3fnuz: (torch.uint8, ml_dtypes.float8_e4m3fnuz),
                 torch.float8_e5m2fnuz: (torch.uint8, ml_dtypes.float8_e5m2fnuz)}
        if tensor.device.type != "cpu":
            raise InterpError(f"Buffer.from_torch needs a CPU tensor, got one on {tensor.device}")
        storage = tensor.untyped_storage()
        flat = torch.empty(0, dtype=tensor.dtype).set_(storage, 0, (storage.nbytes() // tensor.element_size(),), (1,))
        if tensor.dtype in views:
            via, dtype = views[tensor.dtype]
            return cls(flat.view(via).numpy().view(dtype), int(tensor.storage_offset()))
        return cls(flat.numpy(), int(tensor.storage_offset()))


ArgValue = Buffer | np.ndarray[Any, Any] | int | float | bool


class _Interpreter(Interpreter):
    """xDSL's interpreter with a direct dispatch: its own wraps every error in a print of the whole module."""

    def _run_op(self, op: Operation, inputs: PythonValues) -> OpImplResult:
        entry = self._impls._impl_dict.get(type(op))
        if entry is None:
            raise unsupported(op)
        functions, fn = entry
        try:
            return fn(functions, self, op, inputs)
        except InterpError:
            raise
        except UnsupportedType as exc:
            raise unsupported(op, str(exc)) from None
        except Exception as exc:  # a bug of ours or an IR shape we did not foresee: say which op
            where = op_location(op)
            at = f" at {where}" if where else ""
            raise InterpError(f"{op.name}{at}: the interpreter failed: {type(exc).__name__}: {exc}") from exc


def _entry(module: ModuleOp) -> Operation:
    funcs = [op for op in module.body.ops if op.name == "tt.func"]
    public = [f for f in funcs if str(getattr(f, "sym_visibility", None) or "") in ('"public"', "public")]
    chosen = public or [f for f in funcs if getattr(f, "sym_visibility", None) is None] or funcs
    if not chosen:
        raise InterpError("the module has no tt.func to run")
    entry: Operation = chosen[0]
    return entry


def _check_supported(func: Operation, interp: _Interpreter) -> None:
    known = interp._impls._impl_dict
    for op in func.walk():
        if op is func:
            continue
        if type(op) not in known:
            raise unsupported(op)
        for r in op.results:
            try:
                if not isinstance(r.type, MemDescType) and r.type.name != "ttg.async.token":
                    dtype_of(r.type)
            except UnsupportedType as exc:
                raise unsupported(op, str(exc)) from None


def _max_elements(func: Operation) -> int:
    most = 1
    for op in func.walk():
        for r in op.results:
            t = r.type
            shape: tuple[int, ...] = ()
            if isinstance(t, TensorType):
                shape = tuple(t.get_shape())
            elif isinstance(t, MemDescType):
                alloc = t.alloc_shape
                shape = tuple(d.data for d in alloc.data) if isinstance(alloc, ArrayAttr) else t.get_shape()
            most = max(most, int(np.prod(shape)) if shape else 1)
    return most


def _scalar(value: Any, t: Any, index: int) -> np.ndarray[Any, Any]:
    dt = dtype_of(t)
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(-1)[0].item()
    if isinstance(value, bool | np.bool_) and dt == np.bool_:
        return np.array([bool(value)])
    if is_float(dt):
        return np.array([float(value)], dtype=np.float64).astype(dt)
    if isinstance(value, float):
        raise InterpError(f"argument {index}: expected an integer for {t}, got {value!r}")
    return np.array([wrap_int(int(value), 1 if dt == np.bool_ else dt.itemsize * 8)]).astype(dt)


#: Modules parsed from text, by (text, origin), most recently used last. A verify runs each level of the
#: original and the candidate on every input set (2-4 of them), and parsing a suite kernel's text with
#: xDSL (0.1-0.4 s) costs more than interpreting it on the CPU; the interpreter only reads the module.
_PARSED: OrderedDict[tuple[str, str | None], tuple[ModuleOp, dict[Any, str]]] = OrderedDict()
_PARSED_KEPT = 8


def _parsed(text: str, origin: str | None) -> tuple[ModuleOp, dict[Any, str]]:
    """The module of `text` and its values' names, parsed once per process for the last few texts."""
    key = (text, origin)
    hit = _PARSED.get(key)
    if hit is None:
        from kstrata.ir.triton_ir import parse_triton

        parsed = parse_triton(text, origin)
        hit = _PARSED[key] = (parsed.module, dict(parsed.value_names))
        while len(_PARSED) > _PARSED_KEPT:
            _PARSED.popitem(last=False)
    else:
        _PARSED.move_to_end(key)
    return hit


def run_kernel(module: str | ModuleOp, grid: tuple[int, int, int] | Sequence[int], args: Sequence[ArgValue],
               *, origin: str | None = None) -> None:
    """Run the kernel of `module` (TTIR or TTGIR text, or a parsed module) over `grid` with `args`.

    `args` are the runtime arguments of the entry `tt.func` in order: a `Buffer` (or a plain ndarray,
    meaning `Buffer(arr.reshape(-1), 0)`) for each pointer, a Python or numpy scalar otherwise. Stores
    and atomics mutate the buffers in place. Raises `InterpError` for an unsupported op, an access
    outside every buffer or misaligned, or a failed device assertion.
    """
    names: dict[Any, str] = {}
    if isinstance(module, str):
        mod, names = _parsed(module, origin)
    else:
        mod = module
    g = tuple(int(v) for v in grid) + (1,) * (3 - len(tuple(grid)))
    if len(g) != 3 or min(g) < 0:
        raise InterpError(f"grid must be up to three non-negative sizes, got {tuple(grid)}")
    grid3 = (g[0], g[1], g[2])
    func = _entry(mod)
    block = func.regions[0].blocks.first
    assert block is not None
    if len(args) != len(block.args):
        raise InterpError(f"the kernel takes {len(block.args)} runtime arguments, got {len(args)}", path=origin)

    probe = _Interpreter(mod)
    probe.register_implementations(ArithFunctions(Machine(GlobalMemory(), grid3, 0, 0)))
    probe.register_implementations(TritonFunctions(Machine(GlobalMemory(), grid3, 0, 0)))
    _check_supported(func, probe)

    memory = GlobalMemory()
    values: list[np.ndarray[Any, Any]] = []
    for i, (arg, value) in enumerate(zip(block.args, args, strict=True)):
        if isinstance(arg.type, PointerType):
            buf = value if isinstance(value, Buffer) else Buffer(np.asarray(value).reshape(-1), 0) \
                if isinstance(value, np.ndarray) else None
            if buf is None:
                raise InterpError(f"argument {i} ({names.get(arg, f'arg{i}')}): expected a Buffer or an ndarray "
                                  f"for {arg.type}, got {type(value).__name__}", path=origin)
            region = memory.add(names.get(arg, f"arg{i}"), buf.storage)
            values.append(np.array([region.base + buf.offset * buf.storage.dtype.itemsize], dtype=np.int64))
        else:
            values.append(_scalar(value, arg.type, i))

    total = grid3[0] * grid3[1] * grid3[2]
    chunk = max(1, CHUNK_ELEMENTS // _max_elements(func))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        # Inactive programs compute on garbage (division by zero, overflow) whose results are discarded.
        warnings.simplefilter("ignore", RuntimeWarning)
        for first in range(0, total, chunk):
            machine = Machine(memory, grid3, first, min(chunk, total - first), origin)
            interp = _Interpreter(mod)
            interp.register_implementations(ArithFunctions(machine))
            interp.register_implementations(TritonFunctions(machine))
            interp.run_ssacfg_region(func.regions[0], tuple(values), "kernel")


def run_bundle(bundle: KernelBundle, level: str, grid: tuple[int, int, int] | Sequence[int],
               args: Mapping[str, ArgValue]) -> None:
    """Run `bundle` at `level` (`ttir` or `ttgir`), mapping `args` to the entry's parameters by name."""
    if level not in ("ttir", "ttgir"):
        raise InterpError(f"the interpreter runs TTIR or TTGIR, not {level!r}", path=bundle.origin)
    params = bundle.params
    missing = [p.name for p in params if p.name not in args]
    extra = sorted(set(args) - {p.name for p in params})
    if missing or extra:
        raise InterpError(f"kernel {bundle.name}: arguments do not match the parameters "
                          f"(missing {missing}, unknown {extra})", path=bundle.origin)
    run_kernel(bundle.text(level), grid, [args[p.name] for p in params], origin=bundle.origin)


__all__ = ["CHUNK_ELEMENTS", "Buffer", "InterpError", "run_bundle", "run_kernel"]
