"""Hot windows confine the assembly edits (`passes/window.py`): the `scope=lines:A-B[@DIGEST]` option, the
reorder and predication passes confined to it on real kernels (CPU-compiled PTX for cuda:90, AMDGCN for
gfx942), windows of another text refused, and the compiled-kernel optimizer handing a sampled window from
`hot_window()` to the atoms, the trials and the report (the profiler faked; its GPU twin at the end)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import pytest

from kstrata.agents.compiled.spaces import SampledWindow, kernel_spaces
from kstrata.passes.base import PassContext, PassError
from kstrata.passes.pipeline import parse_pipeline, run_stage
from kstrata.passes.window import LineWindow

from .conftest import has_cuda
from .test_asm_reorder import _amd_segments, check_reordering

#: layernorm_bwd_dx's PTX (cuda:90): its static hot window is the loop at lines 157-431; lines 41-98 are one
#: block of the prologue that a window of 45-90 cuts (measured on the suite's PTX; asserted below).
NAME = "layernorm_bwd_dx"


def _bundle(suite_cache: Path, name: str, target: str) -> Any:
    from kstrata.ir.triton_layout import load_cache_entry, read_index

    index = read_index(suite_cache)
    key = next(k for k, r in index.items() if r.get("suite_kernel") == name and r.get("target") == target)
    return load_cache_entry(suite_cache / key)


def _changed_lines(before: str, after: str) -> list[tuple[int, int]]:
    """The 1-based line ranges of `before` that `after` replaced (an insertion is an empty range)."""
    ops = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False).get_opcodes()
    return [(i1 + 1, i2) for tag, i1, i2, _, _ in ops if tag != "equal"]


def _inside(changed: list[tuple[int, int]], first: int, last: int) -> bool:
    return all(first <= a and b <= last for a, b in changed)


def test_the_scope_option_parses_prints_and_round_trips_through_the_engine() -> None:
    from kstrata.agents.engine import Candidate, PipelineEdit

    spec = ("ptx(ptx-reorder{strategy=sink-stores scope=lines:12-40@0123abcd},"
            "ptx-predicate{max_instructions=8 scope=lines:3-9})")
    pipeline = parse_pipeline(spec)
    assert pipeline.spelling() == spec and parse_pipeline(pipeline.spelling()) == pipeline
    reorder = pipeline.passes[0][1]
    assert LineWindow.parse(reorder.scope) == LineWindow(12, 40, "0123abcd")  # type: ignore[attr-defined]
    assert LineWindow(12, 40, "0123abcd").spelling() == "lines:12-40@0123abcd"
    cand = Candidate("b" * 64, "ptx", PipelineEdit(pipeline.spelling()))
    again = Candidate.from_json(json.loads(json.dumps(cand.to_json())))
    assert again.key == cand.key and parse_pipeline(again.edit.spec) == pipeline  # type: ignore[attr-defined]
    assert parse_pipeline("ptx(ptx-reorder{scope=hot})").spelling() == "ptx(ptx-reorder{strategy=hoist-loads scope=hot})"
    for bad, why in (("lines:40-12", "first line 40 is after its last 12"), ("lines:0-3", "expected hot, all, lines:A-B"),
                     ("lines:3", "expected hot"), ("lines:1-2@XYZ", "expected hot"), ("hot-ish", "expected hot")):
        with pytest.raises(PassError, match=why):
            parse_pipeline(f"amdgcn(amdgcn-reorder{{scope={bad}}})")
    from kstrata.passes.registry import get_pass

    assert get_pass("ptx-predicate").describe()["options"]["scope"]["type"].startswith("str: hot, all, lines:A-B")


def test_a_reorder_confined_to_lines_changes_nothing_outside_them(suite_cache: Path) -> None:
    from kstrata.backends.nvidia import PtxasOptions, assemble_ptx
    from kstrata.passes.ptx_sched import PtxReorder

    bundle = _bundle(suite_cache, NAME, "cuda:90")
    ptx = bundle.text("ptx")
    unconfined = PtxReorder(scope="all").apply(PassContext(bundle, "ptx")).text
    assert not _inside(_changed_lines(ptx, unconfined), 45, 90)  # the kernel-wide edit touches lines outside
    window = LineWindow.of_text(ptx, 45, 90)
    ctx = PassContext(bundle, "ptx")
    confined = PtxReorder(scope=window.spelling())
    assert confined.precondition(ctx) is None
    result = confined.apply(ctx)
    changed = _changed_lines(ptx, result.text)
    assert changed and _inside(changed, 45, 90), changed
    assert check_reordering(ptx, result.text) > 0  # a block cut by the window: its inside part reordered, soundly
    assert "of lines 45-90" in result.notes[0]
    assert assemble_ptx(result.text, PtxasOptions.from_bundle(bundle)).cubin[:4] == b"\x7fELF"
    hot = PtxReorder(scope="hot").apply(ctx).text  # the static window is the loop: nothing of 45-90 moves
    assert _inside(_changed_lines(ptx, hot), 157, 431)


def test_an_amdgcn_reorder_confined_to_lines_changes_nothing_outside_them(suite_cache: Path) -> None:
    from kstrata.passes.amdgcn_sched import AmdgcnReorder, regions, reorder_amdgcn

    bundle = _bundle(suite_cache, NAME, "hip:gfx942")
    text = bundle.text("amdgcn")
    everywhere = AmdgcnReorder(scope="all").apply(PassContext(bundle, "amdgcn")).text
    changed_all = _changed_lines(text, everywhere)
    # a window cutting a block where the kernel-wide edit moves something, leaving part of that edit outside
    # (gfx942 layernorm_bwd_dx: lines 96-165 of the block 95-165, where hoist-loads still moves 4)
    cuts = [(a, r.end + 1) for r in regions(text) for a in range(r.start + 1, r.end + 1)]
    first, last = next(c for c in cuts if not _inside(changed_all, *c) and reorder_amdgcn(text, "hoist-loads", *c).moved)
    result = AmdgcnReorder(scope=f"lines:{first}-{last}").apply(PassContext(bundle, "amdgcn"))
    changed = _changed_lines(text, result.text)
    assert changed and _inside(changed, first, last), (first, last, changed)
    assert check_reordering(text, result.text, _amd_segments) > 0


def test_a_window_of_another_text_is_refused_with_its_reason(suite_cache: Path) -> None:
    from kstrata.passes.ptx_predicate import PtxPredicate
    from kstrata.passes.ptx_sched import PtxReorder

    bundle = _bundle(suite_cache, NAME, "cuda:90")
    ptx = bundle.text("ptx")
    n = len(ptx.splitlines())
    ctx = PassContext(bundle, "ptx")
    past = PtxReorder(scope=f"lines:{n - 10}-{n + 50}")
    why = past.precondition(ctx)
    assert why is not None and f"past the ptx text's last line ({n})" in why
    with pytest.raises(PassError, match="past the ptx text's last line"):
        past.apply(ctx)  # never edits the lines that are there
    assert PtxPredicate(scope=f"lines:{n + 1}-{n + 9}").precondition(ctx) is not None
    # anchored to the text it was taken on: after cache-hints rewrote lines of the window, the reorder refuses
    window = LineWindow.of_text(ptx, 45, 90)
    stage = parse_pipeline(f"ptx(cache-hints{{loads=cs stores=none}},ptx-reorder{{scope={window.spelling()}}})").stages[0]
    assert "ld.global" in "\n".join(ptx.splitlines()[44:90])  # cache-hints does change the window's lines
    outcome = run_stage(bundle, stage)
    hints, reorder = outcome.records
    assert hints.status == "changed" and reorder.status == "skipped"
    assert "are not the window's" in reorder.reason and "the text changed since the window was taken" in reorder.reason
    # the same anchored window first in the stage applies
    first = run_stage(bundle, parse_pipeline(f"ptx(ptx-reorder{{scope={window.spelling()}}})").stages[0])
    assert first.records[0].status == "changed"


def test_kernel_spaces_given_a_sampled_window_emit_atoms_carrying_it(suite_cache: Path) -> None:
    from kstrata.passes.ptx_sched import PtxReorder

    bundle = _bundle(suite_cache, NAME, "cuda:90")
    ptx = bundle.text("ptx")
    static = {s.name: s for s in kernel_spaces(bundle, [], only=("ptx",))}["ptx"]
    hot = [a for a in static.atoms if a.pass_name == "ptx-reorder"]
    assert hot and all(a.spelling.endswith("scope=hot}") and a.window is not None and a.window.origin == "static"
                       and (a.window.first_line, a.window.last_line) == (157, 431) for a in hot)
    window = SampledWindow("ptx", LineWindow.of_text(ptx, 55, 71), "ncu sampling: 100% of the warp-stall samples")
    sampled = {s.name: s for s in kernel_spaces(bundle, [], only=("ptx",), window=window)}["ptx"]
    reorders = [a for a in sampled.atoms if a.pass_name == "ptx-reorder"]
    assert [a.spelling for a in reorders] == [f"ptx-reorder{{strategy=hoist-loads scope={window.lines.spelling()}}}"]
    (atom,) = reorders
    assert atom.window is not None and atom.window.origin == "sampled" and atom.window.source.startswith("ncu")
    assert (atom.window.first_line, atom.window.last_line) == (55, 71)
    assert "nothing to move in lines 55-71" in (PtxReorder(strategy="sink-stores", scope=window.lines.spelling())
                                                .precondition(PassContext(bundle, "ptx")) or "")  # no store there
    assert not any(a.spelling.endswith("scope=hot}") for a in sampled.atoms)  # in place of the static window
    assert sampled.to_json()["windows"] == [atom.window.to_json()]
    assert all(a.window is None for a in sampled.atoms if a.pass_name in ("cache-hints", "ld-nc"))  # kernel-wide


def test_the_predication_space_offers_a_sampled_window_beside_all(suite_cache: Path) -> None:
    from kstrata.passes.ptx_predicate import PtxPredicate

    bundle = _bundle(suite_cache, "matmul_fp16_bias_gelu_residual", "cuda:90")
    ptx = bundle.text("ptx")
    lines = ptx.splitlines()
    branches = [i + 1 for i, ln in enumerate(lines) if ln.strip().startswith("@") and " bra " in ln.replace("\t", " ")]
    lo, hi = branches[0] - 1, branches[len(branches) // 2]  # the first half of the branches
    window = LineWindow.of_text(ptx, lo, hi)
    space = PtxPredicate.schedule_space(bundle, window).spellings()
    assert "ptx-predicate{max_instructions=8 scope=all}" in space
    mine = [s for s in space if window.spelling() in s]
    assert mine, space
    instance = parse_pipeline(f"ptx({mine[0]})").passes[0][1]
    converted = instance._converted(ptx).converted  # type: ignore[attr-defined]
    assert converted and all(lo <= line <= hi for line, _ in converted)
    full = PtxPredicate(scope="all")._converted(ptx).converted
    assert len(converted) < len(full)


@pytest.mark.slow
def test_optimize_hands_a_sampled_window_from_the_profiler_to_the_atoms_and_the_report(
        suite_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`optimize_cache` on "a GPU" whose Nsight Compute is faked: the samples become the hot window before the
    search, the windowed atoms carry it, the trial that used it says so in the trajectory and the report."""
    import kstrata.agents.compiled.run as run
    import kstrata.agents.optimize.profile as profile
    import kstrata.backends.hotwindow as hotwindow

    from .test_compiled import _program

    cache, records = _program(suite_cache, tmp_path, NAME, "cuda:90")
    asked: list[list[str]] = []

    def fake_samples(ncu: str, command: list[str], kernel: str, timeout: float = 0) -> dict[int, float]:
        asked.append([ncu, kernel, *command])
        return {63: 900.0, 64: 100.0}  # the prologue block, not the static window's loop

    monkeypatch.setattr(profile, "find_ncu", lambda: "/fake/ncu")
    monkeypatch.setattr(hotwindow, "profile_ptx_samples", fake_samples)
    seen: list[Any] = []
    real_search = run.search_kernel

    def windowed_only(engine: Any, base: str, name: str, entry: str, target: str, record: Any, spaces: Any,
                      cfg: Any, **kw: Any) -> Any:  # the real search, on the windowed atoms only (one build)
        from kstrata.agents.compiled.spaces import Space

        seen.extend(spaces)
        kept = [Space(s.name, tuple(a for a in s.atoms if a.window is not None)) for s in spaces]
        return real_search(engine, base, name, entry, target, record, kept, cfg, **kw)

    monkeypatch.setattr(run, "search_kernel", windowed_only)
    report = run.optimize_cache(cache, records, tmp_path / "out", run.CompiledOptions(
        budget=1, device="cuda", spaces=("ptx",), engine_cache=str(tmp_path / "engine")))
    assert asked and asked[0][:2] == ["/fake/ncu", "layernorm_bwd_dx_kernel"]
    (kernel,) = report.kernels
    w = kernel["hot_window"]
    assert w["origin"] == "sampled" and (w["first_line"], w["last_line"]) == (55, 71) and "why_static" not in w
    assert w["source"].startswith("ncu sampling") and w["scope"].startswith("lines:55-71@")
    atoms = [a for s in seen for a in s.atoms if a.pass_name == "ptx-reorder"]
    assert [a.spelling for a in atoms] == [f"ptx-reorder{{strategy=hoist-loads scope={w['scope']}}}"]
    (trial,) = kernel["search"]["trials"]
    assert trial["pipeline"] == f"ptx({atoms[0].spelling})" and trial["status"] in ("unproven", "unchanged")
    assert trial["windows"] == [{"pass": "ptx-reorder", "level": "ptx", "scope": w["scope"], "lines": "55-71",
                                 "origin": "sampled", "source": w["source"]}]
    out = Path(report.out)
    (line,) = (out / "trajectory.jsonl").read_text().splitlines()
    assert json.loads(line)["windows"] == trial["windows"]
    md = (out / "optimize-compiled.md").read_text()
    assert "hot window (sampled): ptx lines 55-71" in md and "| ptx 55-71 (sampled) |" in md
    assert any("1 of the kernels searched here had one" in n for n in report.notes)


def test_without_a_gpu_the_static_window_stays_and_says_why(suite_cache: Path, tmp_path: Path) -> None:
    from kstrata.agents.compiled.program import ProgramKernel
    from kstrata.agents.compiled.run import hot_window
    from kstrata.ir.triton_layout import read_index

    from .conftest import copy_suite_subset

    cache = copy_suite_subset(suite_cache, tmp_path / "c", (NAME,), ("cuda:90",))
    key = next(iter(read_index(cache)))
    k = ProgramKernel(str(cache / key), key, "layernorm_bwd_dx_kernel", "cuda:90", record="/r.json")
    w = hot_window(k, "cpu")
    assert not w.sampled and w.for_spaces() is None and w.why_static == "no NVIDIA GPU here"
    assert w.to_json()["origin"] == "static" and (w.to_json()["first_line"], w.to_json()["last_line"]) == (157, 431)
    assert "scope" not in w.to_json()  # no window handed to the atoms: they keep scope=hot


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_on_a_gpu_ncu_samples_the_window_that_confines_the_reorder(suite_cache: Path, tmp_path: Path) -> None:
    """The GPU twin: real Nsight Compute samples give the window, and each windowed trial is gated by the
    differential run on the GPU (equivalent or an unchanged binary, never different)."""
    from kstrata.agents.compiled.run import CompiledOptions, optimize_cache
    from kstrata.agents.optimize.profile import find_ncu

    if find_ncu() is None:
        pytest.skip("Nsight Compute (ncu) is not installed")
    from .test_compiled import _program

    cache, records = _program(suite_cache, tmp_path, NAME, "cuda:90")
    report = optimize_cache(cache, records, tmp_path / "out", CompiledOptions(
        budget=8, device="cuda", spaces=("ptx",), engine_cache=str(tmp_path / "engine")))
    (kernel,) = report.kernels
    w = kernel["hot_window"]
    assert w["origin"] == "sampled", w  # ncu ran and mapped samples to PTX lines
    windowed = [t for t in kernel["search"]["trials"] if t["windows"]]
    assert all(u["origin"] == "sampled" and u["scope"] == w["scope"] for t in windowed for u in t["windows"])
    assert all(t["status"] in ("equivalent", "unchanged", "duplicate") for t in windowed), windowed


AMD_TWO_NESTS = """\
kern:
.Lfunc_begin0:
\tv_mov_b32_e32 v1, 0
.LBB0_1:                                ; =>This Inner Loop Header: Depth=1
\tv_add_f32_e32 v1, v1, v1
\tv_add_f32_e32 v2, v1, v1
\tv_add_f32_e32 v3, v1, v1
\tv_add_f32_e32 v4, v1, v1
\tv_add_f32_e32 v5, v1, v1
\tv_add_f32_e32 v6, v1, v1
\tv_add_f32_e32 v7, v1, v1
\ts_add_i32 s4, s4, 1
\ts_cmp_lg_u32 s4, s5
\ts_cbranch_scc1 .LBB0_1
.LBB0_2:                                ; =>This Loop Header: Depth=1
\ts_add_i32 s8, s8, 1
.LBB0_3:                                ;   Parent Loop BB0_2 Depth=1
                                        ; =>  This Inner Loop Header: Depth=2
\tv_fma_f32 v3, v2, v1, v3
\ts_cbranch_scc1 .LBB0_3
\ts_cbranch_scc1 .LBB0_2
\ts_endpgm
.Lfunc_end0:
"""


def test_the_amd_static_window_is_the_nest_of_the_most_trip_weighted_instructions() -> None:
    """Issue 14: "the loop with the most instructions weighted by trip count". The flat loop has 10
    instructions (weight 10 * 8 = 80); the nest has 4 (its own 2 at 8, the inner 2 at 8 * 8: 144) and wins;
    the inner loop alone (128) never does: the nest holds it."""
    from kstrata.backends.hotwindow import find_loops, static_hot_window

    loops = {lp.header: lp for lp in find_loops(AMD_TWO_NESTS, "amdgcn")}
    assert (loops[".LBB0_1"].instructions, loops[".LBB0_1"].weight) == (10, 80.0)
    assert (loops[".LBB0_2"].instructions, loops[".LBB0_2"].weight) == (4, 2 * 8 + 2 * 64)
    assert loops[".LBB0_3"].weight == 2 * 64 and loops[".LBB0_3"].depth == 2
    w = static_hot_window(AMD_TWO_NESTS, "amdgcn")
    assert w.header == ".LBB0_2" and (w.first_line, w.last_line) == (15, 21)
    assert w.source.startswith("static: the loop of the most instructions weighted by trip count")


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_on_a_gpu_a_reorder_confined_to_a_cut_block_is_equivalent_by_the_differential_run() -> None:
    """The GPU twin of the confined reorder: lines 45-90 of layernorm_bwd_dx (a block cut by the window)
    reordered, rebuilt and run against the original on identical launches."""
    from kstrata.backends.verify import Verdict, verify
    from kstrata.ir.target import Target
    from kstrata.passes.pipeline import run_pipeline
    from kstrata.tools.suite import load_suite

    suite = load_suite()
    original = suite.bundle_for(suite.get_kernel(NAME), Target.parse("cuda:90"))
    window = LineWindow.of_text(original.text("ptx"), 45, 90)
    outcome = run_pipeline(original, parse_pipeline(f"ptx(ptx-reorder{{scope={window.spelling()}}})"))
    assert outcome.changed, outcome.records[0].reason
    assert _inside(_changed_lines(original.text("ptx"), outcome.bundle.text("ptx")), 45, 90)
    report = verify(original, outcome.bundle, device="cuda", seeds=2, sanitizer="none")
    assert report.verdict is Verdict.EQUIVALENT, [(c.name, c.verdict, c.detail) for c in report.checks]


def test_a_sampled_window_edit_comes_first_in_its_stage() -> None:
    """Its lines are of the text as sampled: after cache-hints rewrote them the anchored window would refuse."""
    from kstrata.agents.compiled.spaces import Atom, WindowUse, pipeline_of

    hints = Atom("ptx", "ptx", "cache-hints", "cache-hints{loads=cs stores=none}")
    use = WindowUse("ptx", "lines:5-9@0123abcd", 5, 9, "sampled", "ncu sampling: 90%")
    reorder = Atom("ptx", "ptx", "ptx-reorder", "ptx-reorder{strategy=hoist-loads scope=lines:5-9@0123abcd}", window=use)
    static = Atom("ptx", "ptx", "ptx-reorder", "ptx-reorder{strategy=hoist-loads scope=hot}",
                  window=WindowUse("ptx", "hot", 5, 9, "static", "static"))
    assert pipeline_of([hints, reorder]) == f"ptx({reorder.spelling},{hints.spelling})"
    assert pipeline_of([hints, static]) == f"ptx({hints.spelling},{static.spelling})"  # the static one: as given


def test_ncu_is_not_run_again_after_it_gave_nothing_on_an_earlier_kernel(
        suite_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the H200 (2026-12-03) ncu gave no source-level samples on each of the 7 kernels it profiled in three models, each profile
    time lost to the searches: once it gave nothing, the run's later kernels keep the static window, saying why."""
    import kstrata.agents.optimize.profile as profile
    import kstrata.backends.hotwindow as hotwindow
    from kstrata.agents.compiled.program import ProgramKernel
    from kstrata.agents.compiled.run import hot_window
    from kstrata.ir.triton_layout import read_index

    from .conftest import copy_suite_subset

    cache = copy_suite_subset(suite_cache, tmp_path / "c", (NAME,), ("cuda:90",))
    key = next(iter(read_index(cache)))
    k = ProgramKernel(str(cache / key), key, "layernorm_bwd_dx_kernel", "cuda:90", record="/r.json")
    asked: list[str] = []

    def no_samples(ncu: str, command: list[str], kernel: str, timeout: float = 0) -> dict[int, float]:
        asked.append(kernel)
        return {}

    monkeypatch.setattr(profile, "find_ncu", lambda: "/fake/ncu")
    monkeypatch.setattr(hotwindow, "profile_ptx_samples", no_samples)
    first = hot_window(k, "cuda")
    assert asked == ["layernorm_bwd_dx_kernel"] and first.why_static == "ncu gave no source-level samples"
    later = hot_window(k, "cuda", ncu_failed=f"{first.why_static} on layernorm_bwd_dx_kernel")
    assert asked == ["layernorm_bwd_dx_kernel"] and not later.sampled
    assert later.why_static == "not profiled: ncu gave no source-level samples on layernorm_bwd_dx_kernel"
