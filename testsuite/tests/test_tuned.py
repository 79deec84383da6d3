"""The tuned database (`kstrata.agents.tuned`, `kstrata tuned list|show|prune`) and the torch.compile
backend's `tuned` option, on the CPU: Triton compiles for cuda:90 here, so the backend's stages hook is
driven by real compiles of Inductor-named kernels; only the launch (and so the end-to-end model run)
needs a GPU (tools/bench_compiled.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import triton
import triton.language as tl

from kstrata.agents.tuned import TunedDB, TunedError, TunedLookup, content_digest, strip_locations


@triton.jit
def triton_poi_scale(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


@triton.jit
def triton_poi_other(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) - 3.0, mask=mask)


SIG = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}


def _compile(fn: Any, cache: Path, block: int = 128) -> Path:
    from kstrata.ir.triton_layout import compile_jit

    bundle = compile_jit(fn, SIG, "cuda:90", {"BLOCK": block}, cache_dir=cache)
    return Path(str(bundle.origin))


def _cubin(entry: Path) -> bytes:
    return next(entry.glob("*.cubin")).read_bytes()


def autotuned_configs(root: Path) -> dict[str, Path]:
    """`triton_poi_scale` compiled as Inductor's autotuner compiles a pointwise kernel, in two configs (BLOCK 512
    with 8 warps, BLOCK 1024 with 4): each a cache entry under `root/cache` with the launch record `kstrata
    record` writes under `root/records`, and launch counts where the program ran the 8-warp config and the
    autotuner only benchmarked the 4-warp one (the MLP's silu kernel on the H200, 2026-12-03)."""
    from kstrata.agents.compiled.program import COUNTS_FILE
    from kstrata.ir.launch import LaunchRecord, ScalarArg, TensorArg
    from kstrata.ir.triton_layout import compile_jit

    n = 1 << 16
    args = (TensorArg("x_ptr", "float32", (n,), (1,), 0, n, False),
            TensorArg("out_ptr", "float32", (n,), (1,), 0, n, True), ScalarArg("n", "i32", n))
    entries, counts = {}, []
    for number, (tag, block, warps, launches) in enumerate((("w8", 512, 8, 3), ("w4", 1024, 4, 0)), start=1):
        bundle = compile_jit(triton_poi_scale, SIG, "cuda:90", {"BLOCK": block}, options={"num_warps": warps},
                             cache_dir=root / "cache")
        entries[tag] = entry = Path(str(bundle.origin))
        meta = json.loads((entry / "triton_poi_scale.json").read_text())
        LaunchRecord("triton_poi_scale", "cuda:90", (n // block, 1, 1), args, warps, meta["num_stages"],
                     meta["hash"]).save(root / "records" / f"triton_poi_scale-{number}.json")
        counts.append({"kernel": "triton_poi_scale", "cache_key": entry.name, "launches": launches,
                       "benchmark_launches": 25})
    (root / "records" / COUNTS_FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / "records" / COUNTS_FILE).write_text(json.dumps({"schema": "kstrata.launch-counts/1", "kernels": counts}))
    return entries


def test_content_digest_ignores_locations_but_not_code_or_options() -> None:
    a = '#loc = loc("/tmp/u1/x.py":3:0)\nmodule {\n  %0 = arith.constant 1 : i32 loc(#loc)\n} loc(#loc)\n'
    b = a.replace("/tmp/u1", "/home/u2")
    assert strip_locations(a) == strip_locations(b) and "loc" not in strip_locations(a)
    assert content_digest(a, {"num_warps": 4}) == content_digest(b, {"num_warps": 4, "name": "k"})
    # a debug build (device asserts), programmatic dependent launch, libdevice's denormal flush: other kernels, never
    # matched to a variant tuned without them (the digest the optimizer's deployer uses too)
    for option in ("debug", "launch_pdl", "enable_reflect_ftz"):
        assert content_digest(a, {"num_warps": 4}) != content_digest(a, {"num_warps": 4, option: True}), option
    assert content_digest(a, {"num_warps": 4}) != content_digest(a, {"num_warps": 8})
    assert content_digest(a, {}) != content_digest(a.replace("1 : i32", "2 : i32"), {})


@pytest.fixture(scope="module")
def tuned_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """A tuned database with one variant of `triton_poi_scale` (num-warps 8, built by the engine)."""
    from kstrata.agents.engine import Candidate, Engine, PipelineEdit

    root = tmp_path_factory.mktemp("tuned")
    original = _compile(triton_poi_scale, root / "cache")
    with Engine(root / "engine") as engine:
        built = engine.build(Candidate(engine.add_kernel(original), "ttgir", PipelineEdit("ttgir(num-warps{n=8})")))
    assert built.status == "changed" and built.entry
    # the measurement is this test's, not a timing: the database stores what the optimizer measured
    record = TunedDB(root / "db").add(original, built.entry, edit="ttgir(num-warps{n=8})", tolerance=None,
                                      spaces=["options"], verdict="equivalent: test", speedup=1.25,
                                      speedup_range=[1.2, 1.3], time_before_us=10.0, time_after_us=8.0,
                                      device="test (constructed record, not a timing)")
    return root, Path(built.entry), record


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kstrata.tools.cli", *args], capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.slow
def test_tuned_list_show_prune(tuned_db: tuple[Path, Path, Any], tmp_path: Path) -> None:
    root, _, record = tuned_db
    db = tmp_path / "db"
    shutil.copytree(root / "db", db)
    listed = json.loads(_cli("tuned", "list", str(db), "--json").stdout)["tuned"]
    assert [(r["kernel"], r["edit"], r["applies_here"]) for r in listed] == [("triton_poi_scale", "ttgir(num-warps{n=8})", True)]
    shown = json.loads(_cli("tuned", "show", str(db), "triton_poi_scale", "--json").stdout)["tuned"][0]
    assert shown["content"] == record.content and shown["metadata_changes"]["num_warps"] == 8
    missing = _cli("tuned", "show", str(db), "nope")
    assert missing.returncode == 2 and "no tuned kernel named 'nope'" in missing.stderr
    assert _cli("tuned", "list", str(tmp_path)).returncode == 2  # not a tuned database: one line, exit 2
    # a record of other tool versions and a damaged one can never apply: prune removes them, keeps the good one
    stale = db / (record.slug + "-old")
    shutil.copytree(db / record.slug, stale)
    data = json.loads((stale / "tuned.json").read_text())
    (stale / "tuned.json").write_text(json.dumps({**data, "versions_digest": "0" * 64}))
    broken = db / (record.slug + "-broken")
    shutil.copytree(db / record.slug, broken)
    (broken / "tuned.json").write_text("{")
    dry = json.loads(_cli("tuned", "prune", str(db), "--dry-run", "--json").stdout)["removed"]
    assert sorted(r["id"] for r in dry) == sorted([stale.name, broken.name]) and stale.exists()
    _cli("tuned", "prune", str(db))
    assert sorted(p.name for p in db.iterdir() if p.is_dir()) == [record.slug]


def test_backend_applies_tuned_variants_to_matching_kernels_only(tuned_db: tuple[Path, Path, Any],
                                                                tmp_path: Path) -> None:
    from triton import knobs

    from kstrata.tools.torch_backend import BackendConfig, _Session

    root, tuned_entry, record = tuned_db
    config = BackendConfig.from_options({"tuned": str(root / "db"), "cache_dir": str(tmp_path / "bk")})
    assert config.pipeline == ""  # with tuned variants, nothing else is rewritten
    session = _Session(config)
    plain = {"same": _compile(triton_poi_scale, tmp_path / "plain"),
             "block": _compile(triton_poi_scale, tmp_path / "plain-block", block=256),
             "other": _compile(triton_poi_other, tmp_path / "plain-other")}
    with knobs.runtime.scope():
        knobs.runtime.add_stages_inspection_hook = session.hook
        hooked = {"same": _compile(triton_poi_scale, tmp_path / "hooked"),
                  "block": _compile(triton_poi_scale, tmp_path / "hooked-block", block=256),
                  "other": _compile(triton_poi_other, tmp_path / "hooked-other")}
    # the matching kernel is the tuned variant: its binary, levels and launch metadata
    assert hashlib.sha256(_cubin(hooked["same"])).hexdigest() == record.tuned_binary != record.original_binary
    meta = json.loads(next(p for p in hooked["same"].glob("*.json") if not p.name.startswith("__grp__")).read_text())
    assert meta["num_warps"] == 8
    assert (hooked["same"] / "triton_poi_scale.ptx").read_text() == (tuned_entry / "triton_poi_scale.ptx").read_text()
    # other code or options (BLOCK=256), and an unknown kernel: exactly what Triton makes without kstrata
    assert _cubin(hooked["block"]) == _cubin(plain["block"]) and _cubin(hooked["other"]) == _cubin(plain["other"])
    assert _cubin(plain["same"]) != _cubin(hooked["same"])
    by_status = [(r.name, r.status, r.reason.split(":")[0]) for r in session.records]
    assert by_status[0][:2] == ("triton_poi_scale", "tuned")
    assert by_status[1] == ("triton_poi_scale", "unchanged",
                            "a tuned variant of this name exists, but for other code or options (its TTIR differs)")
    assert by_status[2] == ("triton_poi_other", "unchanged", "no tuned variant")


def test_lookup_refuses_a_variant_whose_parameters_differ(tuned_db: tuple[Path, Path, Any]) -> None:
    root, _, record = tuned_db
    lookup = TunedLookup(root / "db")
    assert len(lookup) == 1
    original = next((root / "cache").glob("*/triton_poi_scale.ttir"))
    meta = json.loads(original.with_suffix(".json").read_text())
    variant, why = lookup.match("triton_poi_scale", "cuda:90", original.read_text(), meta)
    assert variant is not None and why == "tuned" and variant.record.slug == record.slug
    assert lookup.match("triton_poi_scale", "cuda:80", original.read_text(), meta)[0] is None  # another target
    # the same code with other lowering options: the reason names the option (what the H200 run could not tell)
    variant, why = lookup.match("triton_poi_scale", "cuda:90", original.read_text(), {**meta, "num_stages": 5})
    assert variant is None and f"num_stages: 5 here, {meta['num_stages']!r} in the record" in why
    with pytest.raises(TunedError, match="only measured speedups"):
        TunedDB(root / "db").add(original.parent, original.parent, edit="x", tolerance=None, spaces=[], verdict="",
                                 speedup=0.9, speedup_range=None, time_before_us=None, time_after_us=None, device="")


def test_a_variant_built_with_torchs_ptxas_applies_once_inductor_points_triton_at_it(
        tuned_db: tuple[Path, Path, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program under Inductor assembles with torch's ptxas (`TRITON_PTXAS_PATH`, set by Inductor when it
    first compiles): its variants are recorded with that ptxas, and a lookup compares with the ptxas of the
    moment, not of when the database was opened. (The H200 run of 2026-12-02 recorded the bundled ptxas and
    deployed nothing.)"""
    root, tuned_entry, _ = tuned_db
    fake = tmp_path / "bin" / "ptxas"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    fake.chmod(0o755)
    original = next((root / "cache").glob("*/triton_poi_scale.ttir"))
    meta = json.loads(original.with_suffix(".json").read_text())
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    db = TunedDB(tmp_path / "db")
    record = db.add(original.parent, tuned_entry, edit="ttgir(num-warps{n=8})", tolerance=None, spaces=["options"],
                    verdict="equivalent: test", speedup=1.25, speedup_range=[1.2, 1.3], time_before_us=10.0,
                    time_after_us=8.0, device="test (constructed record, not a timing)", ptxas=str(fake))
    assert record.versions["ptxas"] == f"Cuda compilation tools, release 13.0, V13.0.88 ({fake})"
    assert db.stale_reason(tmp_path / "db" / record.slug, record) is None  # its ptxas is here: it applies
    lookup = TunedLookup(tmp_path / "db")  # opened before Inductor sets the variable
    variant, why = lookup.match("triton_poi_scale", "cuda:90", original.read_text(), meta)
    assert variant is None and "other tool versions" in why and "release 13.0" in why
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(fake))
    variant, why = lookup.match("triton_poi_scale", "cuda:90", original.read_text(), meta)
    assert variant is not None and why == "tuned"


def test_the_launch_census_tells_the_tuned_binary_from_inductors(tuned_db: tuple[Path, Path, Any]) -> None:
    """End to end on the H200 the MLP's tuned silu kernel was compiled in beside the config Inductor's
    autotuner could choose instead; which one ran was unknown. The census counts launches per binary where
    Triton's and Inductor's launchers meet and says which binary is the tuned one (here launched through
    `CompiledKernel.launch_metadata` by hand: no GPU; Triton's own then returns None, its hook chain off)."""
    from types import SimpleNamespace

    from triton import knobs
    from triton.compiler.compiler import CompiledKernel

    from kstrata.agents.tuned import LaunchCensus
    from kstrata.tools.bench_compiled import expected_end_to_end

    root, tuned_entry, record = tuned_db
    assert hashlib.sha256(_cubin(tuned_entry)).hexdigest() == record.tuned_binary  # what the census matches
    tuned = SimpleNamespace(name="triton_poi_scale", asm={"cubin": _cubin(tuned_entry)},
                            metadata=SimpleNamespace(num_warps=8, num_stages=1))
    plain = SimpleNamespace(name="triton_poi_scale", asm={"cubin": b"another config's binary"},
                            metadata=SimpleNamespace(num_warps=4, num_stages=1))
    original = CompiledKernel.launch_metadata
    with knobs.runtime.scope():
        knobs.runtime.launch_enter_hook = None
        with LaunchCensus(root / "db") as census:
            for k in (tuned, tuned, plain, tuned):
                assert CompiledKernel.launch_metadata(k, (1, 1, 1), 0) is None
    assert CompiledKernel.launch_metadata is original  # restored
    rows = census.rows(calls=2)
    assert [(r["kernel"], r["tuned"], r["launches_per_call"], r["edit"]) for r in rows if r["tuned"]] == \
        [("triton_poi_scale", True, 1.5, "ttgir(num-warps{n=8})")]
    assert [(r["tuned"], r["launches_per_call"]) for r in rows if not r["tuned"]] == [(False, 0.5)]
    # which config each binary is: its launch configuration as first seen
    assert sorted((r["tuned"], r["num_warps"], r["num_stages"], r["grid"]) for r in rows) == [
        (False, 4, 1, [1, 1, 1]), (True, 8, 1, [1, 1, 1])]
    # the kernel A/B saved 2 us a launch: 1.5 launches a call of a 100 us call predict 100 / 97
    row = {"kernels": [{"kernel": "triton_poi_scale", "edit": "ttgir(num-warps{n=8})", "time_before_us": 10.0,
                        "time_after_us": 8.0}], "end_to_end": {"inductor_us": 100.0, "launched": rows}}
    assert expected_end_to_end(row) == pytest.approx(100 / 97)
    # autotuned over two configs: it saves at most what it saved against the faster one (1 us a launch here)
    row["kernels"][0]["siblings"] = [{"time_us": 9.0, "winner_us": 8.0}]
    assert expected_end_to_end(row) == pytest.approx(100 / 98.5)
    row["end_to_end"]["launched"] = [r for r in rows if not r["tuned"]]
    assert expected_end_to_end(row) is None


def _compile_config(cache: Path, block: int, warps: int, hook: Any = None) -> Any:
    """What Inductor's `CachingAutotuner` holds for one config it compiled (a `TritonCompileResult`: Triton's
    `CompiledKernel` and its `Config`), compiled here for cuda:90 into the Triton cache `cache`, through the
    backend's stages hook when given (as the backend compiles every config)."""
    from types import SimpleNamespace

    from triton import knobs
    from triton.compiler import ASTSource

    from kstrata.ir.target import Target

    with knobs.cache.scope(), knobs.runtime.scope():
        knobs.cache.dir = str(cache)
        knobs.runtime.add_stages_inspection_hook = hook
        kernel = triton.compile(ASTSource(triton_poi_scale, SIG, {"BLOCK": block}),
                                target=Target.parse("cuda:90").to_triton(), options={"num_warps": warps})
    return SimpleNamespace(kernel=kernel, config=SimpleNamespace(kwargs={"BLOCK": block}, num_warps=warps))


class FakeAutotuner:
    """Inductor's `CachingAutotuner` after `precompile`: a compile result and a launcher per config (the
    launcher's `config` is its result's, as `TritonCompileResult.make_launcher` sets it)."""

    def __init__(self, results: list[Any]) -> None:
        from types import SimpleNamespace

        self.compile_results = results
        self.launchers = [SimpleNamespace(config=r.config) for r in results]


@pytest.fixture(scope="module")
def autotuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path]:
    """Two autotuning configs of `triton_poi_scale` (`autotuned_configs`) and a num-warps-2 variant of the 8-warp
    one, built by the engine."""
    from kstrata.agents.engine import Candidate, Engine, PipelineEdit

    root = tmp_path_factory.mktemp("autotuned")
    entries = autotuned_configs(root)
    with Engine(root / "engine") as engine:
        built = engine.build(Candidate(engine.add_kernel(entries["w8"]), "ttgir", PipelineEdit("ttgir(num-warps{n=2})")))
    assert built.status == "changed" and built.entry
    return entries, Path(built.entry)


def _add(db: Path, entries: dict[str, Path], variant: Path, siblings: list[dict[str, Any]] | None) -> Any:
    # the timings are this test's, not measurements: the database stores what the search measured
    return TunedDB(db).add(entries["w8"], variant, edit="ttgir(num-warps{n=2})", tolerance=None, spaces=["options"],
                           verdict="equivalent: test", speedup=1.215, speedup_range=[1.10, 1.31], time_before_us=10.0,
                           time_after_us=8.2, device="test (constructed record, not a timing)",
                           config={"words": "w8: num_warps 8"}, siblings=siblings)


def _sibling(entries: dict[str, Path], status: str = "beaten") -> dict[str, Any]:
    return {"config": {"entry": str(entries["w4"]), "words": "w4: num_warps 4"}, "status": status, "speedup": 1.1,
            "speedup_range": [1.08, 1.12], "noise": 0.02, "time_us": 9.0, "winner_us": 8.2}


def test_a_tuned_record_holds_its_timings_against_the_kernels_other_configs(
        autotuned: tuple[dict[str, Path], Path], tmp_path: Path) -> None:
    """Only a variant that beat every other config of its kernel goes in, with each config's content digest
    (what a deployment matches Inductor's other configs by); the lookup says so of the other config."""
    entries, variant = autotuned
    with pytest.raises(TunedError, match="did not beat 1 of the kernel's other configs"):
        _add(tmp_path / "db", entries, variant, [_sibling(entries, "not beaten")])
    record = _add(tmp_path / "db", entries, variant, [_sibling(entries)])
    w4_meta = json.loads((entries["w4"] / "triton_poi_scale.json").read_text())
    w4_content = content_digest((entries["w4"] / "triton_poi_scale.ttir").read_text(), w4_meta)
    assert record.beats_siblings and record.sibling_contents == {w4_content} and record.config == {"words": "w8: num_warps 8"}
    again = TunedLookup(tmp_path / "db")
    assert again.by_binary(record.tuned_binary) == record
    variant_, why = again.match("triton_poi_scale", "cuda:90", (entries["w4"] / "triton_poi_scale.ttir").read_text(),
                                w4_meta)
    assert variant_ is None and why.startswith("another autotuning config of a tuned kernel") and "1.100x" in why
    assert not _add(tmp_path / "old", entries, variant, None).beats_siblings  # not compared: never restricted


def test_inductors_autotuner_uses_a_tuned_config_that_beat_its_other_configs(
        autotuned: tuple[dict[str, Path], Path], tmp_path: Path) -> None:
    """On the H200 (2026-12-03) the MLP's silu kernel, tuned 1.215x in its 8-warp config, was compiled in beside
    the 4-warp config, and Inductor's autotuner chose the 4-warp one: end to end 1.000x. After Inductor's
    autotuner compiled its configs, the backend keeps only the tuned config when the record shows it beat every
    other config compiled here; it never guesses: a record not compared with the configs, or a config it was not
    measured against, leaves the autotuner's choice, and the report says which."""
    from kstrata.tools.torch_backend import BackendConfig, _Session

    entries, variant = autotuned
    _add(tmp_path / "db", entries, variant, [_sibling(entries)])
    _add(tmp_path / "old", entries, variant, None)

    def session(db: str) -> _Session:
        return _Session(BackendConfig.from_options({"tuned": str(tmp_path / db), "cache_dir": str(tmp_path / "bk")}))

    # both configs compiled through the backend's hook, as Inductor compiles them under the backend: the 8-warp
    # one becomes the tuned variant; the 4-warp one is Triton's own, and the report says what it lost to
    s = session("db")
    w4, w8 = (_compile_config(tmp_path / "deploy", block, warps, s.hook) for block, warps in ((1024, 4), (512, 8)))
    assert w8.kernel.asm["cubin"] == _cubin(variant) and w4.kernel.asm["cubin"] == _cubin(entries["w4"])
    assert [r.status for r in s.records] == ["unchanged", "tuned"]
    assert s.records[0].reason.startswith("another autotuning config of a tuned kernel: the tuned variant of the config "
                                          "w8: num_warps 8 beat this one by 1.100x")
    tuner = FakeAutotuner([w4, w8])
    s.choose_config(tuner)
    assert tuner.compile_results == [w8] and [lc.config for lc in tuner.launchers] == [w8.config]
    rec = s.records[-1]
    assert (rec.name, rec.status, rec.passes) == ("triton_poi_scale", "autotune", ["ttgir(num-warps{n=2})"])
    assert "restricted to the tuned config (w8: num_warps 8)" in rec.reason and "w4: num_warps 4: 1.100x" in rec.reason
    # a third config it was not measured against (BLOCK 256): the autotuner chooses, and the report says why
    s = session("db")
    tuner = FakeAutotuner([w4, w8, _compile_config(tmp_path / "deploy", 256, 4)])
    s.choose_config(tuner)
    assert len(tuner.compile_results) == len(tuner.launchers) == 3
    assert "1 of the other configs compiled here were not among those it was measured against" in s.records[0].reason
    # a record made before configs were compared: never restricted
    s = session("old")
    tuner = FakeAutotuner([w4, w8])
    s.choose_config(tuner)
    assert len(tuner.launchers) == 2 and "not measured against the kernel's other configs" in s.records[0].reason
    # no tuned binary among the configs (compiled without the backend): nothing changes, nothing said
    s = session("db")
    tuner = FakeAutotuner([w4, _compile_config(tmp_path / "plain", 512, 8)])
    s.choose_config(tuner)
    assert len(tuner.launchers) == 2 and s.records == []


def test_the_backend_chooses_after_inductors_autotuner_compiled_its_configs(
        autotuned: tuple[dict[str, Path], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the backend compiles with a tuned database, `CachingAutotuner.precompile` (it compiles every config
    and makes their launchers, in torch 2.11 and 2.13) is followed by the choice; it is restored afterwards.
    What the choice reads of this torch's Inductor (2.13 here; the H200 has 2.11) is checked first: a torch that
    renames it fails here, not silently at deployment (where the backend warns and lets the autotuner choose)."""
    import inspect

    from torch._inductor.runtime import triton_heuristics as th
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    from kstrata.tools.torch_backend import BackendConfig, _installed

    init = inspect.getsource(th.CachingAutotuner.__init__)
    assert "self.compile_results" in init and "self.launchers" in init
    assert "warm_cache_only" in inspect.signature(th.CachingAutotuner.precompile).parameters
    assert "self.kernel = kernel" in inspect.getsource(th.CompileResult.__init__)
    assert "launcher.config = cfg" in inspect.getsource(th.TritonCompileResult.make_launcher)
    entries, variant = autotuned
    _add(tmp_path / "db", entries, variant, [_sibling(entries)])
    tuner = FakeAutotuner([])

    def precompile(self: Any, warm_cache_only: bool = False, **kw: Any) -> None:  # Inductor compiling both configs
        from triton import knobs

        hook = knobs.runtime.add_stages_inspection_hook  # the backend's, while it compiles
        self.compile_results = [_compile_config(tmp_path / "deploy", block, warps, hook)
                                for block, warps in ((1024, 4), (512, 8))]
        self.launchers = [] if warm_cache_only else FakeAutotuner(self.compile_results).launchers

    monkeypatch.setattr(CachingAutotuner, "precompile", precompile)
    config = BackendConfig.from_options({"tuned": str(tmp_path / "db"), "cache_dir": str(tmp_path / "bk")})
    with _installed(config) as session:
        assert CachingAutotuner.precompile is not precompile
        CachingAutotuner.precompile(tuner, warm_cache_only=True)  # a compile worker's warm-up: nothing to choose
        assert len(tuner.compile_results) == 2 and [r.status for r in session.records] == ["unchanged", "tuned"]
        CachingAutotuner.precompile(tuner)
    assert CachingAutotuner.precompile is precompile
    assert len(tuner.launchers) == 1 and tuner.compile_results[0].kernel.asm["cubin"] == _cubin(variant)
    assert [r.status for r in session.records][-1:] == ["autotune"]



def test_the_backend_deploys_a_faster_config_the_recorded_program_did_not_run(
        autotuned: tuple[dict[str, Path], Path], tmp_path: Path) -> None:
    """The compiled search starts from the fastest config (on the H200 the 4-warp config of three pointwise kernels
    beat the 8-warp one the program ran). Its record names that config: as Inductor compiled it (`config(KEY)`, no
    edit: its levels and binary are Inductor's own) or a variant of it; either way the recorded 8-warp config is one
    it beat, so Inductor's autotuner is restricted to the 4-warp config, and the 8-warp compile is left alone."""
    from kstrata.agents.engine import Candidate, Engine, PipelineEdit
    from kstrata.tools.torch_backend import BackendConfig, _Session

    entries, _ = autotuned
    recorded = {"config": {"entry": str(entries["w8"]), "key": entries["w8"].name, "words": "w8: num_warps 8"},
                "status": "beaten", "speedup": 1.43, "speedup_range": [1.41, 1.45], "noise": 0.02, "time_us": 10.0,
                "winner_us": 7.0}
    w4_config = {"entry": str(entries["w4"]), "key": entries["w4"].name, "words": "w4: num_warps 4"}
    with Engine(tmp_path / "engine") as engine:
        as_is = engine.as_build(engine.add_kernel(entries["w4"]))  # the config's original, as `measure` times it
        built = engine.build(Candidate(engine.add_kernel(entries["w4"]), "ttgir", PipelineEdit("ttgir(num-warps{n=2})")))
    assert as_is.entry == str(entries["w4"].resolve())
    assert as_is.binary_digest == hashlib.sha256(_cubin(entries["w4"])).hexdigest()
    assert built.status == "changed" and built.entry
    # the timings are this test's, not measurements: the database stores what the search measured
    choice = TunedDB(tmp_path / "choice").add(
        entries["w4"], entries["w4"], edit=f"config({entries['w4'].name[:12]})", tolerance=None, spaces=["config"],
        verdict="a config Inductor compiled, as it is", speedup=1.43, speedup_range=[1.41, 1.45], time_before_us=10.0,
        time_after_us=7.0, device="test (constructed record, not a timing)", config=w4_config, siblings=[recorded],
        recorded_config=recorded["config"], speedup_vs_recorded=1.43)
    assert choice.config_choice and choice.tuned_binary == choice.original_binary and choice.beats_siblings
    variant = TunedDB(tmp_path / "variant").add(
        entries["w4"], built.entry, edit="ttgir(num-warps{n=2})", tolerance=None, spaces=["options"],
        verdict="equivalent: test", speedup=1.1, speedup_range=[1.08, 1.12], time_before_us=7.0, time_after_us=6.4,
        device="test (constructed record, not a timing)", config=w4_config, siblings=[{**recorded, "speedup": 1.56}],
        recorded_config=recorded["config"], speedup_vs_recorded=1.56)
    assert not variant.config_choice and variant.speedup_vs_recorded == 1.56
    again = TunedDB(tmp_path / "choice").find("triton_poi_scale")[0][1]  # the round trip keeps what it names
    assert again == choice and again.recorded_config == recorded["config"] and again.config == w4_config
    for db, cubin in (("choice", _cubin(entries["w4"])), ("variant", _cubin(Path(built.entry)))):
        s = _Session(BackendConfig.from_options({"tuned": str(tmp_path / db), "cache_dir": str(tmp_path / f"bk-{db}")}))
        w4, w8 = (_compile_config(tmp_path / f"deploy-{db}", block, warps, s.hook) for block, warps in ((1024, 4), (512, 8)))
        assert w4.kernel.asm["cubin"] == cubin and w8.kernel.asm["cubin"] == _cubin(entries["w8"])
        assert [r.status for r in s.records] == ["tuned", "unchanged"]
        assert ("config choice" in s.records[0].reason) == (db == "choice")
        assert "over the config the recorded program ran (w8: num_warps 8)" in s.records[0].reason
        assert s.records[1].reason.startswith("another autotuning config of a tuned kernel")
        tuner = FakeAutotuner([w8, w4])
        s.choose_config(tuner)
        assert tuner.compile_results == [w4] and [lc.config for lc in tuner.launchers] == [w4.config]
        assert "restricted to the tuned config (w4: num_warps 4)" in s.records[-1].reason


@triton.jit
def triton_poi_bcast(x_ptr, w_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    w = tl.load(w_ptr + offs % 4096, mask=mask)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * w, mask=mask)


def test_the_backend_deploys_a_variant_rewritten_at_ttir(tmp_path: Path) -> None:
    """A TTIR edit (interleaved-pid, which the compiled search found on Inductor's LayerNorm affine kernel) is
    deployed like any other: the hooked compile of the same kernel returns the variant's binary and levels."""
    from triton import knobs

    from kstrata.agents.engine import Candidate, Engine, PipelineEdit
    from kstrata.ir.triton_layout import compile_jit
    from kstrata.tools.torch_backend import BackendConfig, _Session

    sig = {"x_ptr": "*fp32", "w_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}

    def compile_to(cache: Path) -> Path:
        return Path(str(compile_jit(triton_poi_bcast, sig, "cuda:90", {"BLOCK": 256}, cache_dir=cache).origin))

    original = compile_to(tmp_path / "cache")
    edit = "ttir(interleaved-pid{slices=16})"
    with Engine(tmp_path / "engine") as engine:
        built = engine.build(Candidate(engine.add_kernel(original), "ttir", PipelineEdit(edit)))
    assert built.status == "changed" and built.entry
    tuned_entry = Path(built.entry)
    assert "tt.get_num_programs x" in (tuned_entry / "triton_poi_bcast.ttir").read_text()
    record = TunedDB(tmp_path / "db").add(original, built.entry, edit=edit, tolerance=None, spaces=["ttir"],
                                          verdict="equivalent: test", speedup=1.6, speedup_range=[1.6, 1.6],
                                          time_before_us=350.0, time_after_us=215.0,
                                          device="test (constructed record, not a timing)")
    session = _Session(BackendConfig.from_options({"tuned": str(tmp_path / "db"), "cache_dir": str(tmp_path / "bk")}))
    with knobs.runtime.scope():
        knobs.runtime.add_stages_inspection_hook = session.hook
        hooked = compile_to(tmp_path / "hooked")
    assert hashlib.sha256(_cubin(hooked)).hexdigest() == record.tuned_binary != record.original_binary
    assert "tt.get_num_programs x" in (hooked / "triton_poi_bcast.ttir").read_text()  # the variant's levels
    assert [(r.name, r.status) for r in session.records] == [("triton_poi_bcast", "tuned")]


def test_bench_compiled_measures_a_tuned_database_as_the_search_left_it(tuned_db: tuple[Path, Path, Any],
                                                                       tmp_path: Path) -> None:
    """`bench_compiled --tuned DB`: the database's kernels become the results' rows with the figures the search
    measured (its end to end needs a GPU); a bad database or more than one model is one line, exit 2."""
    from kstrata.tools import bench_compiled

    root, _, _ = tuned_db
    rows = bench_compiled.tuned_rows(root / "db", None, "no bandwidth")
    assert [(r["kernel"], r["edit"], r["speedup"], r["range"], r["time_before_us"], r["time_after_us"])
            for r in rows] == [("triton_poi_scale", "ttgir(num-warps{n=8})", 1.25, [1.2, 1.3], 10.0, 8.0)]
    assert "from the tuned database" in rows[0]["result"] and rows[0]["sol"] == {"reason": "no launch record"}
    assert bench_compiled._tuned_problem(root / "db", ["mlp_fp16"]) is None
    assert "one model" in str(bench_compiled._tuned_problem(root / "db", ["mlp_fp16", "conv_block"]))
    (tmp_path / "empty").mkdir()
    TunedDB(tmp_path / "empty").create()
    assert bench_compiled._tuned_problem(tmp_path / "empty", ["mlp_fp16"]) == "holds no tuned kernel"
    assert bench_compiled._tuned_problem(tmp_path / "missing", ["mlp_fp16"])
    # carried without its binaries (an archive that left out *.cubin): refused, not timed as Inductor against itself
    shutil.copytree(root / "db", tmp_path / "nobin")
    for cubin in (tmp_path / "nobin").rglob("*.cubin"):
        cubin.unlink()
    assert "tuned binary is missing" in str(bench_compiled._tuned_problem(tmp_path / "nobin", ["mlp_fp16"]))
    out = subprocess.run([sys.executable, "-m", "kstrata.tools.bench_compiled", "--results", str(tmp_path / "r"),
                          "--models", "mlp_fp16", "--tuned", str(tmp_path / "missing")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--tuned" in out.stderr, out.stderr
    assert not (tmp_path / "r").exists()
