"""The task's graph as templates see it: a `torch.fx` trace of `Model`, each node given a canonical name.

`trace(task)` builds the model and its inputs on the `meta` device (no memory, any size), traces it with
`torch.fx.symbolic_trace`, propagates shapes and dtypes through the graph, and canonicalizes every node:
modules, functions and methods that compute the same thing get one spelling (`nn.ReLU()`, `F.relu`,
`torch.relu` and `x.relu()` are all `relu`), with their options as attributes and their tensor operands as
`Leaf`s or other nodes; a key or value widened to the query's heads before an attention (`repeat_interleave`
along dim -3, or `expand` + `reshape`) is one `repeat_heads` node over its source. `chain(graph)` then reads the
graph as templates do:

    output = epilogue(core(prologue(root, leaves...)), leaves...)     root = head(input) or an input

where *head* is at most one library op (convolution, linear, matmul, attention) left to PyTorch, *core* is at most one
op a template implements (a norm, a softmax, a pooling), and *prologue*/*epilogue* are pointwise
expressions (`Expr`) over the root, the model's parameters and buffers, other inputs and constants, with
broadcasting. A graph that is not of that shape gets a reason, never a guess.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from kstrata.agents.tasks import Task

# ---------------------------------------------------------------------------------------------------
# Canonical ops
# ---------------------------------------------------------------------------------------------------
#: Pointwise functions of one tensor (with their attributes), which the code generator implements.
UNARY = ("relu", "sigmoid", "tanh", "gelu", "silu", "exp", "abs", "neg", "hardswish", "hardsigmoid", "leaky_relu",
         "softplus", "clamp", "elu", "mish", "sqrt", "rsqrt", "log", "square", "relu6")
#: Pointwise functions of two operands (tensors or scalars), with broadcasting.
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
#: Library ops a template leaves to PyTorch (cuDNN, cuBLAS) and fuses what follows into.
HEADS = ("conv", "conv_transpose", "linear", "matmul", "attention")
#: Ops a template implements.
POOLS = ("max_pool1d", "avg_pool1d", "max_pool2d", "avg_pool2d", "max_pool3d", "avg_pool3d")
CORES = ("layer_norm", "group_norm", "softmax", "log_softmax", *POOLS, "sum", "mean", "amax", "logsumexp")


class GraphError(Exception):
    """The task's graph is not something the templates read: why, in one line."""


@dataclass(frozen=True)
class Leaf:
    """An operand that is not computed in the graph: an input, a parameter/buffer of the model, a constant."""

    kind: str  # "input" | "param" | "const"
    name: str  # input: its placeholder name; param: the attribute path (`conv.bias`); const: repr of the value
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    value: float | None = None  # for constants
    index: int = -1  # for inputs: the position in forward's arguments


@dataclass(frozen=True)
class Expr:
    """A pointwise expression: `op` of `args` (Expr, Leaf or the distinguished root `Leaf('root')`)."""

    op: str
    args: tuple[Expr | Leaf, ...]
    attrs: tuple[tuple[str, Any], ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)


ROOT = Leaf("root", "root")


@dataclass
class Node:
    """One canonical op of the graph."""

    name: str
    op: str  # a canonical name (UNARY, BINARY, HEADS, CORES) or "input" / "param" / "const" / "output"
    args: list[Any]  # Node, float/int constants, None
    attrs: dict[str, Any] = field(default_factory=dict)
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    target: str = ""  # module path for module calls / param path for get_attr
    index: int = -1


@dataclass
class Graph:
    """The canonical nodes of a traced `Model` in topological order, with the output node's argument."""

    nodes: list[Node]
    output: Node
    inputs: list[Node]
    model: nn.Module


def _dtype_name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def _module_op(mod: nn.Module, target: str) -> tuple[str, dict[str, Any], list[str]]:
    """(canonical op, attributes, parameter paths appended to the operands) of a module call."""
    def params(*names: str) -> list[str]:
        return [f"{target}.{n}" if getattr(mod, n, None) is not None else "" for n in names]

    if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        if mod.padding_mode != "zeros":
            raise GraphError(f"{target}: convolution padding_mode={mod.padding_mode!r}")
        return "conv", {"module": target}, []
    if isinstance(mod, (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
        return "conv_transpose", {"module": target}, []
    if isinstance(mod, nn.Linear):
        return "linear", {"module": target}, []
    if isinstance(mod, nn.LayerNorm):
        return "layer_norm", {"normalized_shape": tuple(mod.normalized_shape), "eps": float(mod.eps)}, params("weight", "bias")
    if isinstance(mod, nn.GroupNorm):
        return "group_norm", {"num_groups": int(mod.num_groups), "eps": float(mod.eps)}, params("weight", "bias")
    if isinstance(mod, nn.Softmax):
        return "softmax", {"dim": mod.dim}, []
    if isinstance(mod, nn.LogSoftmax):
        return "log_softmax", {"dim": mod.dim}, []
    for rank, mcls in ((1, nn.MaxPool1d), (2, nn.MaxPool2d), (3, nn.MaxPool3d)):
        if isinstance(mod, mcls):
            if mod.ceil_mode or mod.return_indices:
                raise GraphError(f"{target}: {mcls.__name__} with ceil_mode or return_indices")
            return f"max_pool{rank}d", _pool_attrs(mod.kernel_size, mod.stride, mod.padding, mod.dilation, rank), []
    for rank, acls in ((1, nn.AvgPool1d), (2, nn.AvgPool2d), (3, nn.AvgPool3d)):
        if isinstance(mod, acls):
            if mod.ceil_mode or getattr(mod, "divisor_override", None) is not None:
                raise GraphError(f"{target}: {acls.__name__} with ceil_mode or divisor_override")
            attrs = _pool_attrs(mod.kernel_size, mod.stride, mod.padding, 1, rank)
            attrs["count_include_pad"] = bool(mod.count_include_pad)
            return f"avg_pool{rank}d", attrs, []
    simple = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.SiLU: "silu", nn.Hardswish: "hardswish",
              nn.Hardsigmoid: "hardsigmoid", nn.Mish: "mish", nn.ReLU6: "relu6"}
    for cls, name in simple.items():
        if type(mod) is cls:
            return name, {}, []
    if isinstance(mod, nn.GELU):
        return "gelu", {"approximate": mod.approximate}, []
    if isinstance(mod, nn.LeakyReLU):
        return "leaky_relu", {"negative_slope": float(mod.negative_slope)}, []
    if isinstance(mod, nn.Softplus):
        return "softplus", {"beta": float(mod.beta), "threshold": float(mod.threshold)}, []
    if isinstance(mod, nn.ELU):
        return "elu", {"alpha": float(mod.alpha)}, []
    if isinstance(mod, nn.Hardtanh):
        return "clamp", {"min": float(mod.min_val), "max": float(mod.max_val)}, []
    if isinstance(mod, (nn.Identity, nn.Dropout)) and (isinstance(mod, nn.Identity) or not mod.training):
        return "identity", {}, []
    raise GraphError(f"{target}: module {type(mod).__name__} has no template")


def _ntuple(v: Any, rank: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (int(v),) * rank
    if len(v) == 1 and rank > 1:
        return (int(v[0]),) * rank
    if len(v) != rank:
        raise GraphError(f"a {rank}-D pooling with a {len(v)}-element size {tuple(v)}")
    return tuple(int(x) for x in v)


def _pool_attrs(k: Any, s: Any, p: Any, d: Any, rank: int = 2) -> dict[str, Any]:
    kernel = _ntuple(k, rank)
    return {"kernel": kernel, "stride": _ntuple(s, rank) if s not in (None, [], ()) else kernel,
            "padding": _ntuple(p, rank), "dilation": _ntuple(d, rank)}


_FUNCTIONS: dict[Any, str] = {
    torch.relu: "relu", F.relu: "relu", torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid", torch.tanh: "tanh",
    F.tanh: "tanh", F.gelu: "gelu", F.silu: "silu", torch.exp: "exp", torch.abs: "abs", torch.neg: "neg",
    operator.neg: "neg", F.hardswish: "hardswish", F.hardsigmoid: "hardsigmoid", F.leaky_relu: "leaky_relu",
    F.softplus: "softplus", torch.clamp: "clamp", torch.clip: "clamp", F.hardtanh: "clamp", F.elu: "elu",
    F.mish: "mish", torch.sqrt: "sqrt", torch.rsqrt: "rsqrt", torch.log: "log", torch.square: "square",
    F.relu6: "relu6",
    operator.add: "add", torch.add: "add", operator.sub: "sub", torch.sub: "sub", operator.mul: "mul",
    torch.mul: "mul", operator.truediv: "div", torch.div: "div", torch.maximum: "maximum", torch.minimum: "minimum",
    torch.matmul: "matmul", operator.matmul: "matmul", torch.mm: "matmul", torch.bmm: "matmul", F.linear: "linear",
    F.conv2d: "conv", F.conv1d: "conv", F.conv3d: "conv", F.scaled_dot_product_attention: "attention",
    torch.softmax: "softmax", F.softmax: "softmax", torch.log_softmax: "log_softmax", F.log_softmax: "log_softmax",
    F.layer_norm: "layer_norm", F.group_norm: "group_norm", F.max_pool2d: "max_pool2d", F.avg_pool2d: "avg_pool2d",
    F.max_pool1d: "max_pool1d", F.avg_pool1d: "avg_pool1d", F.max_pool3d: "max_pool3d", F.avg_pool3d: "avg_pool3d",
    torch.sum: "sum", torch.mean: "mean", torch.amax: "amax", torch.logsumexp: "logsumexp",
}
_HEAD_FUNCTIONS: dict[Any, str] = {
    torch.matmul: "torch.matmul", operator.matmul: "torch.matmul", torch.mm: "torch.mm", torch.bmm: "torch.bmm",
    F.linear: "F.linear", F.conv1d: "F.conv1d", F.conv2d: "F.conv2d", F.conv3d: "F.conv3d",
    F.scaled_dot_product_attention: "F.scaled_dot_product_attention",
}
#: scaled_dot_product_attention's arguments after (query, key, value), in order, with their defaults.
SDPA_OPTIONS = (("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False), ("scale", None), ("enable_gqa", False))


def sdpa_options(node: Node) -> dict[str, Any]:
    """The options of an attention node, positional or keyword, with PyTorch's defaults."""
    opts = dict(SDPA_OPTIONS)
    opts.update(zip([k for k, _ in SDPA_OPTIONS], node.args[3:], strict=False))
    opts.update(node.attrs["kwargs"])
    return opts


def _constant(v: Any, where: str) -> Any:
    """A non-tensor argument of a library op (ints, floats, tuples of them, None, strings), kept for rendering."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (tuple, list)) and all(isinstance(x, (int, float)) for x in v):
        return tuple(v)
    raise GraphError(f"{where}: argument {v!r} of a library op")


_METHODS = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "abs": "abs", "neg": "neg",
            "clamp": "clamp", "clip": "clamp", "sqrt": "sqrt", "rsqrt": "rsqrt", "log": "log", "square": "square",
            "add": "add", "sub": "sub", "mul": "mul", "div": "div", "softmax": "softmax", "log_softmax": "log_softmax",
            "matmul": "matmul", "contiguous": "identity", "sum": "sum", "mean": "mean", "amax": "amax",
            "logsumexp": "logsumexp"}


def _kw(node: Any, pos: int, name: str, default: Any) -> Any:
    if len(node.args) > pos:
        return node.args[pos]
    return node.kwargs.get(name, default)


class _CallView:
    """An fx node's target, args and kwargs with one keyword removed (fx nodes are not copied for this)."""

    def __init__(self, node: fx.Node, drop: str) -> None:
        self.name, self.target, self.args = node.name, node.target, node.args
        self.kwargs = {k: v for k, v in node.kwargs.items() if k != drop}


def _without_kwarg(node: Any, key: str) -> Any:
    return _CallView(node, key)


def _function_attrs(op: str, node: Any) -> tuple[dict[str, Any], list[Any]]:
    """Attributes and tensor operands of a function or method call (method calls: args[0] is self)."""
    a = list(node.args)
    if node.kwargs.get("inplace"):
        raise GraphError(f"{node.name}: {op} in place")
    if "inplace" in node.kwargs:  # inplace=False changes nothing
        node = _without_kwarg(node, "inplace")
    if op in ("softmax", "log_softmax"):
        dim = _kw(node, 1, "dim", None)
        if node.kwargs.get("dtype") is not None or (len(a) > 2 and a[2] is not None):
            raise GraphError(f"{node.name}: {op} with a dtype")
        return {"dim": dim}, [a[0]]
    if op in ("sum", "mean", "amax", "logsumexp"):
        if node.kwargs.get("dtype") is not None:
            raise GraphError(f"{node.name}: {op} with a dtype")
        dim = _kw(node, 1, "dim", None)
        dims = None if dim is None else ((int(dim),) if isinstance(dim, int) else tuple(int(d) for d in dim))
        if dims == ():
            dims = None
        return {"dims": dims, "keepdim": bool(_kw(node, 2, "keepdim", False))}, [a[0]]
    if op == "gelu":
        return {"approximate": node.kwargs.get("approximate", "none")}, [a[0]]
    if op == "leaky_relu":
        return {"negative_slope": float(_kw(node, 1, "negative_slope", 0.01))}, [a[0]]
    if op == "softplus":
        return {"beta": float(_kw(node, 1, "beta", 1.0)), "threshold": float(_kw(node, 2, "threshold", 20.0))}, [a[0]]
    if op == "elu":
        return {"alpha": float(_kw(node, 1, "alpha", 1.0))}, [a[0]]
    if op == "clamp":
        lo, hi = (_kw(node, 1, "min_val", -1.0), _kw(node, 2, "max_val", 1.0)) if node.target is F.hardtanh \
            else (_kw(node, 1, "min", None), _kw(node, 2, "max", None))
        if isinstance(lo, fx.Node) or isinstance(hi, fx.Node):
            raise GraphError(f"{node.name}: clamp with tensor bounds")
        return {"min": None if lo is None else float(lo), "max": None if hi is None else float(hi)}, [a[0]]
    if op in ("add", "sub"):
        alpha = node.kwargs.get("alpha", 1)
        if alpha != 1:
            raise GraphError(f"{node.name}: {op} with alpha={alpha}")
        return {}, a[:2]
    if op == "div":
        if node.kwargs.get("rounding_mode") is not None:
            raise GraphError(f"{node.name}: div with rounding_mode")
        return {}, a[:2]
    if op == "layer_norm":
        return ({"normalized_shape": tuple(_kw(node, 1, "normalized_shape", ())), "eps": float(_kw(node, 4, "eps", 1e-5))},
                [a[0], _kw(node, 2, "weight", None), _kw(node, 3, "bias", None)])
    if op == "group_norm":
        return ({"num_groups": int(_kw(node, 1, "num_groups", 1)), "eps": float(_kw(node, 4, "eps", 1e-5))},
                [a[0], _kw(node, 2, "weight", None), _kw(node, 3, "bias", None)])
    if op.startswith("max_pool"):
        if _kw(node, 5, "ceil_mode", False) or _kw(node, 6, "return_indices", False):
            raise GraphError(f"{node.name}: {op} with ceil_mode or return_indices")
        return _pool_attrs(_kw(node, 1, "kernel_size", 1), _kw(node, 2, "stride", None), _kw(node, 3, "padding", 0),
                           _kw(node, 4, "dilation", 1), int(op[-2])), [a[0]]
    if op.startswith("avg_pool"):
        if _kw(node, 4, "ceil_mode", False) or _kw(node, 6, "divisor_override", None) is not None:
            raise GraphError(f"{node.name}: {op} with ceil_mode or divisor_override")
        attrs = _pool_attrs(_kw(node, 1, "kernel_size", 1), _kw(node, 2, "stride", None), _kw(node, 3, "padding", 0), 1,
                            int(op[-2]))
        attrs["count_include_pad"] = bool(_kw(node, 5, "count_include_pad", True))
        return attrs, [a[0]]
    if len(a) != 1 or node.kwargs:
        if op in BINARY and len(a) == 2 and not node.kwargs:
            return {}, a
        raise GraphError(f"{node.name}: {op} with arguments {a[1:]} {dict(node.kwargs)}")
    return {}, a


#: Names the generated `forward` binds or uses (head output, output and partial buffers, operand views, the
#: modules): an input of one of these names is renamed (`out` -> `out_in`), or the forward would overwrite
#: it before a kernel reads it.
FORWARD_LOCALS = frozenset({"h", "out", "part", "cnt", "teams", "row0", "rows", "a", "b", "q", "k", "v", "am", "w", "x_in", "stats", "self",
                            "torch", "triton", "tl", "math", "nn", "F"})


def _input_name(name: str, taken: set[str]) -> str:
    while name in FORWARD_LOCALS or name in taken:
        name += "_in"
    return name


def _swaps_last_two(n: fx.Node) -> bool:
    """Whether an fx node is a view swapping its operand's last two dims (`x.T` of a matrix, `x.mT`, `x.t()`,
    `x.transpose(-2, -1)`, `torch.transpose(x, ...)`): library ops read such an operand through its strides."""
    if not n.args or not isinstance(n.args[0], fx.Node):
        return False
    src = n.args[0].meta.get("tensor_meta")
    rank = len(src.shape) if src is not None and hasattr(src, "shape") else -1
    if n.op == "call_function" and n.target is getattr and len(n.args) == 2:
        return (n.args[1] == "T" and rank == 2) or n.args[1] == "mT"
    if n.op == "call_method" and n.target == "t" and len(n.args) == 1:
        return rank == 2
    is_transpose = (n.op == "call_method" and n.target == "transpose") or (n.op == "call_function" and n.target is torch.transpose)
    dims = [d for d in n.args[1:] if isinstance(d, int)]
    if is_transpose and len(n.args) == 3 and len(dims) == 2 and not n.kwargs and rank >= 2:
        return {d % rank for d in dims} == {rank - 2, rank - 1}
    return False


def is_operand(node: Node) -> bool:
    """An input or parameter, or one with its last two dims swapped (a view a library op reads in place)."""
    return node.op in ("input", "param") or (node.op == "transpose" and node.args[0].op in ("input", "param"))


def _is_view(n: fx.Node, method: str, fn: Any = None) -> bool:
    return (n.op == "call_method" and n.target == method) or (fn is not None and n.op == "call_function" and n.target is fn)


def _shape(n: Any) -> tuple[int, ...] | None:
    tm = n.meta.get("tensor_meta") if isinstance(n, fx.Node) else None
    return tuple(int(s) for s in tm.shape) if tm is not None and hasattr(tm, "shape") else None


def _repeated_heads(n: fx.Node) -> tuple[fx.Node, int, list[fx.Node]] | None:
    """(source, groups, the intermediate nodes) when `n` repeats each head of its source `groups` times along
    dim -3, as grouped-query attention's keys and values are widened: `x.repeat_interleave(g, dim=-3)`, or
    `x[:, :, None].expand(b, h, g, s, d).reshape(b, h * g, s, d)` (also with `unsqueeze`, `flatten`).
    A reshape's result depends only on its input and output shapes, so the shapes (propagated) decide."""
    if _is_view(n, "repeat_interleave", torch.repeat_interleave):
        src = n.args[0] if n.args else None
        reps = n.args[1] if len(n.args) > 1 else n.kwargs.get("repeats")
        dim = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim")
        s = _shape(src)
        if not isinstance(src, fx.Node) or s is None or type(reps) is not int or type(dim) is not int or len(s) < 3:
            return None
        return (src, reps, []) if dim % len(s) == len(s) - 3 and reps >= 1 else None
    if not (_is_view(n, "reshape", torch.reshape) or _is_view(n, "flatten", torch.flatten)):
        return None
    e = n.args[0] if n.args else None
    if not isinstance(e, fx.Node) or not _is_view(e, "expand") or len(e.users) != 1:
        return None
    u = e.args[0]
    if not isinstance(u, fx.Node) or len(u.users) != 1:
        return None
    src = u.args[0] if u.args else None
    s, su, se, sn = _shape(src), _shape(u), _shape(e), _shape(n)
    if not isinstance(src, fx.Node) or s is None or su is None or se is None or sn is None or len(s) < 3:
        return None
    r = len(s)
    if _is_view(u, "unsqueeze", torch.unsqueeze):
        dim = u.args[1] if len(u.args) > 1 else u.kwargs.get("dim")
        if type(dim) is not int or dim % (r + 1) != r - 2:
            return None
    elif u.op == "call_function" and u.target is operator.getitem:
        index = u.args[1]
        if not isinstance(index, tuple) or sum(i is None for i in index) != 1 or \
                not all(i is None or i is Ellipsis or i == slice(None) for i in index):
            return None
    else:
        return None
    g = se[r - 2]
    if su != (*s[:r - 2], 1, *s[r - 2:]) or se != (*s[:r - 2], g, *s[r - 2:]) or \
            sn != (*s[:r - 3], s[r - 3] * g, *s[r - 2:]):
        return None
    return src, g, [u, e]


def trace(task: Task) -> Graph:
    """Trace the task's `Model` on the meta device and canonicalize its nodes (GraphError: why not)."""
    model, inputs = task.instantiate("meta")
    model.eval()
    try:
        gm = fx.symbolic_trace(model)
    except Exception as e:  # fx raises many kinds (TraceError, TypeError on control flow, …)
        raise GraphError(f"torch.fx cannot trace Model: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    from torch.fx.passes.shape_prop import ShapeProp
    try:
        ShapeProp(gm).propagate(*inputs)
    except Exception as e:
        cause = e  # ShapeProp wraps the op's own error in a multi-line one that names the fx node
        while cause.__cause__ is not None:
            cause = cause.__cause__  # type: ignore[assignment]
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        raise GraphError(f"shape propagation on meta tensors failed: {type(cause).__name__}: {first}") from None
    modules = dict(gm.named_modules())
    nodes: dict[fx.Node, Node] = {}
    order: list[Node] = []
    graph_inputs: list[Node] = []
    out: Node | None = None
    repeats = {n: r for n in gm.graph.nodes if (r := _repeated_heads(n)) is not None}
    widening = {x for _, _, inner in repeats.values() for x in inner}  # folded into their repeat node

    def meta(n: fx.Node) -> tuple[tuple[int, ...], str]:
        tm = n.meta.get("tensor_meta")
        if tm is None or not hasattr(tm, "shape"):
            return (), ""
        return tuple(int(s) for s in tm.shape), _dtype_name(tm.dtype)

    def operand(v: Any, where: str) -> Any:
        if isinstance(v, fx.Node):
            return nodes[v]
        if v is None or isinstance(v, (bool, int, float)):
            return v
        raise GraphError(f"{where}: operand {v!r} of type {type(v).__name__}")

    for n in gm.graph.nodes:
        shape, dtype = meta(n)
        if n in widening:
            continue
        if n in repeats:
            src, groups, _ = repeats[n]
            node = Node(n.name, "repeat_heads", [nodes[src]], {"groups": groups}, shape=shape, dtype=dtype)
        elif n.op == "placeholder":
            if not shape and not dtype:
                raise GraphError(f"input {n.name} is not a tensor")
            node = Node(_input_name(n.name, {g.name for g in graph_inputs}), "input", [], shape=shape, dtype=dtype,
                        index=len(graph_inputs))
            graph_inputs.append(node)
        elif n.op == "get_attr":
            node = Node(n.name, "param", [], shape=shape, dtype=dtype, target=str(n.target))
        elif n.op == "call_module":
            mod = modules[str(n.target)]
            op, attrs, param_paths = _module_op(mod, str(n.target))
            args = [operand(a, n.name) for a in n.args]
            if n.kwargs:
                raise GraphError(f"{n.name}: module call with keyword arguments")
            for p in param_paths:
                if p:
                    t = gm.get_parameter(p) if p in dict(gm.named_parameters()) else gm.get_buffer(p)
                    args.append(Node(p, "param", [], shape=tuple(t.shape), dtype=_dtype_name(t.dtype), target=p))
                else:
                    args.append(None)
            node = Node(n.name, op, args, attrs, shape, dtype, target=str(n.target))
        elif n.op in ("call_function", "call_method") and _swaps_last_two(n):
            node = Node(n.name, "transpose", [operand(n.args[0], n.name)], shape=shape, dtype=dtype)
        elif n.op in ("call_function", "call_method"):
            if n.op == "call_method":
                op_name = _METHODS.get(str(n.target))
            else:
                op_name = _FUNCTIONS.get(n.target)
            if op_name is None:
                what = f".{n.target}()" if n.op == "call_method" else getattr(n.target, "__name__", str(n.target))
                raise GraphError(f"{n.name}: {what} has no template")
            if op_name in HEADS:
                fn = _HEAD_FUNCTIONS.get(n.target, "torch.matmul")
                kwargs = {k: nodes[v] if isinstance(v, fx.Node) else _constant(v, n.name) for k, v in n.kwargs.items()}
                args = [nodes[a] if isinstance(a, fx.Node) else _constant(a, n.name) for a in n.args]
                node = Node(n.name, op_name, args, {"fn": fn, "kwargs": kwargs}, shape, dtype)
                if op_name == "attention" and sdpa_options(node)["dropout_p"]:
                    raise GraphError(f"{n.name}: attention with dropout (random in eval mode too)")
            else:
                attrs, raw = _function_attrs(op_name, n)
                node = Node(n.name, op_name, [operand(a, n.name) for a in raw], attrs, shape, dtype)
        elif n.op == "output":
            res = n.args[0]
            if not isinstance(res, fx.Node):
                raise GraphError("Model returns more than one tensor (or no tensor)")
            out = nodes[res]
            continue
        else:
            raise GraphError(f"{n.name}: fx node kind {n.op}")
        nodes[n] = node
        order.append(node)
    assert out is not None
    return Graph(order, out, graph_inputs, model)


# ---------------------------------------------------------------------------------------------------
# The chain: head -> prologue -> core -> epilogue
# ---------------------------------------------------------------------------------------------------
@dataclass
class Chain:
    """The graph read as `epilogue(core(prologue(root)))` with `root = head(...)` or an input."""

    graph: Graph
    head: Node | None
    root: Node  # the head's node or an input node
    prologue: Expr | Leaf  # over ROOT (identity: ROOT itself)
    core: Node | None
    core_shape: tuple[int, ...]  # the core's input shape (prologue's output), or the output shape
    epilogue: Expr | Leaf  # over ROOT = the core's output (identity: ROOT)
    out_shape: tuple[int, ...]
    out_dtype: str

    @property
    def leaves(self) -> list[Leaf]:
        seen: dict[Leaf, None] = {}
        for e in (self.prologue, self.epilogue):
            _collect(e, seen)
        return [leaf for leaf in seen if leaf.kind != "root"]


def _collect(e: Expr | Leaf, seen: dict[Leaf, None]) -> None:
    if isinstance(e, Leaf):
        if e.kind in ("input", "param"):
            seen[e] = None
        return
    for a in e.args:
        _collect(a, seen)


def _leaf_of(node: Node) -> Leaf:
    if node.op == "input":
        return Leaf("input", node.name, node.shape, node.dtype, index=node.index)
    return Leaf("param", node.target, node.shape, node.dtype)


def _expr(node: Any, root: Node | None, stop: set[int]) -> Expr | Leaf:
    """The pointwise expression computing `node` from `root` (ROOT), parameters, inputs and constants."""
    if node is None:
        raise GraphError("a missing operand")
    if isinstance(node, (bool, int, float)):
        return Leaf("const", repr(float(node)), value=float(node))
    if root is not None and node is root:
        return ROOT
    if node.op in ("input", "param"):
        return _leaf_of(node)
    if id(node) in stop:
        raise GraphError(f"{node.name}: used both before and after the template's core op")
    if node.op == "identity":
        return _expr(node.args[0], root, stop)
    if node.op in UNARY:
        return Expr(node.op, (_expr(node.args[0], root, stop),), tuple(sorted(node.attrs.items())))
    if node.op in BINARY:
        return Expr(node.op, tuple(_expr(a, root, stop) for a in node.args[:2]))
    raise GraphError(f"{node.name}: {node.op} is not pointwise and is not the template's core op")


def chain(graph: Graph) -> Chain:
    """Read the graph as head -> prologue -> core -> epilogue, or raise GraphError saying why it is not."""
    heads = [n for n in graph.nodes if n.op in HEADS]
    cores = [n for n in graph.nodes if n.op in CORES]
    if len(heads) > 1:
        raise GraphError(f"{len(heads)} library ops ({', '.join(h.op for h in heads)}): a template takes one")
    if len(cores) > 1:
        raise GraphError(f"{len(cores)} reductions/poolings ({', '.join(c.op for c in cores)}): a template takes one")
    head = heads[0] if heads else None
    core = cores[0] if cores else None
    if head is not None:
        for i, a in enumerate([*head.args, *head.attrs.get("kwargs", {}).values()]):
            # attention's key and value may be widened to the query's heads (grouped-query attention)
            widened = head.op == "attention" and i in (1, 2) and isinstance(a, Node) and a.op == "repeat_heads"
            if isinstance(a, Node) and not is_operand(a.args[0] if widened else a):
                raise GraphError(f"{head.name}: the library op's operands are computed ({a.name}); a template fuses after it")
        root = head
    else:
        roots = [n for n in graph.inputs]
        if not roots:
            raise GraphError("Model has no tensor input")
        root = roots[0]
    if core is not None:
        pro = _expr(core.args[0], root, set())
        # the core's input shape is its operand's shape
        src = core.args[0]
        core_shape = src.shape if isinstance(src, Node) else ()
        # everything after the core reads the core only (plus leaves)
        epi = _expr(graph.output, core, set())
    else:
        pro = ROOT
        core_shape = graph.output.shape
        epi = _expr(graph.output, root, set())
    if epi == ROOT and pro == ROOT and core is None and head is None:
        raise GraphError("Model computes nothing pointwise (an identity)")
    return Chain(graph, head, root, pro, core, core_shape, epi, graph.output.shape, graph.output.dtype)


def describe(e: Expr | Leaf) -> str:
    """`relu(add(root, conv.bias))`: an expression in one line, for reports."""
    if isinstance(e, Leaf):
        return "x" if e.kind == "root" else (f"{e.value:g}" if e.kind == "const" else e.name)
    inner = ", ".join(describe(a) for a in e.args)
    extra = ", ".join(f"{k}={v}" for k, v in e.attrs if v is not None)
    return f"{e.op}({inner}{', ' + extra if extra else ''})"


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
