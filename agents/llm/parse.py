"""What a model may return, parsed strictly into a typed edit — or a `ParseFailure` with the reason.

A response holds exactly one fenced code block whose info string names its format:

| format         | fence          | what it is                                                              |
|----------------|----------------|-------------------------------------------------------------------------|
| `model_new`    | ```` ```python ```` | a whole standalone file defining `class ModelNew` (imports torch/triton only) |
| `triton_kernel`| ```` ```python ```` | one `@triton.jit` function replacing the incumbent's kernel of the same name and signature |
| `xdsl_pass`    | ```` ```xdsl-pass ```` | Python source of a `KernelPass` subclass (kstrata.passes.base) at ttir/ttgir |
| `asm_patch`    | ```` ```asm-patch ```` | an anchored assembly patch (`# kstrata asm patch v1`, backends/patch.py) |
| `pipeline`     | ```` ```pipeline ```` | one pass pipeline spec (`ttgir(num-stages{n=4})`)                        |

Which formats a request accepts depends on its space (`FORMATS_BY_SPACE`). Parsing never runs the
code: Python is read with `ast` only. Everything that can be told from the text is checked here (a
closed fence, a response not cut off, syntax, the class or function that must be there, imports from
the allowed modules, a kernel that exists in the incumbent with the same parameters, a patch that
applies at exactly one place, a pipeline whose passes exist at the space's levels); what needs running
is checked in a sandboxed child (`sandbox.py`) and by the engine.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

FORMATS = ("model_new", "triton_kernel", "xdsl_pass", "asm_patch", "pipeline")
FORMATS_BY_SPACE: dict[str, tuple[str, ...]] = {
    "library": ("model_new",),
    "compiler": ("model_new",),
    "graph": ("model_new",),
    "triton": ("model_new", "triton_kernel"),
    "ir": ("pipeline", "xdsl_pass"),
    "asm": ("asm_patch",),
}
#: Levels a pipeline or pass may touch, by space.
LEVELS_BY_SPACE = {"ir": ("ttir", "ttgir", "llir"), "asm": ("ptx", "amdgcn")}
#: Top-level modules a ModelNew file or a replacement kernel may import (standalone: never kstrata).
MODEL_IMPORTS = frozenset({"torch", "triton", "math", "functools", "typing", "__future__", "itertools",
                           "operator", "dataclasses"})
#: ... and a generated pass (it implements kstrata's pass interface and may use xDSL).
PASS_IMPORTS = MODEL_IMPORTS | {"kstrata", "xdsl", "re", "collections"}
#: Names no generated Python may call: the sandbox is the barrier, this is the first, readable refusal.
FORBIDDEN_CALLS = frozenset({"eval", "exec", "compile", "__import__", "open", "breakpoint", "input"})

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$", re.M)


@dataclass(frozen=True)
class ParseFailure:
    """Why a response is not a candidate; `reason` is fed back to the model verbatim."""

    reason: str
    kind: str = "format"  # format | truncated | empty | syntax | forbidden | mismatch

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason}


@dataclass(frozen=True)
class ModelNewEdit:
    """A complete standalone ModelNew file (for `triton_kernel`, the incumbent with one kernel replaced)."""

    source: str
    format: str = "model_new"
    kernel: str | None = None  # the replaced kernel's name, for triton_kernel
    kernel_source: str | None = None


@dataclass(frozen=True)
class PassSourceEdit:
    """Python source of one `KernelPass` subclass; run only in a sandboxed child."""

    source: str
    class_name: str
    format: str = "xdsl_pass"


@dataclass(frozen=True)
class AsmPatchEdit:
    text: str
    level: str
    format: str = "asm_patch"


@dataclass(frozen=True)
class PipelineEdit:
    spec: str
    format: str = "pipeline"


Edit = ModelNewEdit | PassSourceEdit | AsmPatchEdit | PipelineEdit


@dataclass(frozen=True)
class CodeBlock:
    info: str
    body: str


def extract_blocks(text: str) -> tuple[list[CodeBlock], ParseFailure | None]:
    """Every fenced block of `text`, or a failure when a fence is left open (a truncated response)."""
    blocks: list[CodeBlock] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").strip().lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(fence[0] * len(fence)) and not close.strip(fence[0]):
                break
            body.append(lines[j])
            j += 1
        else:
            return blocks, ParseFailure(f"the ```{info} block opened on line {i + 1} is never closed: the response "
                                        "looks truncated; send the whole block", "truncated")
        blocks.append(CodeBlock(info, "\n".join(body) + "\n"))
        i = j + 1
    return blocks, None


_INFO_TO_FORMATS = {"python": ("model_new", "triton_kernel"), "py": ("model_new", "triton_kernel"),
                    "xdsl-pass": ("xdsl_pass",), "asm-patch": ("asm_patch",), "patch": ("asm_patch",),
                    "pipeline": ("pipeline",)}


def parse_response(text: str, space: str, *, incumbent: str | None = None, asm_text: str | None = None,
                   truncated: bool = False) -> Edit | ParseFailure:
    """The edit a response for `space` holds, or why it holds none.

    `incumbent`: the incumbent's ModelNew source (needed for `triton_kernel`); `asm_text`: the assembly a
    patch must apply to (checked when given); `truncated`: the client saw the response cut off.
    """
    if space not in FORMATS_BY_SPACE:
        return ParseFailure(f"unknown space {space!r}", "format")
    allowed = FORMATS_BY_SPACE[space]
    if truncated:
        return ParseFailure("the response was cut off before the model finished (token limit or a dropped "
                            "stream); answer again, shorter: only the code block", "truncated")
    if not text or not text.strip():
        return ParseFailure("the response was empty; answer with exactly one code block", "empty")
    blocks, failure = extract_blocks(text)
    if failure:
        return failure
    fences = " or ".join(sorted({f"```{i}" for i, fs in _INFO_TO_FORMATS.items() if set(fs) & set(allowed)
                                 and i not in ("py", "patch")}))
    if not blocks:
        return ParseFailure(f"no code block found; answer with exactly one {fences} block", "format")
    usable = [b for b in blocks if set(_INFO_TO_FORMATS.get(b.info, ())) & set(allowed)]
    if len(usable) != 1:
        seen = ", ".join(f"```{b.info or '(no language)'}" for b in blocks)
        what = "no" if not usable else f"{len(usable)}"
        return ParseFailure(f"expected exactly one {fences} block for the {space} space, found {what} "
                            f"(blocks: {seen})", "format")
    block = usable[0]
    formats = [f for f in _INFO_TO_FORMATS[block.info] if f in allowed]
    if formats == ["model_new", "triton_kernel"] or formats == ["model_new"] or formats == ["triton_kernel"]:
        return _parse_python_candidate(block.body, formats, incumbent)
    if formats == ["xdsl_pass"]:
        return parse_pass_source(block.body)
    if formats == ["asm_patch"]:
        return parse_asm_patch(block.body, asm_text)
    return parse_pipeline_spec(block.body, LEVELS_BY_SPACE.get(space, ()))


# -- Python -----------------------------------------------------------------------------------------
def _syntax(source: str, what: str) -> ast.Module | ParseFailure:
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        return ParseFailure(f"{what}: SyntaxError at line {exc.lineno}: {exc.msg}" + (f": {line}" if line else ""),
                            "syntax")


def _import_problems(tree: ast.Module, allowed: frozenset[str]) -> str | None:
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                return f"line {node.lineno}: relative imports are not allowed"
            names = [node.module or ""]
        for n in names:
            if n.split(".")[0] not in allowed:
                return (f"line {getattr(node, 'lineno', '?')}: import of {n!r} is not allowed (allowed: "
                        f"{', '.join(sorted(allowed))})")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            return f"line {node.lineno}: calling {node.func.id}() is not allowed in a candidate"
    return None


def _is_triton_jit(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        text = ast.unparse(target)
        if text in ("triton.jit", "jit", "triton.autotune", "autotune", "triton.heuristics", "heuristics"):
            return True
    return False


def _parse_python_candidate(source: str, formats: list[str], incumbent: str | None) -> Edit | ParseFailure:
    tree = _syntax(source, "the code")
    if isinstance(tree, ParseFailure):
        return tree
    problem = _import_problems(tree, MODEL_IMPORTS)
    if problem:
        return ParseFailure(problem, "forbidden")
    has_model = any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
    if has_model and "model_new" in formats:
        return ModelNewEdit(source)
    kernels = [n for n in tree.body if isinstance(n, ast.FunctionDef) and _is_triton_jit(n)]
    if "triton_kernel" in formats and not has_model:
        others = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
                  and n not in kernels]
        if len(kernels) != 1 or others:
            return ParseFailure(f"a replacement kernel is exactly one @triton.jit function (found {len(kernels)} "
                                f"kernels and {len(others)} other definitions); or send a whole file with class "
                                "ModelNew", "format")
        return replace_kernel(incumbent, kernels[0], source)
    return ParseFailure("the file defines no class ModelNew (a candidate is a whole standalone file with "
                        "`class ModelNew(nn.Module)`)", "format")


def triton_kernels(source: str) -> dict[str, ast.FunctionDef]:
    """The `@triton.jit` functions defined at the top level of `source`, by name ({} if it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and _is_triton_jit(n)}


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def replace_kernel(incumbent: str | None, kernel: ast.FunctionDef, kernel_source: str) -> ModelNewEdit | ParseFailure:
    """The incumbent with its kernel of `kernel`'s name replaced by `kernel_source`'s function."""
    if not incumbent:
        return ParseFailure("a replacement kernel needs an incumbent with Triton kernels; send a whole file with "
                            "class ModelNew instead", "mismatch")
    old = triton_kernels(incumbent)
    if kernel.name not in old:
        names = ", ".join(old) or "none"
        return ParseFailure(f"the incumbent has no Triton kernel named {kernel.name!r} (its kernels: {names})",
                            "mismatch")
    target = old[kernel.name]
    if _params(target) != _params(kernel):
        return ParseFailure(f"kernel {kernel.name}: the parameters must stay ({', '.join(_params(target))}), got "
                            f"({', '.join(_params(kernel))})", "mismatch")
    lines = incumbent.splitlines(keepends=True)
    start = min([d.lineno for d in target.decorator_list] + [target.lineno]) - 1
    end = target.end_lineno or target.lineno
    src_lines = kernel_source.splitlines(keepends=True)
    k_start = min([d.lineno for d in kernel.decorator_list] + [kernel.lineno]) - 1
    body = "".join(src_lines[k_start:kernel.end_lineno or kernel.lineno])
    if not body.endswith("\n"):
        body += "\n"
    new = "".join(lines[:start]) + body + "".join(lines[end:])
    # Imports the replacement needs that the incumbent lacks go on top.
    needed = [ln for ln in src_lines[:k_start] if ln.lstrip().startswith(("import ", "from "))
              and ln.strip() not in {x.strip() for x in lines}]
    new = "".join(needed) + new
    check = _syntax(new, "the incumbent with the kernel replaced")
    if isinstance(check, ParseFailure):
        return check
    return ModelNewEdit(new, "triton_kernel", kernel.name, body)


def parse_pass_source(source: str) -> PassSourceEdit | ParseFailure:
    tree = _syntax(source, "the pass")
    if isinstance(tree, ParseFailure):
        return tree
    problem = _import_problems(tree, frozenset(PASS_IMPORTS))
    if problem:
        return ParseFailure(problem, "forbidden")
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)
               and any(ast.unparse(b).split(".")[-1] == "KernelPass" for b in n.bases)]
    if len(classes) != 1:
        return ParseFailure(f"a generated pass is exactly one class deriving from KernelPass "
                            f"(kstrata.passes.base); found {len(classes)}", "format")
    cls = classes[0]
    assigned = {t.id for n in cls.body if isinstance(n, ast.Assign | ast.AnnAssign)
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    missing = [x for x in ("name", "level") if x not in assigned]
    if not any(isinstance(n, ast.FunctionDef) and n.name == "apply" for n in cls.body):
        missing.append("apply")
    if missing:
        return ParseFailure(f"pass class {cls.name} must set `name` and `level` and define apply(self, ctx) "
                            f"(missing: {', '.join(missing)})", "format")
    return PassSourceEdit(source, cls.name)


# -- assembly and pipelines ---------------------------------------------------------------------------
def parse_asm_patch(text: str, asm_text: str | None) -> AsmPatchEdit | ParseFailure:
    from kstrata.backends.patch import AsmPatch, AsmPatchError, apply_patch

    try:
        patch = AsmPatch.from_text(text, "<response>")
    except AsmPatchError as exc:
        return ParseFailure(f"not a valid assembly patch: {exc}", "format")
    if asm_text is not None:
        try:
            apply_patch(asm_text, patch)
        except AsmPatchError as exc:
            return ParseFailure(f"the patch does not apply to the incumbent's {patch.level}: {exc}", "mismatch")
    return AsmPatchEdit(patch.to_text(), patch.level)


def parse_pipeline_spec(text: str, levels: tuple[str, ...]) -> PipelineEdit | ParseFailure:
    from kstrata.passes.base import PassError
    from kstrata.passes.pipeline import parse_pipeline

    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if len(lines) != 1:
        return ParseFailure(f"a pipeline block holds exactly one line (a spec such as ttgir(num-stages{{n=4}})), "
                            f"got {len(lines)}", "format")
    try:
        pipeline = parse_pipeline(lines[0])
    except PassError as exc:
        return ParseFailure(f"not a valid pipeline: {exc}", "format")
    bad = [s.level for s in pipeline.stages if levels and s.level not in levels]
    if bad:
        return ParseFailure(f"this space rewrites {', '.join(levels)}, not {', '.join(bad)}", "mismatch")
    # The spec as written (validated above): re-spelling would drop options equal to their defaults.
    return PipelineEdit(lines[0])
