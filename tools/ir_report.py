"""Reports on the typed Triton IR: op coverage (seen vs defined) and parse/print speed next to Triton's parser.

    python -m kstrata.tools.ir_report coverage DIR... [--out testsuite/results]
    python -m kstrata.tools.ir_report bench DIR... [--out testsuite/results] [--repeat 3]

Each DIR is a Triton cache root, a dump root, or any folder holding `.ttir`/`.ttgir` files (searched
recursively, e.g. `testsuite/corpus`). Both write a dated markdown file and its JSON to `--out`.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from kstrata.ir.dialects import TRITON_DIALECTS, defined_op_names
from kstrata.ir.triton_ir import parse_triton, print_triton

report_app = typer.Typer(help="Coverage and speed reports for the typed Triton IR.", no_args_is_help=True,
                         add_completion=False, pretty_exceptions_enable=False)

_OP_AT_LINE = re.compile(r'^\s*(?:%[^=]*=\s*)?"?([a-z_][a-z0-9_]*\.[a-z0-9_.]+)"?[\s(]')
_TYPE_OR_ATTR = re.compile(r"([#!])((?:tt|ttg|ttng|amdg|rocdl)\.[a-z_.]+)")
_DEFAULT_OUT = Path(__file__).resolve().parents[1] / "testsuite" / "results"


def ir_files(roots: list[Path]) -> list[Path]:
    files: list[Path] = []
    for root in roots:
        files += sorted(p for p in root.rglob("*") if p.suffix in (".ttir", ".ttgir"))
    return files


def ops_in_text(text: str) -> Counter[str]:
    """Op names used in a module's text (generic and custom forms), without parsing it."""
    seen: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith(("#", "module")):
            continue
        m = _OP_AT_LINE.match(line)
        if m:
            seen[m.group(1)] += 1
        if line.lstrip().startswith("}) :") or line.lstrip().startswith("} do {"):
            continue
    return seen


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist in ("triton", "xdsl", "kstrata", "torch"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "system": platform.platform()}


def _write(out: Path, stem: str, payload: dict[str, Any], markdown: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    day = _dt.date.today().isoformat()
    (out / f"{stem}-{day}.json").write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    path = out / f"{stem}-{day}.md"
    path.write_text(markdown)
    return path


def _label(path: Path, roots: list[Path]) -> str:
    for root in roots:
        if path.is_relative_to(root):
            return f"{root.name}/{path.relative_to(root)}"
    return str(path)


@report_app.command("coverage")
def coverage(roots: Annotated[list[Path], typer.Argument(help="Folders with .ttir/.ttgir files.")],
             out: Annotated[Path, typer.Option("--out")] = _DEFAULT_OUT) -> None:
    """Ops (and Triton types/attributes) seen in the files vs defined by the dialects; exit 1 if any is missing."""
    files = ir_files(roots)
    defined = set(defined_op_names())
    defined_attrs = {a.name for d in TRITON_DIALECTS for a in d.attributes}
    ops: Counter[str] = Counter()
    attrs: Counter[str] = Counter()
    by_source: dict[str, set[str]] = {}
    parse_failures: dict[str, str] = {}
    for f in files:
        text = f.read_text()
        seen = ops_in_text(text)
        ops.update(seen)
        for m in _TYPE_OR_ATTR.finditer(text):
            attrs[m.group(2)] += 1
        source = next((_source_name(r) for r in roots if f.is_relative_to(r)), str(f.parent))
        by_source.setdefault(source, set()).update(seen)
        try:
            parse_triton(text, f)
        except Exception as exc:  # report, don't stop: coverage is about what is missing
            parse_failures[_label(f, roots)] = str(exc).splitlines()[0][:300]
    missing_ops = sorted(set(ops) - defined)
    missing_attrs = sorted(a for a in attrs if a not in defined_attrs)
    payload: dict[str, Any] = {
        "date": _dt.date.today().isoformat(), "files": len(files), "versions": _versions(),
        "ops_seen": dict(sorted(ops.items())), "ops_defined": sorted(defined), "ops_missing": missing_ops,
        "ops_defined_unseen": sorted(defined - set(ops)), "types_attrs_seen": dict(sorted(attrs.items())),
        "types_attrs_missing": missing_attrs, "ops_by_source": {k: sorted(v) for k, v in by_source.items()},
        "parse_failures": parse_failures,
    }
    lines = [f"# Typed Triton IR coverage ({payload['date']})", "",
             f"{len(files)} files under {', '.join(str(r) for r in roots)}; versions: "
             + ", ".join(f"{k} {v}" for k, v in payload["versions"].items()), "",
             f"- ops seen: **{len(ops)}**, defined: **{len(defined)}**, seen but not defined: **{len(missing_ops)}**"
             + (f" ({', '.join(missing_ops)})" if missing_ops else ""),
             f"- Triton types/attributes seen: {len(attrs)}, not defined: {len(missing_attrs)}"
             + (f" ({', '.join(missing_attrs)})" if missing_attrs else ""),
             f"- files that do not parse: {len(parse_failures)}", "",
             "| op | uses | defined |", "|---|---:|---|"]
    lines += [f"| `{op}` | {n} | {'yes' if op in defined else '**no**'} |" for op, n in sorted(ops.items())]
    lines += ["", "Defined but not seen in these files: " + ", ".join(f"`{o}`" for o in sorted(defined - set(ops))), ""]
    for source, names in sorted(by_source.items()):
        lines.append(f"- `{source}`: {len(names)} distinct ops")
    if parse_failures:
        lines += ["", "## Files that do not parse", ""] + [f"- `{k}`: {v}" for k, v in parse_failures.items()]
    path = _write(out, "ir-coverage", payload, "\n".join(lines) + "\n")
    typer.echo(f"{len(ops)} ops seen, {len(defined)} defined, {len(missing_ops)} missing; "
               f"{len(parse_failures)} files fail to parse -> {path}")
    if missing_ops or parse_failures:
        raise typer.Exit(1)


def _triton_parse_seconds(path: Path, backend: str) -> float:
    from triton._C.libtriton import ir  # type: ignore[import-not-found, unused-ignore]
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    context = ir.context()
    ir.load_dialects(context)
    target = GPUTarget("cuda", 90, 32) if backend == "cuda" else GPUTarget("hip", "gfx942", 64)
    make_backend(target).load_dialects(context)
    t0 = time.perf_counter()
    ir.parse_mlir_module(str(path), context)
    return time.perf_counter() - t0


@report_app.command("bench")
def bench(roots: Annotated[list[Path], typer.Argument(help="Folders with .ttir/.ttgir files.")],
          out: Annotated[Path, typer.Option("--out")] = _DEFAULT_OUT,
          repeat: Annotated[int, typer.Option("--repeat", help="Runs per file; the median is reported.")] = 3) -> None:
    """Per file: xDSL parse time, print time, and Triton's own parse time of the same text (medians)."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for f in ir_files(roots):
            text = f.read_text()
            backend = "hip" if 'ttg.target = "hip' in text or "amdg." in text else "cuda"
            copy = Path(tmp) / f.name
            copy.write_text(text)
            parse_t, print_t, triton_t = [], [], []
            for _ in range(repeat):
                t0 = time.perf_counter()
                module = parse_triton(text, f)
                t1 = time.perf_counter()
                printed = print_triton(module)
                t2 = time.perf_counter()
                parse_t.append(t1 - t0)
                print_t.append(t2 - t1)
                triton_t.append(_triton_parse_seconds(copy, backend))
            rows.append({"file": _label(f, roots), "bytes": len(text), "lines": text.count("\n"),
                         "ops": sum(1 for _ in module.ops()), "identical": printed == text,
                         "parse_ms": 1e3 * statistics.median(parse_t), "print_ms": 1e3 * statistics.median(print_t),
                         "triton_parse_ms": 1e3 * statistics.median(triton_t)})
    total = {k: sum(r[k] for r in rows) for k in ("parse_ms", "print_ms", "triton_parse_ms", "ops", "bytes")}
    payload: dict[str, Any] = {"date": _dt.date.today().isoformat(), "machine": _machine(), "versions": _versions(),
               "repeat": repeat, "files": len(rows), "total": total, "rows": rows}
    ratio = (total["parse_ms"] + total["print_ms"]) / max(total["triton_parse_ms"], 1e-9)
    lines = [f"# Typed Triton IR: parse + print time ({payload['date']})", "",
             f"Machine: {payload['machine']['cpu']}, {payload['machine']['cores']} cores, "
             f"{payload['machine']['system']}. Versions: " + ", ".join(f"{k} {v}" for k, v in payload["versions"].items()),
             f"Median of {repeat} runs per file; Triton's time is `ir.parse_mlir_module` (parse + verify) of the same "
             "text, in a context with its dialects loaded.", "",
             f"**{len(rows)} files, {total['ops']} ops, {total['bytes'] / 1e6:.2f} MB**: xDSL parse "
             f"{total['parse_ms'] / 1e3:.2f} s + print {total['print_ms'] / 1e3:.2f} s vs Triton parse "
             f"{total['triton_parse_ms'] / 1e3:.3f} s ({ratio:.0f}x); per op: "
             f"{1e3 * total['parse_ms'] / max(total['ops'], 1):.0f} us parse, "
             f"{1e3 * total['print_ms'] / max(total['ops'], 1):.0f} us print, "
             f"{1e3 * total['triton_parse_ms'] / max(total['ops'], 1):.1f} us Triton.", "",
             "| file | lines | ops | parse ms | print ms | Triton parse ms | text identical |",
             "|---|---:|---:|---:|---:|---:|---|"]
    lines += [f"| `{r['file']}` | {r['lines']} | {r['ops']} | {r['parse_ms']:.1f} | {r['print_ms']:.1f} | "
              f"{r['triton_parse_ms']:.2f} | {'yes' if r['identical'] else 'no'} |" for r in rows]
    path = _write(out, "ir-bench", payload, "\n".join(lines) + "\n")
    typer.echo(f"{len(rows)} files: parse {total['parse_ms']:.0f} ms, print {total['print_ms']:.0f} ms, "
               f"Triton {total['triton_parse_ms']:.0f} ms -> {path}")


def _source_name(root: Path) -> str:
    """`suite`, `corpus`, `corpus-hip`: a cache root's folder name (`corpus` for `testsuite/corpus/triton`)."""
    if root.name.startswith("triton"):  # testsuite/corpus/triton, testsuite/corpus/triton-hip
        return root.resolve().parent.name + root.name[len("triton"):]
    return root.name


@report_app.command("roundtrip")
def roundtrip(roots: Annotated[list[Path], typer.Argument(help="Triton cache roots (a kstrata suite build, the corpus).")],
              out: Annotated[Path, typer.Option("--out")] = _DEFAULT_OUT,
              stem: Annotated[str, typer.Option("--stem", help="Results file name before the date.")] = "ir-roundtrip") -> None:
    """The round-trip contract for every TTIR/TTGIR of the cache roots: text, Triton's parser, binary."""
    from kstrata.ir.ir_roundtrip import check_roundtrip
    from kstrata.ir.triton_layout import load_cache_root

    rows: list[dict[str, Any]] = []
    for root in roots:
        bundles, errors = load_cache_root(root)
        for exc in errors:
            rows.append({"source": _source_name(root), "error": str(exc)})
        for b in bundles:
            for level in ("ttir", "ttgir"):
                if level not in b.levels:
                    continue
                row: dict[str, Any] = {"source": _source_name(root), "kernel": b.name, "target": str(b.target), "level": level,
                                       "entry": Path(b.origin or "").name}
                t0 = time.perf_counter()
                try:
                    stored = b.levels.get(b.target.binary_level)
                    result = check_roundtrip(b.text(level), level, b.target, b.metadata,
                                             stored_binary=stored if isinstance(stored, bytes) else None)
                    row |= result.to_json()
                    row["stored_compared"] = isinstance(stored, bytes)
                except Exception as exc:  # one failure must not hide the others
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                row["seconds"] = round(time.perf_counter() - t0, 2)
                rows.append(row)
                typer.echo(f"{row['source']} {row.get('target')} {row.get('kernel')} {level}: "
                           f"text={row.get('text_identical')} parses={row.get('triton_parses')} "
                           f"binary={row.get('binary_identical')}" + (f" error={row['error']}" if "error" in row else ""))
    path = write_roundtrip_results(rows, out, stem)
    typer.echo(f"-> {path}")
    if any("error" in r or not r.get("holds") for r in rows):
        raise typer.Exit(1)


def write_roundtrip_results(rows: list[dict[str, Any]], out: Path, stem: str) -> Path:
    """The dated markdown + JSON of a round-trip run, from its per-module rows."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["source"], r.get("target", "?"), r.get("level", "?")), []).append(r)
    summary = [{"source": s, "target": t, "level": lv, "modules": len(rs),
                "text_identical": sum(bool(r.get("text_identical")) for r in rs),
                "triton_parses": sum(bool(r.get("triton_parses")) for r in rs),
                "binary_identical": sum(bool(r.get("binary_identical")) for r in rs),
                "stored_binary_compared": sum(bool(r.get("stored_compared")) for r in rs),
                "stored_binary_equal": sum(1 for r in rs if r.get("stored_compared") and r.get("stored_difference") is None),
                "errors": sum("error" in r for r in rs)} for (s, t, lv), rs in sorted(groups.items())]
    payload: dict[str, Any] = {"date": _dt.date.today().isoformat(), "machine": _machine(), "versions": _versions(),
               "summary": summary, "rows": rows}
    lines = [f"# TTIR/TTGIR round trip through the typed dialects ({payload['date']})", "",
             f"Machine: {payload['machine']['cpu']}, {payload['machine']['cores']} cores. Versions: "
             + ", ".join(f"{k} {v}" for k, v in payload["versions"].items()), "",
             "Per module: parse + print (`text identical`: byte for byte, locations and aliases included); "
             "Triton's `parse_mlir_module` on the printed text; and `triton.compile` from that level of the input "
             "text and of the printed text, from the same file path, each in a fresh cache (`binary identical`). "
             "`stored equal`: the recompiled input equals the binary Triton stored when it compiled the kernel "
             "(informational: compiling from a file can change AMD line tables; n/a: the corpus keeps no binaries).", "",
             "| source | target | level | modules | text identical | Triton parses | binary identical | stored equal | errors |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {s['source']} | {s['target']} | {s['level']} | {s['modules']} | {s['text_identical']} | "
              f"{s['triton_parses']} | {s['binary_identical']} | "
              + (f"{s['stored_binary_equal']} of {s['stored_binary_compared']}" if s["stored_binary_compared"] else "n/a")
              + f" | {s['errors']} |" for s in summary]
    odd = [r for r in rows if "error" in r or not r.get("binary_identical") or r.get("stored_difference")]
    if odd:
        lines += ["", "## Modules to look at", ""]
        lines += [f"- {r['source']} {r.get('target')} `{r.get('kernel')}` {r.get('level')}: "
                  + (r.get("error") or r.get("binary_difference") or f"stored binary differs: {r.get('stored_difference')}")
                  for r in odd]
    return _write(out, stem, payload, "\n".join(lines) + "\n")


if __name__ == "__main__":
    report_app()
    sys.exit(0)
