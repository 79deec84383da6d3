"""Imports flow downward: ir ← backends ← passes ← agents ← tools, and testsuite on top; nothing imports
`testsuite/` or `tools/` from below, and no two modules of the package import each other (directly or
around a longer loop), counting imports inside functions too."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Each layer may import its own and the lower ones.
LAYERS = {"ir": 0, "backends": 1, "passes": 2, "agents": 3, "tools": 4, "testsuite": 5}


def _module_name(path: Path) -> str:
    parts = ["kstrata", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_files() -> list[Path]:
    skip = (ROOT / "testsuite" / "corpus", ROOT / "testsuite" / "tests", ROOT / "build", ROOT / ".venv")
    return [p for p in sorted(ROOT.rglob("*.py")) if not any(p.is_relative_to(s) for s in skip)]


def _imports(path: Path) -> set[str]:
    """Every `kstrata.…` module `path` imports, anywhere in the file (relative imports resolved)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kstrata.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("kstrata"):
                found.add(module)
                # `from kstrata.backends import checks` imports the module kstrata.backends.checks
                found |= {f"{module}.{a.name}" for a in node.names}
    return found


@functools.lru_cache(maxsize=1)
def _scan() -> dict[str, frozenset[str]]:
    files = {_module_name(p): p for p in _package_files()}
    return {m: frozenset(i for i in _imports(p) if i in files and i != m) for m, p in files.items()}


def _graph() -> dict[str, set[str]]:
    return {m: set(deps) for m, deps in _scan().items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_no_upward_or_sideways_imports() -> None:
    wrong = []
    for module, imported in _graph().items():
        mine = _layer(module)
        for other in sorted(imported):
            theirs = _layer(other)
            if mine is not None and theirs is not None and theirs > mine:
                wrong.append(f"{module} imports {other}")
    assert not wrong, "imports against the layering (ir < backends < passes < agents < tools < testsuite):\n" + \
        "\n".join(wrong)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    graph = _graph()
    # a package's __init__ re-exporting its modules is not a cycle with them
    graph = {m: {i for i in deps if not m.startswith(i + ".")} for m, deps in graph.items()}
    assert not _cycles(graph), f"import cycles: {_cycles(graph)}"


def test_the_scan_sees_what_it_must_refuse(tmp_path: Path) -> None:
    """The checks above fail on an upward import and on a cycle (so they can fail)."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("kstrata.tools.cli") > _layer("kstrata.agents.engine") > _layer("kstrata.passes.pipeline")  # type: ignore[operator]
    probe = ROOT / "passes" / "pipeline.py"
    assert "kstrata.backends.rebuild" in _imports(probe)
