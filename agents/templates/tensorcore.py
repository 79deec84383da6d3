"""What the templates that compute the library op themselves on the tensor cores share (`gemm`,
`attention`): which operand dtypes a precision policy admits, the operands they read, the precondition that
only pointwise ops follow, and the limits their schedules are checked against.

fp16/bf16 operands go to the tensor cores as they are (fp32 accumulation); fp32 operands would be rounded
to TF32 there, which only the `tf32` policy admits. Triton 3.6's interpreter multiplies bf16 operands of
`tl.dot` as raw 16-bit integers, so on a CPU tensor (where Triton only runs interpreted) the kernels
convert bf16 tiles to fp32 before their products (`UPCAST`, a constexpr that is False on the GPU, so the
compiled kernel is unchanged).
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


def admits(dtype: str, policy: str, template: str, product: str) -> str | None:
    """None when `policy` admits `dtype` operands on the tensor cores, else why not."""
    if dtype in ("float16", "bfloat16"):
        return None
    if dtype == "float32":
        return None if policy == "tf32" else \
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


def dot_precision(dtype: str) -> str:
    """The `tl.dot` argument for the operands' dtype: TF32 inputs for fp32 (admitted under tf32 only)."""
    return ', input_precision="tf32"' if dtype == "float32" else ""


def upcast(var: str, dtype: str) -> str:
    """The launch argument `UPCAST` (see the module docstring), true for bf16 operands on a CPU tensor."""
    return f"UPCAST={var}.device.type == 'cpu'" if dtype == "bfloat16" else "UPCAST=False"
