"""The pass framework: registry, spelling, pipeline syntax and errors, preconditions, verification with
reproducers, rebuilds, the entry-point plugin group, and `kstrata run-passes`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kstrata.agents.run_passes import run_passes
from kstrata.ir.bundle import KernelBundle
from kstrata.ir.candidate import CandidateInfo
from kstrata.ir.target import Target
from kstrata.ir.triton_layout import compile_jit, load_cache_root, update_index
from kstrata.passes.base import KernelPass, PassContext, PassResult, option_specs
from kstrata.passes.pipeline import (
    PassFailure,
    Pipeline,
    PipelineStage,
    PipelineSyntaxError,
    parse_pipeline,
    run_pipeline,
)
from kstrata.passes.registry import BUILTIN_PASSES, available_passes, get_pass
from kstrata.testsuite.kernels import get_kernel
from kstrata.testsuite.kernels.build import bundle_for, specialization

from .conftest import copy_suite_subset

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "kstrata_demo_plugin"


def test_registry_keys_are_pass_names_and_the_catalogue_spans_four_levels() -> None:
    levels = set()
    for name in BUILTIN_PASSES:
        cls = get_pass(name)
        assert cls.name == name
        assert (cls.__doc__ and "Sound" in cls.__doc__) or "sound" in (cls.__doc__ or "")
        levels.add(cls.level)
    assert len(BUILTIN_PASSES) >= 10 and len(levels) >= 4


@pytest.mark.parametrize("name", sorted(BUILTIN_PASSES))
def test_spelling_round_trips(name: str) -> None:
    cls = get_pass(name)
    default = cls()
    changed = default
    for spec in option_specs(cls):  # every option moved off its default to another valid value
        others = [v for v in (spec.domain() or ()) if v != spec.default]
        if not others and spec.range is not None:
            others = [type(spec.default)(spec.range[1])]
        if not others and spec.pattern is not None:
            others = [spec.pattern.example]  # a text option with a grammar: a valid value off the default
        if not others and spec.base is str:
            others = ["--a value, with {braces} and \"quotes\""]
        if others:
            changed = dataclasses.replace(changed, **{spec.name: others[0]})
    for instance in (default, changed):
        pipeline = parse_pipeline(f"{cls.level}({instance.spelling()})")
        assert pipeline.passes == [(cls.level, instance)]
        assert parse_pipeline(pipeline.spelling()) == pipeline
        # every option is spelled out, defaults included (a dropped default reads as another pipeline)
        assert all(f"{s.name}=" in instance.spelling() for s in option_specs(cls))


@pytest.mark.parametrize(("spec", "message"), [
    ("ttir(load-eviction{policy=bogus})", "option policy=bogus is not valid: expected one of evict_first, evict_last"),
    ("ttgir(num-warps{n=3})", "option n=3 is not valid: expected one of 1, 2, 4, 8, 16, 32"),
    ("ttgir(num-stages{n=9})", "option n=9 is not valid: expected int in 1..8"),
    ("ptx(ld-nc{assume_noalias=maybe})", "option assume_noalias='maybe' is not a valid bool"),
    ("ptx(cache-hints{loads=wb})", "expected one of ca, cg, cs, lu, cv, none"),
])
def test_options_are_checked_against_their_types(spec: str, message: str) -> None:
    with pytest.raises(PipelineSyntaxError) as info:
        parse_pipeline(spec)
    assert message in str(info.value) and "\n" not in str(info.value)  # one line


def test_options_are_checked_when_a_pass_is_constructed() -> None:
    from kstrata.passes.base import PassError

    with pytest.raises(PassError, match="expected one of evict_first"):
        get_pass("load-eviction")(policy="bogus")  # type: ignore[call-arg]
    with pytest.raises(PassError, match=r"expected int in 16\.\.255"):
        get_pass("max-registers")(n=8)  # type: ignore[call-arg]
    with pytest.raises(PassError, match="option n=true is not valid"):
        get_pass("num-stages")(n=True)  # type: ignore[call-arg]
    assert get_pass("num-stages")(n=4).spelling() == "num-stages{n=4}"  # type: ignore[call-arg]


@pytest.mark.parametrize(("spec", "printed"), [
    ("ttgir(num-stages{n=4})", "ttgir(num-stages{n=4})"),  # a default value stays written
    ("ttgir(num-stages)", "ttgir(num-stages{n=4})"),
    ("ttir(load-eviction)", "ttir(load-eviction{policy=evict_first})"),
    ("ptx(ptxas-options{extra=\"-O3 --foo\"})", "ptx(ptxas-options{opt_level=3 extra=\"-O3 --foo\"})"),
    ("llir(flush-denormals)", "llir(flush-denormals)"),
])
def test_pipelines_print_every_option_value(spec: str, printed: str) -> None:
    assert parse_pipeline(spec).spelling() == printed
    assert parse_pipeline(printed) == parse_pipeline(spec)


@pytest.mark.parametrize(("spec", "column", "message"), [
    ("ttir(", 6, "expected ')'"),
    ("tir(cache-hints)", 1, "unknown level 'tir'"),
    ("ptx(no-such-pass)", 5, "unknown pass 'no-such-pass'"),
    ("ptx(cache-hints{colour=red})", 5, "has no option 'colour'"),
    ("ptx(max-registers{n=many})", 5, "not a valid int"),
    ("llir(cache-hints)", 6, "works at ptx, not llir"),
    ("ptx(cache-hints),llir(noalias-args)", 18, "comes after a lower level"),
    ("", 1, "empty pipeline"),
])
def test_pipeline_errors_point_at_the_column(spec: str, column: int, message: str) -> None:
    with pytest.raises(PipelineSyntaxError) as info:
        parse_pipeline(spec)
    assert f"pipeline:1:{column}:" in str(info.value) and message in str(info.value)


@pytest.fixture(scope="module")
def softmax() -> KernelBundle:
    return bundle_for(get_kernel("softmax_online"), Target.parse("cuda:90"))


def test_precondition_that_does_not_hold_changes_nothing_and_says_why(softmax: KernelBundle) -> None:
    outcome = run_pipeline(softmax, parse_pipeline("llir(noalias-args),ptx(ld-nc)"))
    assert not outcome.changed and outcome.bundle.levels == softmax.levels
    assert [r.status for r in outcome.records] == ["skipped", "skipped"]
    assert "overlap" in outcome.records[0].reason and "overlap" in outcome.records[1].reason


IN_PLACE_PTX = """.version 8.7
.target sm_90a
.address_size 64

.visible .entry k(
\t.param .u64 .ptr .global .align 1 k_param_0,
\t.param .u32 k_param_1
)
.reqntid 128
{
\t.reg .b32 \t%r<4>;
\t.reg .b64 \t%rd<4>;
\tld.param.b64 \t%rd1, [k_param_0];
\tld.param.b32 \t%r1, [k_param_1];
\tmul.wide.s32 \t%rd2, %r1, 4;
\tadd.s64 \t%rd3, %rd1, %rd2;
\tld.global.b32 \t%r2, [%rd3];
\tadd.s32 \t%r3, %r2, 1;
\tst.global.b32 \t[%rd3], %r3;
\tret;
}
"""


def test_ld_nc_refuses_a_kernel_that_reads_what_it_writes() -> None:
    from kstrata.passes.pipeline import apply_passes_only

    in_place = KernelBundle("k", Target.parse("cuda:90"), {"ptx": IN_PLACE_PTX}, {"name": "k"})
    pipeline = parse_pipeline("ptx(ld-nc{assume_noalias=true})")
    why = get_pass("ld-nc")(assume_noalias=True).precondition(PassContext(in_place, "ptx"))
    assert why == "the kernel writes through k_param_0, which it also loads from"
    assert apply_passes_only(in_place, pipeline)[0] == IN_PLACE_PTX
    # the same kernel writing elsewhere is accepted: the size parameter feeding both addresses does not count
    elsewhere = IN_PLACE_PTX.replace("st.global.b32 \t[%rd3]", "st.global.b32 \t[%rd2]")
    other = KernelBundle("k", Target.parse("cuda:90"), {"ptx": elsewhere}, {"name": "k"})
    assert "ld.global.nc.b32" in apply_passes_only(other, pipeline)[0]
    # a load with an L2 cache policy ends with the policy register, not the address: still seen as in place
    # (found on the H200, where an Inductor softmax rewritten this way wrote different bytes)
    policy = IN_PLACE_PTX.replace("%rd<4>", "%rd<5>").replace(
        "\tld.global.b32 \t%r2, [%rd3];",
        "\tcreatepolicy.fractional.L2::evict_last.b64 \t%rd4, 1.0;\n"
        "\tld.global.L1::evict_last.L2::cache_hint.b32 \t%r2, [%rd3], %rd4;")
    assert "L2::cache_hint" in policy
    hinted = KernelBundle("k", Target.parse("cuda:90"), {"ptx": policy}, {"name": "k"})
    why = get_pass("ld-nc")(assume_noalias=True).precondition(PassContext(hinted, "ptx"))
    assert why == "the kernel writes through k_param_0, which it also loads from"
    # a load whose address the analysis cannot trace to a parameter is not assumed read-only
    untraced = elsewhere.replace("%rd<4>", "%rd<10>").replace("ld.global.b32 \t%r2, [%rd3];",
                                                              "ld.global.b32 \t%r2, [%rd9];")
    opaque = KernelBundle("k", Target.parse("cuda:90"), {"ptx": untraced}, {"name": "k"})
    why = get_pass("ld-nc")(assume_noalias=True).precondition(PassContext(opaque, "ptx"))
    assert why is not None and why.startswith("cannot tell which parameter the load at PTX line")


def test_pass_on_another_backend_is_skipped(softmax: KernelBundle) -> None:
    outcome = run_pipeline(softmax, parse_pipeline("amdgcn(nontemporal-hints)"))
    assert outcome.records[0].status == "skipped" and "cuda:90 has no amdgcn" in outcome.records[0].reason


def test_pipeline_rebuilds_the_levels_below(softmax: KernelBundle) -> None:
    outcome = run_pipeline(softmax, parse_pipeline("llir(noalias-args{assume=true}),ptx(cache-hints)"))
    assert outcome.first_changed == "llir"
    assert [r.status for r in outcome.records] == ["changed", "changed"]
    new = outcome.bundle
    assert "noalias" in new.text("llir") and "ld.global.cs" in new.text("ptx")
    assert new.level("cubin") != softmax.level("cubin")
    assert new.text("ttgir") == softmax.text("ttgir")


def test_option_pass_rebuilds_with_the_new_launch_options(softmax: KernelBundle) -> None:
    outcome = run_pipeline(softmax, parse_pipeline("ttgir(num-warps{n=8})"))
    new = outcome.bundle
    assert new.num_warps == 8 and '"ttg.num-warps" = 8' in new.text("ttgir")
    assert new.abi().threads_per_block == 256 and ".reqntid 256" in new.text("ptx")


@dataclasses.dataclass(frozen=True)
class _BreaksPtx(KernelPass):
    """Writes PTX that does not parse (for the reproducer test)."""

    name = "breaks-ptx"
    level = "ptx"

    def apply(self, ctx: PassContext) -> PassResult:
        return PassResult(ctx.text.replace(".reqntid", ".reqntid 1,"))


def test_failing_pass_writes_a_reproducer(softmax: KernelBundle, tmp_path: Path) -> None:
    pipeline = Pipeline((PipelineStage("ptx", (_BreaksPtx(),)),))
    with pytest.raises(PassFailure) as info:
        run_pipeline(softmax, pipeline, tmp_path)
    repro = Path(info.value.repro or "")
    assert repro.is_dir() and (repro / "before.ptx").read_text() == softmax.text("ptx")
    assert "breaks-ptx" in (repro / "pipeline.txt").read_text()
    assert json.loads((repro / "pass.json").read_text())["kernel"] == softmax.name
    assert "launch ABI changed: reqntid" in (repro / "error.txt").read_text()


def test_plugin_pass_from_an_entry_point(tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(site), str(PLUGIN)], check=True, capture_output=True, timeout=300)
    code = ("from kstrata.passes.registry import get_pass, available_passes; "
            "from kstrata.passes.pipeline import parse_pipeline; "
            "p = parse_pipeline('ptx(ptx-comment{text=hi})'); print(p.spelling(), available_passes()['ptx-comment'])")
    env = {**os.environ, "PYTHONPATH": str(site) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ptx(ptx-comment{text=hi})", "kstrata_demo_plugin.passes:PtxComment"]
    assert "ptx-comment" not in available_passes()  # not installed in this process


# -- run-passes ------------------------------------------------------------------------------------------
def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def small_cache(suite_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_suite_subset(suite_cache, tmp_path_factory.mktemp("small-cache"),
                             ("vector_add", "softmax_online", "matmul_fp16"))


def test_run_passes_end_to_end(small_cache: Path, tmp_path: Path) -> None:
    before = _tree(small_cache)
    out = tmp_path / "out"
    spec = "llir(noalias-args{assume=true}),ptx(cache-hints),amdgcn(nontemporal-hints)"
    report = run_passes(small_cache, spec, out, jobs=2)
    assert _tree(small_cache) == before  # never writes into the cache it reads
    assert report.counts() == {"changed": 6, "unchanged": 0, "failed": 0}
    for k in report.kernels:
        entry = Path(k["override_entry"])
        assert entry.parent.name == ("cuda-90" if k["target"] == "cuda:90" else "hip-gfx942")
        binary = "cubin" if k["target"] == "cuda:90" else "hsaco"
        assert {f.suffix for f in entry.iterdir()} == {".llir", f".{'ptx' if binary == 'cubin' else 'amdgcn'}",
                                                       f".{binary}", ".json"}
        info = CandidateInfo.read(entry)  # what the files do not say: the pipeline, tolerance, metadata
        # the pipeline with every option's value spelled out (defaults included), as a reader needs it
        assert info is not None and info.tolerance is None and info.metadata == {}
        assert info.pipeline == ("llir(noalias-args{assume=true}),ptx(cache-hints{loads=cs stores=cs}),"
                                 "amdgcn(nontemporal-hints{stores=true loads=false})")
        assert k["checks"]["signature"] == "unchanged" and k["resources_after"]["registers"] > 0
    data = json.loads((out / "run-passes-report.json").read_text())
    assert data["counts"]["changed"] == 6 and "| vector_add_kernel |" in (out / "run-passes-report.md").read_text()
    # resumable: a second run reads the recorded outcomes instead of working again
    again = run_passes(small_cache, spec, out, jobs=2)
    assert again.kernels == report.kernels and again.seconds < report.seconds


def test_run_passes_refuses_to_write_into_the_cache(small_cache: Path) -> None:
    from kstrata.ir.errors import KstrataError

    with pytest.raises(KstrataError, match="must not be inside the cache"):
        run_passes(small_cache, "ptx(cache-hints)", small_cache / "out")


def test_failed_kernel_is_reported_and_the_run_goes_on(small_cache: Path, tmp_path: Path) -> None:
    report = run_passes(small_cache, "ttir(dot-precision{precision=ieee})", tmp_path / "o")
    assert report.counts()["changed"] == 0
    assert all(p["status"] == "skipped" and "no tt.dot on fp32" in p["reason"] for k in report.kernels for p in k["passes"])


def test_override_key_collisions_are_refused(tmp_path: Path) -> None:
    kernel = get_kernel("vector_add")
    sig, constexprs, attrs = specialization(kernel)
    cache = tmp_path / "cache"
    records = {}
    for warps in (4, 8):  # two variants of one kernel: Triton gives them one override key
        b = compile_jit(kernel.fn, sig, "cuda:90", constexprs, attrs, {"num_warps": warps}, cache_dir=cache)
        records[Path(b.origin or "").name] = {"override_key": b.override_key, "name": b.name, "target": "cuda:90"}
    update_index(cache, records)
    report = run_passes(cache, "ptx(cache-hints)", tmp_path / "out")
    # no override (it would apply to both variants), but each variant keeps its cache key in the patched cache
    assert report.counts()["changed"] == 2
    assert all("override key collision" in k["note"] and k["override_entry"] is None for k in report.kernels)
    assert not any((tmp_path / "out" / "cuda-90").glob("*/*.ptx"))
    assert report.patched_cache and all(Path(k["patched_entry"]).parent == Path(report.patched_cache)
                                        for k in report.kernels)
    assert {k["launch_options"]["num_warps"] for k in report.kernels} == {4, 8}  # the rows tell them apart


def test_run_passes_cli(small_cache: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "run-passes", str(small_cache), "--pipeline",
                           "ptx(cache-hints)", "--out", str(tmp_path / "o"), "--json", "--only", "vector_add"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["counts"] == {"changed": 1, "unchanged": 1, "failed": 0}  # the hip vector_add has no PTX
    # not a terminal: plain progress lines with the total, each naming the kernel and its entry key
    progress = [ln for ln in proc.stderr.splitlines() if ln.startswith("[")]
    assert progress[0].startswith("[1/2] vector_add_kernel ") and progress[-1].startswith("[2/2] ")
    assert {k["key"][:12] for k in data["kernels"]} == {ln.split()[2] for ln in progress}
    bad = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "run-passes", str(small_cache), "--pipeline",
                          "ptx(cache-hints", "--out", str(tmp_path / "o2")], capture_output=True, text=True, timeout=120,
                         check=False)
    assert bad.returncode == 2 and "pipeline:1:" in bad.stderr and "Traceback" not in bad.stderr
    listed = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "passes", "list", "--json"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert {p["name"] for p in json.loads(listed.stdout)["passes"]} >= set(BUILTIN_PASSES)


def test_every_pass_fires_on_the_suite(suite_cache: Path) -> None:
    """Each built-in pass changes at least one suite kernel's code (with the options it needs)."""
    from kstrata.testsuite.kernels.broadcast_rows import BROADCAST_ROWS
    from kstrata.testsuite.kernels.matmul_rowmajor import ROWMAJOR_MATMULS

    bundles, _ = load_cache_root(suite_cache)
    # the suite's GEMMs already group their program ids; grouped-pid's input is the row-major one
    bundles.append(bundle_for(ROWMAJOR_MATMULS["matmul_rowmajor_fp16"], Target.parse("cuda:90")))
    # interleaved-pid's: a kernel whose loads repeat with the program id (a LayerNorm's affine step)
    bundles.append(bundle_for(BROADCAST_ROWS["norm_apply_rows"], Target.parse("cuda:90")))
    options = {"ld-nc": "{assume_noalias=true}", "noalias-args": "{assume=true}", "ptxas-options": "{opt_level=1}",
               "max-registers": "{n=64}", "num-warps": "{n=8}", "num-stages": "{n=4}"}
    for name in BUILTIN_PASSES:
        cls = get_pass(name)
        pipeline = parse_pipeline(f"{cls.level}({name}{options.get(name, '')})")
        fired = False
        for b in bundles:
            if b.target.backend not in cls.backends:
                continue
            outcome = run_pipeline(b, pipeline)
            binary = b.target.binary_level
            if outcome.changed and outcome.bundle.level(binary) != b.level(binary):
                fired = True
                break
        assert fired, f"{name} changed no suite kernel's binary"
    assert set(available_passes()) >= set(BUILTIN_PASSES)


# -- schedule spaces -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def space_bundles() -> dict[str, KernelBundle]:
    cuda, hip = Target.parse("cuda:90"), Target.parse("hip:gfx942")
    return {"vector_add": bundle_for(get_kernel("vector_add"), cuda),
            "matmul_fp16": bundle_for(get_kernel("matmul_fp16"), cuda),
            "matmul_fp32_tf32": bundle_for(get_kernel("matmul_fp32_tf32"), cuda),
            "vector_add_hip": bundle_for(get_kernel("vector_add"), hip)}


@pytest.mark.parametrize(("name", "kernel", "expected"), [
    ("num-warps", "vector_add", ["num-warps{n=2}", "num-warps{n=8}", "num-warps{n=16}"]),
    ("num-stages", "matmul_fp16", ["num-stages{n=2}", "num-stages{n=4}", "num-stages{n=5}"]),
    ("num-stages", "vector_add", "no scf.for loop"),
    ("dot-precision", "matmul_fp16", "no tt.dot on fp32"),
    ("dot-precision", "matmul_fp32_tf32", ["dot-precision{precision=tf32x3}", "dot-precision{precision=ieee}",
                                           "dot-precision{precision=bf16x3}", "dot-precision{precision=bf16x6}"]),
    ("ld-nc", "vector_add", ["ld-nc{assume_noalias=true}"]),
    ("ptx-reorder", "vector_add", ["ptx-reorder{strategy=hoist-loads scope=hot}"]),
    ("ptx-reorder", "vector_add_hip", "applies to cuda only"),
    ("redundant-cvt", "vector_add", "no redundant conversion or copy chain"),
    ("ptx-predicate", "vector_add", "no short forward branch to if-convert"),
    ("nontemporal-hints", "vector_add", "applies to hip only"),
    ("nontemporal-hints", "vector_add_hip", ["nontemporal-hints{stores=false loads=true}",
                                             "nontemporal-hints{stores=true loads=false}",
                                             "nontemporal-hints{stores=true loads=true}"]),
    ("mfma-priority", "vector_add_hip", "no MFMA"),
    ("amdgcn-reorder", "vector_add_hip", "hoist-loads: nothing to move in the hot window"),
    ("grouped-pid", "matmul_fp16", "already groups"),
])
def test_schedule_space(space_bundles: dict[str, KernelBundle], name: str, kernel: str,
                        expected: list[str] | str) -> None:
    space = get_pass(name).schedule_space(space_bundles[kernel])
    if isinstance(expected, str):
        assert not space and space.reason is not None and expected in space.reason
    else:
        assert space.spellings() == expected


def test_every_space_holds_only_instances_whose_precondition_holds(space_bundles: dict[str, KernelBundle]) -> None:
    for name in BUILTIN_PASSES:
        cls = get_pass(name)
        for kernel, bundle in space_bundles.items():
            space = cls.schedule_space(bundle)
            assert space or space.reason, f"{name} on {kernel}: an empty space without a reason"
            for candidate in space:
                assert type(candidate) is cls
                assert candidate.precondition(PassContext(bundle, cls.level)) is None, (name, kernel, candidate)


def test_a_ttir_group_parses_its_module_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two rewrites in one level group share one parsed module: the text is parsed once, not per pass."""
    import kstrata.ir.triton_ir as triton_ir
    from kstrata.passes.pipeline import run_stage

    text = (Path(__file__).resolve().parents[1] / "filecheck" / "ttir" / "inputs" / "matmul_tf32.ttir").read_text()
    bundle = KernelBundle("matmul_kernel", Target.parse("cuda:90"), {"ttir": text}, {"name": "matmul_kernel"})
    calls = []
    real = triton_ir.parse_triton

    def counting(*args: object, **kwargs: object) -> triton_ir.TritonModule:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(triton_ir, "parse_triton", counting)
    stage = parse_pipeline("ttir(load-eviction,dot-precision{precision=ieee},load-eviction{policy=evict_last})").stages[0]
    outcome = run_stage(bundle, stage, verify=False)
    assert [r.status for r in outcome.records] == ["changed", "changed", "skipped"]
    assert "evictionPolicy = evict_first" in outcome.text and "inputPrecision = tf32" not in outcome.text
    assert len(calls) == 1


def test_passes_apply_says_why_a_pass_did_nothing(tmp_path: Path) -> None:
    from kstrata.passes.pipeline import apply_passes

    inputs = Path(__file__).resolve().parents[1] / "filecheck" / "ttgir" / "inputs"
    ttir = KernelBundle("vector_add_kernel", Target.parse("cuda:90"), {"ttir": (inputs / "vector_add.ttir").read_text()},
                        {"name": "vector_add_kernel"})
    bare = tmp_path / "vector_add.ttgir"
    bare.write_text(apply_passes(ttir, parse_pipeline("ttgir(num-warps{n=8})")).text)
    cli = [sys.executable, "-m", "kstrata.tools.cli", "passes", "apply"]
    proc = subprocess.run([*cli, str(bare), "-p", "ttgir(num-warps{n=4})"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0 and proc.stdout == bare.read_text()  # unchanged, and it says so
    assert "num-warps{n=4}: skipped: num-warps is a re-lowering option" in proc.stderr
    assert "needs the kernel's TTIR and metadata" in proc.stderr
    bad = subprocess.run([*cli, str(bare), "-p", "ttir(load-eviction{policy=bogus})"], capture_output=True, text=True,
                         timeout=300, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0, bad.stderr  # one line
    assert "policy=bogus is not valid: expected one of evict_first, evict_last, evict_normal" in bad.stderr


def test_passes_space_cli() -> None:
    ttir = Path(__file__).resolve().parents[1] / "filecheck" / "ttir" / "inputs" / "matmul_rowmajor.ttir"
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "passes", "space", str(ttir), "-t", "cuda:90",
                           "--only", "grouped-pid", "--only", "ld-nc", "--json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = {r["pass"]: r for r in json.loads(proc.stdout)["passes"]}
    assert rows["grouped-pid"]["candidates"] == ["grouped-pid{group=4}", "grouped-pid{group=8}", "grouped-pid{group=16}"]
    assert rows["ld-nc"]["candidates"] == [] and "ptx is not known" in rows["ld-nc"]["reason"]
