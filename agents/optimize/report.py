"""The optimizer's reports: `OUT/<task>/report.md` with plots, and `OUT/summary.md` with geomeans.

Plots (matplotlib, PNG beside the report): speedup over time (every measured candidate and the
incumbent's step line), the roofline before/after (the best baseline and the output on the task's
roofline), and the search tree (nodes by depth, coloured by verdict). Without a GPU the speedup and roofline
plots say that nothing was timed. Degenerate tasks are listed apart and left out of the geomeans.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

from kstrata.agents.optimize.trajectory import write_atomic

COLORS = {"incumbent": "#2ca02c", "measured": "#1f77b4", "correct": "#17becf", "rejected": "#d62728",
          "pending": "#bbbbbb", "skipped": "#bbbbbb"}


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _fmt(x: float | None, spec: str = ".3f", scale: float = 1.0) -> str:
    return "—" if x is None else format(x * scale, spec)


def _plots(search: Any, out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    names = []
    nodes = [search.nodes[k] for k in search.order]
    # 1. speedup over time
    fig, ax = plt.subplots(figsize=(7, 3.6))
    measured = [n for n in nodes if n.speedup is not None and n.space != "baseline"]
    if measured:
        ax.scatter([n.elapsed_s for n in measured], [n.speedup for n in measured],
                   c=[COLORS.get(n.status, "#999") for n in measured], s=18, zorder=3)
        steps = [(0.0, 1.0)]
        for ev in search.events:
            if ev["type"] == "incumbent" and ev.get("speedup"):
                steps.append((ev["t"], ev["speedup"]))
        steps.append((search.elapsed(), steps[-1][1]))
        ax.step([s[0] for s in steps], [s[1] for s in steps], where="post", color=COLORS["incumbent"], label="incumbent")
        ax.axhline(1.0, color="black", lw=0.7)
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "nothing timed (no GPU)" if not search.ev.timed else "no candidate measured",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("seconds since the task started")
    ax.set_ylabel("speedup over the best baseline")
    ax.set_title(f"{search.info.name}: speedup over time")
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=100)
    plt.close(fig)
    names.append("speedup.png")
    # 2. roofline before/after
    fig, ax = plt.subplots(figsize=(6, 4))
    c = search.opts.ceilings
    spec = search.info.spec
    base, inc = search.nodes[search.base_key], search.incumbent
    if c is not None and base.timing and inc.timing and spec.arithmetic_intensity > 0:
        ai = spec.arithmetic_intensity
        grid = [ai * 10 ** (i / 20 - 2) for i in range(81)]
        rate = c.matmul_rate(spec.dtypes[0] if spec.dtypes else "float32", search.opts.policy)
        ax.plot(grid, [min(c.copy_bytes_per_s * x, rate) / 1e12 for x in grid], color="gray", lw=1, label="roof")
        for label, n, col in (("best baseline", base, "#ff7f0e"), ("output", inc, COLORS["incumbent"])):
            assert n.timing is not None
            ax.scatter([ai], [spec.flops / (n.timing.median_us * 1e-6) / 1e12], color=col, label=label, zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "nothing timed (no GPU)" if not search.ev.timed else "no roofline (no ceilings)",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("FLOP per minimum byte")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{search.info.name}: roofline before/after")
    fig.tight_layout()
    fig.savefig(out / "roofline.png", dpi=100)
    plt.close(fig)
    names.append("roofline.png")
    # 3. the search tree
    fig, ax = plt.subplots(figsize=(8, 4))
    pos: dict[str, tuple[float, float]] = {}
    by_depth: dict[int, int] = {}
    for n in nodes:
        i = by_depth.get(n.depth, 0)
        by_depth[n.depth] = i + 1
        pos[n.key] = (i, -n.depth)
    for n in nodes:
        p = n.candidate.parent
        if p in pos:
            ax.plot([pos[p][0], pos[n.key][0]], [pos[p][1], pos[n.key][1]], color="#999", lw=0.6, zorder=1)
    ax.scatter([pos[n.key][0] for n in nodes], [pos[n.key][1] for n in nodes],
               c=[COLORS.get(n.status, "#999") for n in nodes], s=30, zorder=2)
    for n in nodes:
        if n.status == "incumbent" or n.space == "baseline":
            ax.annotate(n.candidate.description[:28], pos[n.key], fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_yticks(sorted({-d for d in by_depth}), [str(d) for d in sorted(by_depth, reverse=True)])
    ax.set_ylabel("depth")
    ax.set_xticks([])
    ax.set_title(f"{search.info.name}: search tree (green incumbent, blue measured, cyan correct, red rejected)",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "tree.png", dpi=100)
    plt.close(fig)
    names.append("tree.png")
    return names


def render_task_report(search: Any, result: Any, plots: list[str]) -> str:
    info, opts = search.info, search.opts
    inc, base = search.incumbent, search.nodes[search.base_key]
    lines = [f"# kstrata optimize: {info.name}", "",
             f"Task `{info.path}` (sha256 {info.spec.sha256[:12]}); device {opts.device}; precision policy "
             f"**{opts.policy}**" + ("" if opts.policy == "strict" else
                                    " (lower precision admitted because it was asked for; checked with KernelBench's "
                                    "tolerances)") + ".", ""]
    if not search.ev.timed:
        lines += ["**Nothing was timed** (no GPU): every candidate was checked for correctness only (Triton kernels run "
                  "under Triton's interpreter), and the output is the eager baseline.", ""]
    lines += ["## Result", ""]
    if search.ev.timed:
        if inc.key == base.key:
            lines.append(f"Nothing beat the best baseline: `model_new.py` **is** that baseline ({base.candidate.description}).")
        else:
            lines.append(f"`model_new.py`: {inc.candidate.description} (space {inc.space}, proposer {inc.candidate.proposer}), "
                         f"**{_fmt(inc.speedup)}x** over the best baseline ({base.candidate.description}), interleaved medians.")
        lines.append(f"%SOL before {_fmt(result.sol_before, '.1f', 100)}, after {_fmt(result.sol_after, '.1f', 100)}.")
        conf = search.confirmation or {}
        if conf.get("reason"):
            lines.append(f"Confirmation against the best baseline at the end (a fresh process, nothing else running): "
                         f"{conf['reason']}" + ("; the output fell back to that baseline." if conf.get("verdict") == "slower"
                                                 else "."))
        for g in (e for e in search.events if e.get("type") == "guard" and e.get("quiet")):
            n = search.nodes.get(str(g.get("key")))
            what = n.candidate.description if n is not None else g.get("key")
            if "ratio" in g:
                lines.append(f"Guard taken again after the search (its first was within the noise): {what}: "
                             f"{g['ratio']:.3f}x vs the incumbent, noise {100 * g['noise']:.1f}%, "
                             + ("accepted." if g.get("accepted") else "kept the incumbent."))
            else:
                lines.append(f"Deferred guard of {what} (its first was within the noise): {g.get('reason', '')}.")
    final = search.final or {}
    lines += [f"Final re-evaluation in fresh processes (seed {final.get('seed')}): "
              f"{'ACCEPTED' if final.get('accepted') else 'REJECTED'} — {final.get('reason', '')}" +
              (f"; {final['speedup_vs_eager']:.3f}x over eager in that run" if final.get("speedup_vs_eager") else ""), ""]
    if result.note:
        lines += [f"Note: {result.note}.", ""]
    if final.get("fallback_from"):
        lines += [f"The search's incumbent `{final['fallback_from']}` failed the final re-evaluation; the output fell back "
                  "to the best baseline.", ""]
    lines += [f"Stopped: {search.stop_reason}. {result.candidates} candidates judged beyond the baselines in "
              f"{search.elapsed():.0f} s.", ""]
    if result.degenerate:
        lines += ["## Degenerate task", "", "Left out of suite geomeans: " + "; ".join(result.degenerate_reasons) + ".", ""]
    if search.contract:
        lines += ["## Contract", ""] + [f"- {ln}" for ln in search.contract.lines()] + [""]
    lines += ["## Baselines", "", "| baseline | status | median µs | speedup vs best | note |", "|---|---|---:|---:|---|"]
    for b, n in search.baselines.items():
        lines.append(f"| {b} | {n.status} | {_fmt(n.timing.median_us if n.timing else None, '.1f')} | {_fmt(n.speedup)} | "
                     f"{n.note.replace('|', '/')[:100]} |")
    if search.notes.get("baselines"):
        lines += ["", search.notes["baselines"]]
    lines += ["", "## Findings", ""]
    lines += [f"- **{f.kind}** ({f.analyzer}): {f.text}" for f in search.findings] or ["- none"]
    evn = search.evidence_json
    for key in ("profile_note", "ncu_note", "sass_note"):
        if evn.get(key):
            lines.append(f"- note: {evn[key]}")
    prof = evn.get("profile") or {}
    if prof.get("kernels"):
        lines += ["", "Top kernels of the incumbent (torch.profiler):", "", "| kernel | share | µs/call | launches/call |",
                  "|---|---:|---:|---:|"]
        for k in prof["kernels"][:8]:
            lines.append(f"| `{k['name'][:70]}` | {100 * k['share']:.1f}% | {k['time_us_per_call']:.1f} | "
                         f"{k['launches_per_call']:.1f} |")
    if search.plan:
        lines += ["", "## Plan", "", "| space | score | why |", "|---|---:|---|"]
        lines += [f"| {s.space} | {s.score:.3f} | {s.reason} |" for s in search.plan.order]
        lines += [f"| {s.space} | skipped | {s.reason} |" for s in search.plan.skipped]
        if search.pruned:
            lines += [""] + [f"- pruned {s}: {why}" for s, why in search.pruned.items()]
    notes = {k: v for k, v in search.notes.items() if k != "baselines"}
    if notes:
        made: dict[str, int] = {}
        for n in search.nodes.values():
            made[n.candidate.proposer] = made.get(n.candidate.proposer, 0) + 1
        lines += ["", "Proposer notes (why a proposer had nothing, on the parent it was last asked about):", ""]
        lines += [f"- {k}: {v}" + (f" (it proposed {made[k]} candidate{'s' if made[k] != 1 else ''} on other parents)"
                                   if made.get(k) else "") for k, v in notes.items()]
    lines += ["", "## Candidates", "", "| # | space | proposer | edit | status | speedup | %SOL | note |",
              "|---:|---|---|---|---|---:|---:|---|"]
    for k in search.order:
        n = search.nodes[k]
        lines.append(f"| {n.index} | {n.space} | {n.candidate.proposer} | {n.candidate.description[:70].replace('|', '/')} | "
                     f"{n.status} | {_fmt(n.speedup)} | {_fmt(n.sol_fraction, '.1f', 100)} | {n.note[:80].replace('|', '/')} |")
    ir_rows = [(n, k) for key in search.order for n in [search.nodes[key]] if n.space == "ir"
               for k in n.candidate.params.get("kernels", [])]
    if ir_rows:  # the edit column cuts an ir candidate's kernel, pipeline and kernel-level verdict off
        lines += ["", "## ir space: kernel rewrites", "", "| # | kernel | pipeline | kernel verdict | kernel speedup "
                  "(its launch record) | task status | task speedup |", "|---:|---|---|---|---:|---|---:|"]
        lines += [f"| {n.index} | `{k.get('name')}` | `{k.get('pipeline')}` | {k.get('verdict')} | "
                  f"{_fmt(k.get('speedup'))} | {n.status} | {_fmt(n.speedup)} |" for n, k in ir_rows]
    if search.memory.conclusions:
        lines += ["", "## Search memory (conclusions shared by the workers)", ""]
        lines += [f"- {c.text()}" for c in search.memory.conclusions]
    lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


_PLOT_LOCK = threading.Lock()  # pyplot is not thread-safe; tasks of a directory may finish together


def write_task_report(search: Any, result: Any) -> None:
    with _PLOT_LOCK:
        plots = _plots(search, search.out)
    write_atomic(search.out / "report.md", render_task_report(search, result, plots))


def write_summary(out: Path, results: list[Any], opts: Any) -> None:
    done = [r for r in results if r.status == "done"]
    counted = [r for r in done if not r.degenerate]
    g = geomean([r.speedup for r in counted if r.speedup])
    g_eager = geomean([r.speedup_vs_eager for r in counted if r.speedup_vs_eager])
    lines = ["# kstrata optimize: summary", "", f"{len(results)} tasks, device {opts.device}, policy {opts.policy}, "
             f"budget {opts.budget} candidates / {opts.minutes:g} min per task.", ""]
    if not opts.device == "cuda":
        lines += ["**Nothing was timed** (no GPU): correctness only.", ""]
    lines += [f"Geomean speedup over the best baseline: {_fmt(g)} (over {len([r for r in counted if r.speedup])} "
              f"non-degenerate tasks); over eager (final fresh evaluation): {_fmt(g_eager)}.", "",
              "| task | status | incumbent baseline | chosen space | speedup | vs eager | %SOL before | %SOL after | "
              "findings | candidates | s | final |", "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r.task}{' (degenerate)' if r.degenerate else ''} | {r.status} | {r.incumbent_baseline} | "
                     f"{r.chosen_space} | {_fmt(r.speedup)} | {_fmt(r.speedup_vs_eager)} | {_fmt(r.sol_before, '.1f', 100)} | "
                     f"{_fmt(r.sol_after, '.1f', 100)} | {', '.join(r.findings)} | {r.candidates} | {r.seconds:.0f} | "
                     f"{'ok' if r.final_ok else (r.error or r.final_reason)[:60]} |")
    deg = [r for r in done if r.degenerate]
    if deg:
        lines += ["", "## Degenerate tasks (left out of the geomeans)", ""]
        lines += [f"- {r.task}: {'; '.join(r.degenerate_reasons)}" for r in deg]
    write_atomic(out / "summary.md", "\n".join(lines) + "\n")
