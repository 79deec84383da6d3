"""The `kstrata` command line.

Every command takes `--json` for machine-readable output and exits non-zero on failure; a user error
(bad path, unknown target, corrupt file) prints one line naming the file, without a traceback.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kstrata import __version__
from kstrata.backends.tools import naming_user_files
from kstrata.ir.errors import KstrataError
from kstrata.ir.files import make_dir
from kstrata.tools.cli_eval import ONE_COMMAND, bench_cmd, eval_cmd
from kstrata.tools.cli_ir import ir_app
from kstrata.tools.cli_llm import llm_app
from kstrata.tools.cli_optimize import optimize_app
from kstrata.tools.cli_skills import skills_app
from kstrata.tools.cli_task import task_app
from kstrata.tools.cli_tuned import tuned_app
from kstrata.tools.console import emit_json, err, error_line, fail, out

app = typer.Typer(help="Make GPU kernels faster at every level of Triton's lowering, and prove it.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
suite_app = typer.Typer(help="The project's own kernel suite.", no_args_is_help=True)
bundle_app = typer.Typer(help="Kernel bundles: one kernel at every level.", no_args_is_help=True)
asm_app = typer.Typer(help="Assembly level: patches, rebuilds and reports (PTX/cubin, AMDGCN/hsaco).",
                      no_args_is_help=True)
app.add_typer(suite_app, name="suite")
app.add_typer(bundle_app, name="bundle")
app.add_typer(asm_app, name="asm")
app.add_typer(task_app, name="task")
# `eval` and `bench` are single commands: mounted as commands (a mounted sub-app's usage line would
# end in a stray `COMMAND [ARGS]...`).
app.command("eval", help=eval_cmd.__doc__, context_settings=ONE_COMMAND)(eval_cmd)
app.command("bench", help=bench_cmd.__doc__, context_settings=ONE_COMMAND)(bench_cmd)
app.add_typer(optimize_app, name="optimize")
app.add_typer(ir_app, name="ir")
app.add_typer(skills_app, name="skills")
app.add_typer(llm_app, name="llm")
app.add_typer(tuned_app, name="tuned")
passes_app = typer.Typer(help="The pass catalogue.", no_args_is_help=True)
app.add_typer(passes_app, name="passes")

_fail = fail
_emit_json = emit_json


def _version_callback(value: bool) -> None:
    if value:
        out.print(f"kstrata {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """kstrata: capture, rewrite, verify and measure Triton kernels at every level."""


# ---------------------------------------------------------------------------------------------------
# suite
# ---------------------------------------------------------------------------------------------------
@suite_app.command("list")
def suite_list(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List the suite's kernels with what each exercises."""
    from kstrata.tools.suite import load_suite

    kernels = load_suite().all_kernels()
    rows = [{"name": k.name, "function": k.fn_name, "module": k.fn.__module__.rsplit(".", 1)[-1], "tags": list(k.tags),
             "num_warps": k.num_warps, "num_stages": k.num_stages, "outputs": list(k.outputs),
             "description": k.description} for k in kernels]
    if as_json:
        _emit_json({"kernels": rows})
        return
    table = Table(title=f"{len(rows)} suite kernels")
    for col in ("name", "module", "tags", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["module"], ", ".join(r["tags"]), r["description"])
    out.print(table)


def _resources(bundle: Any) -> dict[str, Any] | None:
    from kstrata.backends.resources import resource_usage

    try:
        return resource_usage(bundle).to_json()
    except KstrataError as exc:
        return {"error": str(exc)}


@suite_app.command("build")
def suite_build(
    target: list[str] = typer.Option(..., "--target", "-t", help="cuda:90, hip:gfx942, … (repeatable)."),
    cache_dir: Path = typer.Option(..., "--cache-dir", help="Directory to fill in Triton cache layout."),
    only: list[str] = typer.Option(None, "--only", help="Build only these kernels (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Compile the suite for each target into CACHE_DIR and show every kernel's levels and resources."""
    from kstrata.ir.target import Target
    from kstrata.tools.suite import load_suite

    suite = load_suite()
    all_kernels, build_suite = suite.all_kernels, suite.build_suite

    targets = [Target.parse(t) for t in target]
    make_dir(cache_dir, "--cache-dir")
    kernels = all_kernels()
    if only:
        wanted = {name for o in only for name in suite_kernel_names(o)}
        kernels = [k for k in kernels if k.name in wanted]
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json or not err.is_terminal) as progress:
        for tgt in targets:
            task = progress.add_task(f"building for {tgt}", total=len(kernels))

            def step(kernel: Any, bundle: Any, error: str | None, task: Any = task, tgt: Any = tgt) -> None:
                progress.advance(task)
                if error and not as_json:
                    err.print(f"[red]FAIL[/] {kernel.name} for {tgt}: {escape(str(error))}", highlight=False)

            results.append(build_suite(tgt, cache_dir, kernels, on_kernel=step))
    built_targets: list[dict[str, Any]] = []
    payload: dict[str, Any] = {"cache_dir": str(cache_dir), "targets": built_targets}
    for res in results:
        entries = []
        for name, bundle in res.bundles.items():
            entries.append({"kernel": name, "entry": bundle.origin, "levels": bundle.present_levels(),
                            "num_warps": bundle.num_warps, "num_stages": bundle.num_stages,
                            "shared": bundle.shared, "resources": _resources(bundle)})
        built_targets.append({"target": str(res.target), "built": len(res.bundles), "failed": res.errors,
                                   "skipped": res.skipped, "kernels": entries})
    if as_json:
        _emit_json(payload)
    else:
        for tgt_payload in built_targets:
            _print_build_table(tgt_payload)
            for name, why in tgt_payload["skipped"].items():
                out.print(f"  [yellow]skipped[/] {name}: {escape(str(why))}", highlight=False)
        out.print(f"cache: {cache_dir}")
    if any(t["failed"] for t in built_targets):
        raise typer.Exit(1)


def _print_build_table(tgt_payload: dict[str, Any]) -> None:
    from kstrata.ir.target import Target

    def levels_of(spelling: str) -> tuple[str, ...]:
        return Target.parse(spelling).levels

    amd = tgt_payload["target"].startswith("hip")
    table = Table(title=f"{tgt_payload['target']}: {tgt_payload['built']} kernels built, "
                        f"{len(tgt_payload['failed'])} failed")
    for col in ("kernel", "levels", "warps", "stages", "shared B", "VGPRs" if amd else "regs",
                "SGPRs" if amd else "local B", "spills" if amd else "stack B"):
        table.add_column(col, justify="left" if col in ("kernel", "levels") else "right")
    for e in tgt_payload["kernels"]:
        r = e["resources"] or {}
        if "error" in r:
            res_cells = ["?", "?", "?"]
        elif amd:
            res_cells = [str(r["registers"]), str(r["sgprs"]), str((r["vgpr_spills"] or 0) + (r["sgpr_spills"] or 0))]
        else:
            res_cells = [str(r["registers"]), str(r["local_bytes"]), str(r["stack_bytes"])]
        table.add_row(e["kernel"], f"{len(e['levels'])}/{len(levels_of(tgt_payload['target']))}", str(e["num_warps"]), str(e["num_stages"]), str(e["shared"]),
                      *res_cells)
    out.print(table)


def _close(name: str, names: Any) -> str:
    import difflib

    close = difflib.get_close_matches(name, sorted(set(names)), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(close)}?" if close else ""


def suite_kernel_names(name: str) -> list[str]:
    """The suite kernels `name` means: a suite name (`layernorm_fwd`) or a kernel function's
    (`layernorm_fwd_kernel`, which several suite kernels may share); unknown names fail with close ones."""
    from kstrata.tools.suite import load_suite

    kernels = load_suite().all_kernels()
    found = [k.name for k in kernels if name in (k.name, k.fn_name)]
    if not found:
        _fail(f"unknown suite kernel {name!r}{_close(name, [k.name for k in kernels] + [k.fn_name for k in kernels])} "
              "(see `kstrata suite list`)", code=2)
    return found


def select_kernels(bundles: list[Any], name: str, path: Path) -> list[Any]:
    """The bundles `--kernel NAME` means: the kernel function's name (`layernorm_fwd_kernel`), or the suite
    name a `suite build` index records for the entry (`layernorm_fwd`), or that name with `_kernel`."""
    from kstrata.ir.triton_layout import read_index

    exact = [b for b in bundles if b.name == name]
    if exact:
        return exact
    indexes: dict[Path, dict[str, Any]] = {}

    def suite_name(b: Any) -> str | None:
        entry = Path(str(b.origin))
        if entry.parent not in indexes:
            try:
                indexes[entry.parent] = read_index(entry.parent)
            except KstrataError:
                indexes[entry.parent] = {}
        record = indexes[entry.parent].get(entry.name)
        return record.get("suite_kernel") if isinstance(record, dict) else None

    by_suite = [b for b in bundles if suite_name(b) == name]
    if by_suite:
        return by_suite
    suffixed = [b for b in bundles if b.name == f"{name}_kernel"]
    if suffixed:
        return suffixed
    known = [b.name for b in bundles] + [s for b in bundles if (s := suite_name(b))]
    _fail(f"{path}: no kernel named {name!r}{_close(name, known)}", code=2)


# ---------------------------------------------------------------------------------------------------
# bundle
# ---------------------------------------------------------------------------------------------------
def _disassemble(bundle: Any, level: str) -> str:
    import tempfile

    from kstrata.backends.tools import run_tool

    data = bundle.level(level)
    with tempfile.NamedTemporaryFile(suffix=f".{level}") as f:
        f.write(data)
        f.flush()
        if level == "cubin":
            from kstrata.backends.nvidia import find_nvidia_tool

            return run_tool([find_nvidia_tool("cuobjdump").path, "--dump-sass", f.name]).stdout
        from kstrata.backends.amd import find_amd_tool

        return run_tool([find_amd_tool("llvm-objdump").path, "-d", f"--mcpu={bundle.target.arch}", f.name]).stdout


@bundle_app.command("show")
def bundle_show(
    path: Path = typer.Argument(..., help="A Triton cache entry or root, or a dump entry or root."),
    level: str = typer.Option(None, "--level", "-l", help="Print this level (binary levels are disassembled)."),
    kernel: str = typer.Option(None, "--kernel", "-k", help="Only the kernel with this name."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Show kernels at every level: metadata, signature, ABI, levels and resources."""
    from kstrata.ir.triton_layout import load_any

    bundles, errors = load_any(path)
    if kernel:
        bundles = select_kernels(bundles, kernel, path)
    for e in errors:
        err.print(f"[yellow]skipped:[/] {escape(str(e))}", highlight=False)
    if level:
        for b in bundles:
            art = b.level(level)
            with naming_user_files(b):
                text = _disassemble(b, level) if isinstance(art, bytes) else art
            if as_json:
                _emit_json({"name": b.name, "target": str(b.target), "level": level, "text": text})
            else:
                sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    summaries = []
    for b in bundles:
        s = b.summary()
        s["resources"] = _resources(b)
        summaries.append(s)
    if as_json:
        _emit_json({"bundles": summaries, "errors": [str(e) for e in errors]})
    else:
        for s in summaries:
            _print_bundle(s)
    if errors:
        raise typer.Exit(1)


#: How the text output names resource keys where the JSON name alone misleads.
_RESOURCE_LABEL = {"shared_bytes": "static_shared_bytes"}
#: Why the header's shared memory and the resources' static shared memory differ.
_SHARED_NOTE = {
    "cuda": ("shared: Triton's allocation, passed at launch (dynamic); static_shared_bytes: what the binary "
             "declares (cuobjdump; on sm_80+ it counts the 1 KiB CUDA reserves per block once a kernel uses shared memory)"),
    "hip": ("shared: Triton's LDS allocation, passed at launch (dynamic); static_shared_bytes: the code object's "
            "static LDS (0 for Triton kernels: all their LDS is dynamic)"),
}


def _print_bundle(s: dict[str, Any]) -> None:
    out.print(f"[bold]{escape(s['name'])}[/]  {s['target']}  warps={s['num_warps']} stages={s['num_stages']} "
              f"shared={s['shared']} B at launch  [dim]{escape(str(s['origin']))}[/]", highlight=False)
    sig = ", ".join(f"{k}: {v}" for k, v in s["signature"].items())
    out.print(f"  signature: ({sig})", highlight=False)
    table = Table(show_header=True, box=None, padding=(0, 2))
    for col in ("level", "bytes", "lines", "sha256"):
        table.add_column(col)
    for lv, info in s["levels"].items():
        table.add_row(lv, str(info["bytes"]), "" if info["lines"] is None else str(info["lines"]), info["sha256"][:16])
    out.print(table)
    r = s.get("resources") or {}
    if "error" in r:
        out.print(f"  resources: unavailable ({r['error']})", highlight=False)
    elif r:
        keys = [k for k in ("registers", "sgprs", "agprs", "shared_bytes", "local_bytes", "stack_bytes", "vgpr_spills",
                            "sgpr_spills") if r.get(k) is not None]
        out.print("  resources: " + " ".join(f"{_RESOURCE_LABEL.get(k, k)}={r[k]}" for k in keys)
                  + f"  [dim]({escape(str(r['source']))})[/]", highlight=False)
        out.print(f"  [dim]{_SHARED_NOTE[str(s['target']).split(':')[0]]}[/]", highlight=False)
    for note in s["notes"]:
        out.print(f"  [dim]note: {note}[/]", highlight=False)
    out.print()


# ---------------------------------------------------------------------------------------------------
# asm
# ---------------------------------------------------------------------------------------------------
def _one_bundle(path: Path, kernel: str | None) -> Any:
    from kstrata.ir.triton_layout import load_any

    bundles, errors = load_any(path)
    if errors:
        raise errors[0]
    if kernel:
        bundles = select_kernels(bundles, kernel, path)
    if len(bundles) != 1:
        names = ", ".join(sorted({b.name for b in bundles})) or "none"
        _fail(f"{path}: expected one kernel, found {len(bundles)} ({names}); pass a cache entry or --kernel")
    return bundles[0]


@asm_app.command("rebuild")
def asm_rebuild(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE", help="A cache or dump entry (or a root with --kernel)."),
    level: str = typer.Option(None, "--level", help="ptx or amdgcn (default: the target's assembly level)."),
    kernel: str = typer.Option(None, "--kernel", "-k"),
    out_dir: Path = typer.Option(None, "--out", help="Write the rebuilt binary here."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Rebuild the binary from the assembly level with Triton's options and compare it with the original."""
    from kstrata.backends.asm import rebuild

    bundle = _one_bundle(bundle_path, kernel)
    if level and level != bundle.target.asm_level:
        _fail(f"{bundle.target} kernels are rebuilt from {bundle.target.asm_level}, not {level}")
    with naming_user_files(bundle):
        binary, report = rebuild(bundle)
    payload = {"kernel": bundle.name, "target": str(bundle.target), **report.to_json()}
    if out_dir:
        make_dir(out_dir, "--out directory")
        dest = out_dir / f"{bundle.name}.{bundle.target.binary_level}"
        tmp = dest.with_name(dest.name + ".tmp")
        tmp.write_bytes(binary)
        tmp.replace(dest)
        payload["written"] = str(dest)
    if as_json:
        _emit_json(payload)
    else:
        out.print(f"{bundle.name} {bundle.target}: rebuilt from {report.level}: {report.detail}", highlight=False)
    if not report.same_code:
        raise typer.Exit(1)


@asm_app.command("patch")
def asm_patch(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE", help="A cache or dump entry (or a root with --kernel)."),
    patch_path: Path = typer.Argument(..., metavar="PATCH", help="A kstrata asm patch (.patch text or .json)."),
    out_dir: Path = typer.Option(..., "--out", help="Directory for the patched kernel (override layout)."),
    kernel: str = typer.Option(None, "--kernel", "-k"),
    force: bool = typer.Option(False, "--force", help="Replace an existing, different entry in --out."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Apply PATCH strictly, rebuild the binary, check the ABI, and write the kernel to --out."""
    from kstrata.backends.asm import patch_bundle
    from kstrata.backends.patch import AsmPatch
    from kstrata.ir.triton_layout import write_override

    bundle = _one_bundle(bundle_path, kernel)
    asm_patch_file = AsmPatch.load(patch_path)
    with naming_user_files(otherwise=f"{patch_path} applied to {bundle.origin}"):  # the patched text is no file
        patched = patch_bundle(bundle, asm_patch_file)
    levels = [bundle.target.asm_level, bundle.target.binary_level]
    payload = patched.to_json()
    if patched.bundle.override_key:
        entry = write_override(patched.bundle, out_dir, levels=levels, overwrite=force)
        payload["override_entry"] = str(entry)
        payload["use"] = (f"TRITON_KERNEL_OVERRIDE=1 TRITON_OVERRIDE_DIR={out_dir} (with a fresh TRITON_CACHE_DIR "
                          "or TRITON_ALWAYS_COMPILE=1)")
    else:
        make_dir(out_dir, "--out directory")
        for lv in levels:
            art = patched.bundle.level(lv)
            (out_dir / f"{bundle.name}.{lv}").write_bytes(art if isinstance(art, bytes) else art.encode())
        payload["written"] = [str(out_dir / f"{bundle.name}.{lv}") for lv in levels]
        payload["note"] = "override key unknown (plain cache entry): files written without a Triton override key"
    report = out_dir / f"{bundle.name}.patch-report.json"
    report.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    if as_json:
        _emit_json(payload)
        return
    for h in patched.result.hunks:
        out.print(f"hunk {h.index}: applied at line {h.start_line} (-{h.removed} +{h.added})", highlight=False)
    for name, verdict in patched.checks.items():
        out.print(f"check {name}: {verdict}", highlight=False)
    before, after = patched.resources_before, patched.resources_after
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            out.print(f"  {key}: {before.get(key)} -> {after.get(key)}", highlight=False)
    out.print(f"written: {payload.get('override_entry') or out_dir}", highlight=False)


@asm_app.command("report")
def asm_report_cmd(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE", help="A cache or dump entry (or a root with --kernel)."),
    kernel: str = typer.Option(None, "--kernel", "-k"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Resources (registers, spills, shared/LDS, scratch, occupancy), instruction mix and ABI."""
    from kstrata.backends.asm import asm_report

    bundle = _one_bundle(bundle_path, kernel)
    with naming_user_files(bundle):
        report = asm_report(bundle)
    if as_json:
        _emit_json(report)
        return
    out.print(f"[bold]{bundle.name}[/] {bundle.target}", highlight=False)
    res = {k: v for k, v in report["resources"].items() if v is not None and k not in ("vendor", "source")}
    out.print("  resources: " + " ".join(f"{_RESOURCE_LABEL.get(k, k)}={v}" for k, v in res.items()), highlight=False)
    if "ptxas" in report:
        p = report["ptxas"]
        out.print(f"  ptxas: {p['registers']} registers, spill stores {p['spill_store_bytes']} B, "
                  f"spill loads {p['spill_load_bytes']} B, stack {p['stack_frame_bytes']} B", highlight=False)
    if "occupancy" in report:
        o = report["occupancy"]
        limit = ("every warp slot used" if o["limiter"] == "none"
                 else "limited by " + " and ".join(o["limiter"].split("+")))
        out.print(f"  occupancy: {o['warps_per_sm']} warps/SM ({o['fraction']:.0%}), {limit}", highlight=False)
    mix = report["instruction_mix"]
    cats = " ".join(f"{k}={v}" for k, v in mix["by_category"].items())
    out.print(f"  instructions: {mix['total']} ({cats})", highlight=False)
    for cat, widths in mix["widths"].items():
        if cat.startswith(("load", "store")):
            out.print(f"    {cat} by width: " + ", ".join(f"{w}b x{n}" for w, n in widths.items()), highlight=False)
    abi = report["abi"]
    out.print(f"  ABI: {len(abi['params'])} params, {abi['threads_per_block']} threads/block, "
              f"shared {abi['shared_bytes']} B at launch", highlight=False)
    out.print(f"  [dim]{_SHARED_NOTE[bundle.target.backend]}[/]", highlight=False)


# ---------------------------------------------------------------------------------------------------
# passes
# ---------------------------------------------------------------------------------------------------
@passes_app.command("list")
def passes_list(as_json: bool = typer.Option(False, "--json")) -> None:
    """Every registered pass (built-in and from the `kstrata.passes` entry-point group)."""
    from kstrata.passes.registry import available_passes, get_pass

    rows = [get_pass(name).describe() | {"source": target} for name, target in sorted(available_passes().items())]
    if as_json:
        _emit_json({"passes": rows})
        return
    table = Table(title=f"{len(rows)} passes")
    for col in ("name", "level", "backends", "exact", "summary"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["level"], ",".join(r["backends"]), "yes" if r["tolerance"] is None else r["tolerance"],
                      r["summary"])
    out.print(table)


@passes_app.command("show")
def passes_show(name: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")) -> None:
    """A pass's level, options, soundness conditions and documentation."""
    from kstrata.passes.registry import get_pass

    info = get_pass(name).describe()
    if as_json:
        _emit_json(info)
        return
    also = f" (also {', '.join(info['also_at'])})" if info.get("also_at") else ""
    out.print(f"[bold]{info['name']}[/]  level={info['level']}{also}  backends={','.join(info['backends'])}  "
              f"exact={'yes' if info['tolerance'] is None else info['tolerance']}", highlight=False)
    for opt, meta in info["options"].items():
        out.print(f"  option {opt}: {meta['type']} = {meta['default']!r}", highlight=False)
    out.print()
    out.print(info["doc"], highlight=False)


@passes_app.command("space")
def passes_space(
    path: Path = typer.Argument(..., help="An IR file (.ttir .ttgir .llir .ptx .amdgcn) or a cache/dump entry."),
    only: list[str] = typer.Option(None, "--only", help="Only this pass (repeatable)."),
    target: str = typer.Option(None, "--target", "-t", help="Target of a bare IR file (default: read from it)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Each pass's schedule space on one kernel: the instances worth trying there, or why there are none."""
    from kstrata.passes.registry import available_passes, get_pass
    from kstrata.passes.standalone import bundle_for_file

    bundle = bundle_for_file(path, target)
    names = sorted(available_passes())
    unknown = [n for n in only or [] if n not in names]
    if unknown:
        _fail(f"unknown pass {unknown[0]!r}; known passes: {', '.join(names)}", 2)
    rows: list[dict[str, Any]] = []
    for name in only or names:
        cls = get_pass(name)
        space = cls.schedule_space(bundle)
        rows.append({"pass": name, "level": cls.level, "candidates": space.spellings(), "reason": space.reason})
    if as_json:
        _emit_json({"kernel": bundle.name, "target": str(bundle.target), "passes": rows})
        return
    table = Table(title=f"schedule spaces on {bundle.name} ({bundle.target})")
    for col in ("pass", "level", "worth trying"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["pass"], r["level"], ", ".join(r["candidates"]) or f"none: {r['reason']}")
    out.print(table)


@passes_app.command("apply")
def passes_apply(
    path: Path = typer.Argument(..., help="An IR file (.ttir .ttgir .llir .ptx .amdgcn) or a cache/dump entry."),
    pipeline: str = typer.Option(..., "--pipeline", "-p"),
    target: str = typer.Option(None, "--target", "-t", help="Target of a bare IR file (default: read from it)."),
    output: Path = typer.Option(None, "--output", "-o", help="Write the result here instead of stdout."),
) -> None:
    """Run a pipeline's passes on one file and print the text of the last level it touched (no rebuild).

    This is the tool the golden (FileCheck) tests drive; `run-passes` is the one that rebuilds and writes
    overrides."""
    from kstrata.passes.pipeline import apply_passes, parse_pipeline
    from kstrata.passes.standalone import bundle_for_file

    if output is not None and output.is_dir():
        raise KstrataError("--output is a directory; give a file to write", path=output)
    bundle = bundle_for_file(path, target)
    with naming_user_files(bundle):
        outcome = apply_passes(bundle, parse_pipeline(pipeline))
    for line in outcome.messages():  # what each pass did or why it did nothing, never silent
        err.print(f"kstrata: {line}", highlight=False, markup=False, soft_wrap=True)
    text, updates, level = outcome.text, outcome.updates, outcome.level
    if not text:
        _fail(f"{path}: the pipeline ends at {level}, which this input does not have and no pass produced", 2)
    comment = ";" if level in ("llir", "amdgcn") else "//"
    header = "".join(f"{comment} kstrata: metadata {k}={v}\n" for k, v in sorted(updates.items()))
    text = header + text
    if output:
        tmp = output.with_name(output.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(output)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


@app.command("record", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def record_cmd(
    ctx: typer.Context,
    out_dir: Path = typer.Option(..., "--out", help="Directory for the launch records."),
    max_per_kernel: int = typer.Option(1, "--max-per-kernel", help="Launches recorded per kernel."),
    snapshots: bool = typer.Option(False, "--snapshots", help="Also save the inputs' contents (.npy)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run `-- CMD ...` and record its Triton kernel launches (kstrata.launch/1 files): plain `@triton.jit`
    launches and torch.compile (Inductor) ones; each record names its binary's cache and override keys."""
    from kstrata.tools.record import record_command, summarize

    command = list(ctx.args)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        _fail("no command to record: kstrata record --out DIR -- python my_program.py", code=2)
    rc, records = record_command(command, out_dir, max_per_kernel, snapshots)
    rows = summarize(records)
    if as_json:
        _emit_json({"returncode": rc, "records": rows})
    else:
        for r in rows:
            out.print(f"{r['kernel']:32s} {r['target']:12s} grid={r['grid']} args={r['args']} writes={r['written']}",
                      highlight=False)
        out.print(f"{len(rows)} launch records in {out_dir}; the program exited with {rc}", highlight=False)
    if rc != 0:
        raise typer.Exit(rc)


@app.command("verify")
def verify_cmd(
    original: Path = typer.Argument(..., help="The original kernel: a cache or dump entry, or a .ttir/.ttgir file."),
    candidate: Path = typer.Argument(..., help="The candidate: a cache, dump or override entry, or one IR file "
                                               "(.ttir .ttgir .llir .ptx .amdgcn) whose lower levels are rebuilt."),
    target: str = typer.Option(None, "--target", help="Target of an ORIGINAL .ttir file when neither the module nor "
                                                      "Triton's metadata JSON beside it names one (e.g. cuda:90)."),
    launch: Path = typer.Option(None, "--launch", help="A launch record (kstrata record) for the dynamic checks "
                                                       "(default: the launch kstrata knows, e.g. a suite kernel's)."),
    seeds: int = typer.Option(2, "--seeds", help="Random input sets per dynamic check (edge sets come on top)."),
    device: str = typer.Option("auto", "--device", help="cpu (static + interpreter), cuda (+ GPU runs) or auto."),
    tolerance: str = typer.Option(None, "--tolerance",
                                  help="Declared floating tolerance, e.g. 'ulp=2' or 'rtol=1e-5,atol=1e-6' "
                                       "(default: the candidate's kstrata-candidate.json, else bit-exact)."),
    sanitizer: str = typer.Option("auto", "--sanitizer", help="compute-sanitizer on one launch of the candidate: "
                                  "auto (memcheck where it exists), memcheck, racecheck, synccheck, initcheck or none."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds per dynamic run (a hang fails)."),
    static_only: bool = typer.Option(False, "--static-only", help="Accept static evidence explicitly: no dynamic "
                                     "run; the verdict stays 'unproven' but exits 0."),
    symbolic: bool = typer.Option(None, "--symbolic/--no-symbolic",
                                  help="Prove a TTIR/TTGIR candidate for every launch with z3, or find a "
                                       "counterexample the interpreter confirms, when the verdict would be "
                                       "unproven (default: on when no --launch is given)."),
    engine_cache: Path = typer.Option(None, "--engine-cache", help="The engine's cache, where verdicts are kept "
                                      "(default $KSTRATA_ENGINE_CACHE or ~/.cache/kstrata/engine)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Decide again: do not take a verdict from the cache."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Every equivalence check that applies to the levels in which CANDIDATE differs from ORIGINAL.

    Verdict and exit status: equivalent 0 (dynamic evidence, or identical code), different 1, unproven 3
    (only static checks ran, or a check could not run; 0 with --static-only), 2 for a file that cannot be used.
    The check goes through the candidate engine: a candidate with the same content, checked before with
    the same options and launch, gets its verdict from the engine's cache (an unproven verdict where a
    check could not run is never kept).
    """
    from rich.markup import escape

    from kstrata.tools.suite import load_suite, suite_names

    if "kstrata" in suite_names():
        from kstrata.backends.verify import register_launch_source

        def suite_launches(bundle: Any) -> None:
            # Loading the suite (it imports torch: about 1.5 s) registers the suite kernels' launches after
            # this source, where `known_launch` finds them next: only when a launch is looked for at all.
            load_suite()

        register_launch_source(suite_launches)
    from kstrata.agents.engine import Engine, VerifyOptions
    from kstrata.backends.verify import (
        Check,
        Verdict,
        VerifyReport,
        declared_tolerance,
        edited_levels,
        load_candidate,
        load_original,
    )
    from kstrata.ir.launch import LaunchRecord

    base = load_original(original, target)
    with naming_user_files(files={candidate.suffix.lstrip("."): str(candidate)} if candidate.is_file() else None,
                           otherwise=str(candidate)):
        cand = load_candidate(candidate, base)
    record = LaunchRecord.load(launch) if launch is not None else None
    colours = {"pass": "green", "fail": "red", "skipped": "yellow", "n/a": "dim"}

    def progress(check: Check) -> None:
        if not as_json:
            err.print(f"  [{colours[check.verdict]}]{check.verdict}[/] {check.level} {check.name}", highlight=False)

    del record  # loaded above for its errors (exit 2); the engine's check loads it again
    options = VerifyOptions(seeds=seeds, device=device, sanitizer=sanitizer, timeout=timeout, static_only=static_only,
                            symbolic=_symbolic_on(symbolic, launch))
    with Engine(engine_cache) as engine:
        original_digest = engine.add_bundle(base)
        built = engine.adopt(original_digest, cand, edited=edited_levels(candidate))
        checked = engine.check(original_digest, built, [launch] if launch is not None else [],
                               tolerance=tolerance or declared_tolerance(candidate), verify=options, on_check=progress,
                               use_cache=not no_cache)
    assert checked.report is not None
    report = VerifyReport.from_json(checked.report)
    if checked.cached and not as_json:
        err.print(f"  (verdict from the engine cache {engine.cache_dir}: this candidate was checked before with "
                  "these options; --no-cache decides again)", highlight=False, markup=False)
    if as_json:
        _emit_json(report.to_json())
    else:
        out.print(f"[bold]{report.kernel}[/] {report.target}: levels that differ: "
                  f"{', '.join(report.differing_levels) or 'none (identical code)'}", highlight=False)
        if report.rebuilt_levels:
            out.print(f"  rebuilt before checking: {', '.join(report.rebuilt_levels)}", highlight=False)
        if report.launch_source and report.launch_source != "the given launch record":
            out.print(f"  launch: {report.launch_source}", highlight=False)
        for c in report.checks:
            out.print(f"  [{colours[c.verdict]}]{c.verdict:7s}[/] {c.level:6s} {escape(c.name)}: {escape(c.detail)}",
                      highlight=False)
        for note in report.notes:
            out.print(f"  note: {note}", highlight=False, markup=False)
        v = report.verdict
        colour = {Verdict.EQUIVALENT: "green", Verdict.DIFFERENT: "red", Verdict.UNPROVEN: "yellow"}[v]
        out.print(f"verdict: [{colour}]{v.value}[/]" + ("" if v is not Verdict.UNPROVEN else
                  (" (static evidence accepted: --static-only)" if report.accepted else
                   f" — {escape('; '.join(report.unproven_reasons()))}")), highlight=False)
    if report.exit_code:
        raise typer.Exit(report.exit_code)


def _symbolic_on(flag: bool | None, launch: Path | None) -> bool:
    """`verify --symbolic`: on when asked for, or by default when no launch record is given."""
    on = flag if flag is not None else launch is None
    if on:
        from kstrata.backends.verify_symbolic import enable

        enable()
    return on


@app.command("run-passes")
def run_passes_cmd(
    cache_dir: Path = typer.Argument(..., help="A Triton cache root or dump directory (read only)."),
    pipeline: str = typer.Option(..., "--pipeline", "-p", help="e.g. 'llir(noalias-args{assume=true}),ptx(cache-hints)'."),
    out_dir: Path = typer.Option(..., "--out", help="Override directory to write (TRITON_OVERRIDE_DIR layout)."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Kernels processed in parallel."),
    dump_dir: Path = typer.Option(None, "--dump-dir", help="Triton dump directory of the same run (override keys)."),
    only: list[str] = typer.Option(None, "--only", help="Only these kernels, by name, with or without the `_kernel` "
                                                        "suffix, as `suite build --only` (repeatable)."),
    kernel: str = typer.Option(None, "--kernel", "-k", hidden=True,
                               help="Only entries with a file whose name contains this (use --only)."),
    engine_cache: Path = typer.Option(None, "--engine-cache", help="The engine's build cache (default "
                                                                   "$KSTRATA_ENGINE_CACHE or ~/.cache/kstrata/engine)."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds per kernel."),
    force: bool = typer.Option(False, "--force", help="Redo kernels already done by an earlier run."),
    launches: Path = typer.Option(None, "--launches", help="Launch records of the program (kstrata record --out DIR), "
                                                            "matched to kernels by cache key."),
    measure: bool = typer.Option(False, "--measure", help="Time each changed kernel with a launch record, original "
                                                          "vs rewritten binary (needs an NVIDIA GPU and --launches)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Apply a pass pipeline to every kernel of a Triton cache and write a Triton override directory."""
    from kstrata.agents.run_passes import measurement_unavailable, run_passes

    if measure and launches is None:
        _fail("--measure times kernels on replays of their recorded launches: add --launches DIR "
              "(kstrata record --out DIR -- CMD ...)", code=2)
    if measure:
        reason = measurement_unavailable("cuda")
        if reason:  # said up front, and again in the report
            err.print(f"[yellow]--measure: timing skipped[/]: {reason}", highlight=False)

    plain = not err.is_terminal  # piped or in a log: plain progress lines instead of a bar
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json or plain) as progress:
        task = progress.add_task("kernels", total=None)
        done = [0, 0]  # kernels finished, total
        started = time.monotonic()

        def begin(total: int) -> None:
            done[1] = total
            progress.update(task, total=total)
            if plain:
                err.print(f"run-passes: {total} kernels, pipeline {pipeline}", highlight=False, markup=False)

        def step(outcome: dict[str, Any]) -> None:
            progress.advance(task)
            done[0] += 1
            if plain:
                what = outcome["status"] + (" (engine cache)" if outcome.get("cached") else "")
                err.print(f"[{done[0]}/{done[1]}] {outcome['name']} {outcome.get('key', '')[:12]} {outcome['target']}: "
                          f"{what}  {time.monotonic() - started:.1f} s", highlight=False, markup=False)
            if not as_json and outcome["status"] == "failed":
                err.print(f"[red]FAIL[/] {escape(outcome['name'])} ({escape(outcome['entry'])}): "
                          f"{escape(str(outcome['error']))}", highlight=False)

        report = run_passes(cache_dir, pipeline, out_dir, jobs=jobs, timeout=timeout, force=force, on_kernel=step,
                            kernel_filter=kernel, only=only or (), dump_dir=dump_dir, launches=launches,
                            measure=measure, engine_cache=engine_cache, on_start=begin)
    if as_json:
        _emit_json(report.to_json())
    else:
        c = report.counts()
        out.print(f"{len(report.kernels)} kernels: {c['changed']} changed, {c['unchanged']} unchanged, "
                  f"{c['failed']} failed in {report.seconds:.1f} s", highlight=False)
        if report.measure is not None:
            out.print(report.measure_summary(), highlight=False)
        for k in report.kernels:
            if k.get("time_after_us") is not None:
                flag = f"  SUSPICIOUS: {'; '.join(k['suspicious'])}" if k.get("suspicious") else ""
                out.print(f"  {k['name']:40s} {k['time_before_us']:9.2f} -> {k['time_after_us']:9.2f} us  "
                          f"{k['speedup']:.3f}x{flag}", highlight=False)
        out.print(report.engine_summary(), highlight=False)
        if report.patched_cache:
            out.print(f"use: TRITON_CACHE_DIR={report.patched_cache} (a copy of the cache with the rewritten "
                      "kernels under their keys)", highlight=False)
        out.print(f"report: {out_dir / 'run-passes-report.md'}", highlight=False)
        roots = sorted({str(Path(k["override_entry"]).parent) for k in report.kernels if k.get("override_entry")})
        for root in roots:
            out.print(f"use: TRITON_KERNEL_OVERRIDE=1 TRITON_OVERRIDE_DIR={root} with a fresh TRITON_CACHE_DIR "
                      "(or TRITON_ALWAYS_COMPILE=1)", highlight=False)
    if report.counts()["failed"]:
        raise typer.Exit(1)


# ---------------------------------------------------------------------------------------------------
# doctor
# ---------------------------------------------------------------------------------------------------
@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Which tools and versions were found, whether a GPU is present, and what can run here."""
    from kstrata.tools.doctor import diagnose

    report = diagnose()
    if as_json:
        _emit_json(report)
    else:
        table = Table(title="kstrata doctor")
        for col in ("component", "status", "detail"):
            table.add_column(col)
        for row in report["components"]:
            table.add_row(row["name"], "[green]ok[/]" if row["ok"] else "[red]missing[/]", row["detail"])
        out.print(table)
        cap = Table(title="what can run here")
        cap.add_column("capability")
        cap.add_column("")
        cap.add_column("why")
        for row in report["capabilities"]:
            cap.add_row(row["name"], "[green]yes[/]" if row["ok"] else "[yellow]no[/]", row["why"])
        out.print(cap)
    if not report["ok"]:
        raise typer.Exit(1)


def main() -> None:
    """Entry point: run the app, turning kstrata's user errors into one line and exit code 2."""
    try:
        app()
    except KstrataError as exc:
        error_line(exc)
        sys.exit(2)


if __name__ == "__main__":
    main()
