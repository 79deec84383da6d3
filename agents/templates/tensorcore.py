"""What the templates that compute the library op themselves on the tensor cores share (`gemm`,
`gemm_reduce`, `attention`): which operand dtypes a precision policy admits, the operands they read, the precondition that
only pointwise ops follow, and the limits their schedules are checked against.

fp16/bf16 operands go to the tensor cores as they are (fp32 accumulation). fp32 operands:
- under `tf32` rounded to TF32 (`input_precision="tf32"`, labelled lower precision);
- under `strict`, for the templates that take it (`gemm`, `gemm_reduce`, `gemm_norm`; `split=True` below), split
  (`SPLIT_FP32`: Triton's `bf16x6`): each operand is the sum of three bf16 parts (hi, mid, lo: 8 significant
  bits each, 24 together, fp32's mantissa) and the product is the six tensor-core products of parts whose
  orders sum to at most 2, accumulated in fp32. What it leaves out (mid x lo, lo x mid, lo x lo) is below
  2^-24 of a product, an ULP of fp32, so its error is that of an IEEE fp32 product, not TF32's. Measured on
  the H200 (2026-12-04, `split-dot-probe-2026-12-04-a`, 32768 x 4096 x 1024, randn operands), relative L2
  error against float64: cuBLAS fp32 5.7e-7, Triton `bf16x6` 1.2e-7 (`tf32x3` 1.7e-7, `bf16x3` 4.4e-6 and
  `tf32` 7.7e-4, both over strict's 2.5e-6); time: cuBLAS fp32 5430 us (50.6 TFLOP/s), `bf16x6` 4230 us (65.0),
  `tf32x3` 7727 us. Every kernel that uses it is still judged by `kstrata eval`'s strict bound against float64.
  Its one divergence from IEEE fp32: an infinite operand gives NaN (inf - inf when the parts are taken) where
  IEEE gives an infinity; finite operands whose products overflow give infinities as IEEE does (and a bf16 hi
  part of |x| above 3.39e38, bf16's largest finite, is an infinity too). The parts can also be written once
  before the kernel (`gemm.SPLIT_AT` "host"); then a step's six products are summed in a tile of their own
  and added to the accumulator, because chained into it they drifted (`split-dot-probe-2026-12-04-b`:
  6.8e-6 chained, 1.2e-7 a step apart).
Triton 3.6's interpreter multiplies bf16 operands of `tl.dot` as raw 16-bit integers and has no `bf16x6`,
so on a CPU tensor (where Triton only runs interpreted) the kernels convert bf16 tiles to fp32 and take a
plain product (`UPCAST`, a constexpr that is False on the GPU, so the compiled kernel is unchanged): the CPU
tests check the indexing and epilogues, the GPU twins the split product.
"""

from __future__ import annotations

from kstrata.agents.templates.graph import Chain, GraphError, Node, is_operand

#: Shared memory a schedule's pipelined tiles may take (the H200 gives a block 227 KiB; the rest is left to
#: the epilogue's layout conversion).
SMEM_BYTES = 200 * 1024
#: fp32 accumulators per thread a schedule may keep: beyond it they spill.
ACC_PER_THREAD = 128
#: Grid axis 1 (the batch) is limited to 65535 programs.
MAX_BATCH = 65535


def operand(node: object, what: str) -> Node:
    """A library op's tensor operand: an input or a parameter, or one transposed (GraphError otherwise)."""
    if not isinstance(node, Node) or not is_operand(node):
        raise GraphError(f"the {what} is not an input or a parameter")
    return node


def ref(node: Node) -> str:
    """The forward-side expression of an operand node (a transposed one is a strided view, not a copy)."""
    if node.op == "transpose":
        return f"{ref(node.args[0])}.transpose(-1, -2)"
    return node.name if node.op == "input" else f"self.{node.target}"


#: The `input_precision` of fp32 products under `strict` (the module docstring).
SPLIT_FP32 = "bf16x6"


def admits(dtype: str, policy: str, template: str, product: str, split: bool = False) -> str | None:
    """None when `policy` admits `dtype` operands on the tensor cores, else why not (`split`: the template
    computes fp32 products as `SPLIT_FP32` under policies other than tf32)."""
    if dtype in ("float16", "bfloat16"):
        return None
    if dtype == "float32":
        return None if policy == "tf32" or split else \
            (f"fp32 operands: a Triton {product} rounds them to TF32 on the tensor cores, admitted only under "
             f"--precision tf32 (under strict PyTorch's IEEE fp32 {product} stays)")
    return f"{dtype} operands: the {template} template takes float16/bfloat16 (float32 under tf32)"


def epilogue_only(chain: Chain, what: str) -> str | None:
    """None when only pointwise ops of the library op's shape follow it, else why not."""
    if chain.core is not None:
        return f"the graph has a {chain.core.op} after the {what}; the template fuses pointwise ops only"
    if chain.out_shape != chain.root.shape:
        return f"the epilogue broadcasts the {what}'s output {chain.root.shape} to {chain.out_shape}"
    return None


def dtype_bytes(dtype: str) -> int:
    return 2 if dtype in ("float16", "bfloat16") else 4


def dot_precision(dtype: str, policy: str = "tf32") -> str:
    """The `tl.dot` argument for the operands' dtype: for fp32 TF32 inputs under tf32, else `SPLIT_FP32`."""
    if dtype != "float32":
        return ""
    return ', input_precision="tf32"' if policy == "tf32" else f', input_precision="{SPLIT_FP32}"'


def split_fp32(dtype: str, policy: str) -> bool:
    """Whether fp32 products are split (`SPLIT_FP32`) under `policy`."""
    return dtype == "float32" and policy != "tf32"


def upcast(var: str, dtype: str, policy: str = "tf32") -> str:
    """The launch argument `UPCAST` (see the module docstring): true on a CPU tensor for bf16 operands, and
    for fp32 ones whose products are split."""
    if dtype == "bfloat16" or split_fp32(dtype, policy):
        return f"UPCAST={var}.device.type == 'cpu'"
    return "UPCAST=False"
