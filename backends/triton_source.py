"""Compile a Triton kernel source (`@triton.jit` function text) for an existing kernel: the rebuild from
the Triton-source level, which no Triton stage offers (Triton's stages start at TTIR).

The source replaces the kernel's Python function. Everything else comes from the base kernel, so that
the result launches exactly as the base does: the target, the compile options in its metadata
(`num_warps`, `num_stages`, `maxnreg`, …), the runtime parameters' Triton types and divisibility
(read off its TTIR, since Triton's metadata does not record the signature). Constexpr values are folded
into the base's TTIR and cannot be read back, so they are given with the source (`constexprs`) or come
from the source's defaults.

A source whose runtime parameters differ from the base's (other names, another order, one missing or
one more) is refused with the two lists: a launcher built for the base would bind the wrong arguments.
A source that does not parse, defines no `@triton.jit` function of the base's name, or that Triton
refuses is a `KstrataError` naming the line. Run this in a child process: it executes the source.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError

#: The module file the source is written to, named by the kernel, so that its line tables name it.
SOURCE_SUFFIX = ".py"


class SourceError(KstrataError):
    """A Triton source that cannot replace the base kernel's function (with the reason, and the line)."""


def _parse(source: str, path: Path) -> ast.Module:
    try:
        return ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        raise SourceError(f"the Triton source does not parse: line {exc.lineno}: {exc.msg}", path=path) from None


def _jit_function(module: ast.Module, name: str, path: Path) -> ast.FunctionDef:
    """The `@triton.jit` (or `@jit`) function `name` of the module."""
    jitted = []
    for node in module.body:
        if isinstance(node, ast.FunctionDef):
            names = [ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list]
            if any(n.split(".")[-1] == "jit" for n in names):
                jitted.append(node)
    for node in jitted:
        if node.name == name:
            return node
    found = ", ".join(n.name for n in jitted) or "none"
    raise SourceError(f"the Triton source defines no @triton.jit function named {name} (it defines: {found})",
                      path=path)


def _load_module(path: Path, name: str) -> Any:
    """Import the written source as a module; `triton` and `tl` are there without an import line."""
    import triton
    import triton.language as tl

    spec = importlib.util.spec_from_file_location(f"kstrata_source_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.triton = triton  # type: ignore[attr-defined]
    module.tl = tl  # type: ignore[attr-defined]
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the source's own code failed at import: the user's error, with its line
        tb = exc.__traceback__
        line = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == str(path):
                line = tb.tb_lineno
            tb = tb.tb_next
        where = f"line {line}: " if line is not None else ""
        raise SourceError(f"the Triton source failed when imported: {where}{type(exc).__name__}: {exc}",
                          path=path) from None
    return module


def source_signature(bundle: KernelBundle, arg_names: list[str], constexpr_names: set[str],
                     constexprs: Mapping[str, Any], defaults: Mapping[str, Any],
                     path: Path) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], list[list[Any]]]]:
    """Triton's (signature, constexprs, attrs) for a source with parameters `arg_names` replacing `bundle`'s
    function: runtime parameters typed and specialized as the base's; refuses any other set of them."""
    base = bundle.params
    given = set(constexprs)
    runtime = [n for n in arg_names if n not in constexpr_names and n not in given]
    if runtime != [p.name for p in base]:
        raise SourceError(f"the source's runtime parameters ({', '.join(runtime) or 'none'}) differ from kernel "
                          f"{bundle.name}'s ({', '.join(p.name for p in base) or 'none'}): a launcher built for it "
                          "would bind the wrong arguments", path=path)
    unknown = sorted(given - set(arg_names))
    if unknown:
        raise SourceError(f"constexpr values for parameters the source does not have: {', '.join(unknown)}", path=path)
    by_name = {p.name: p for p in base}
    signature: dict[str, str] = {}
    values: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for index, name in enumerate(arg_names):
        if name in by_name:
            param = by_name[name]
            signature[name] = param.triton_type
            if param.divisibility:
                attrs[(index,)] = [["tt.divisibility", param.divisibility]]
            continue
        signature[name] = "constexpr"
        if name in constexprs:
            values[name] = constexprs[name]
        elif name in defaults:
            values[name] = defaults[name]
        else:
            raise SourceError(f"constexpr {name} has no value: give it with the source (its value is folded into "
                              f"kernel {bundle.name}'s IR, so it cannot be read back), or a default", path=path)
    return signature, values, attrs


def compile_source(bundle: KernelBundle, source: str, constexprs: Mapping[str, Any], workdir: str | Path
                   ) -> KernelBundle:
    """`bundle` rebuilt from `source` (see the module docstring); the source is written to `workdir`."""
    from kstrata.ir.ir_roundtrip import compile_options
    from kstrata.ir.triton_layout import compile_jit

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SourceError("TRITON_INTERPRET=1 is set: @triton.jit makes interpreted functions, which do not "
                          "compile; build without it")
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"{bundle.name}{SOURCE_SUFFIX}"
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(source)
    tmp.replace(path)
    tree = _parse(source, path)
    _jit_function(tree, bundle.name, path)
    module = _load_module(path, bundle.name)
    fn = getattr(module, bundle.name, None)
    if fn is None or not hasattr(fn, "arg_names"):
        raise SourceError(f"{bundle.name} in the Triton source is not a @triton.jit function after import", path=path)
    import inspect

    params = inspect.signature(fn.fn).parameters
    defaults = {n: p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}
    constexpr_names = {fn.arg_names[i] for i in fn.constexprs}
    signature, values, attrs = source_signature(bundle, list(fn.arg_names), constexpr_names, constexprs, defaults,
                                                path)
    new = compile_jit(fn, signature, bundle.target, values, attrs, compile_options(bundle.metadata))
    new.origin = str(path)
    return new
