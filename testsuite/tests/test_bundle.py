"""KernelBundle: compiling @jit functions for every target, Triton's layouts read and written, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kstrata.ir.bundle import KernelBundle, parse_entry_params
from kstrata.ir.errors import BundleError, TargetError
from kstrata.ir.target import Target
from kstrata.ir.triton_layout import (
    INDEX_FILE,
    compile_jit,
    load_any,
    load_cache_entry,
    load_cache_root,
    load_dump_root,
    write_cache_entry,
    write_override,
)
from kstrata.testsuite.kernels import get_kernel
from kstrata.testsuite.kernels.build import specialization

ALL_TARGETS = ("cuda:80", "cuda:90", "cuda:100", "hip:gfx90a", "hip:gfx942", "hip:gfx950")


def _vector_add(target: str, cache_dir: Path | None = None) -> KernelBundle:
    kernel = get_kernel("vector_add")
    sig, constexprs, attrs = specialization(kernel)
    return compile_jit(kernel.fn, sig, target, constexprs, attrs, {"num_warps": 4, "num_stages": 2}, cache_dir=cache_dir)


@pytest.mark.parametrize("spelling", ALL_TARGETS)
def test_compile_jit_gives_every_level(spelling: str) -> None:
    bundle = _vector_add(spelling)
    target = Target.parse(spelling)
    assert bundle.target == target
    assert bundle.present_levels() == list(target.levels)
    assert bundle.num_warps == 4 and bundle.num_stages == 2
    assert bundle.signature == {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32"}
    assert [p.divisibility for p in bundle.params] == [16, 16, 16, None]  # n = 5003 is not a multiple of 16
    binary = bundle.level(target.binary_level)
    assert isinstance(binary, bytes) and binary[:4] == b"\x7fELF"
    assert f'ttg.target = "{spelling}"' in bundle.text("ttgir")
    assert bundle.source is not None and "def vector_add_kernel" in bundle.source
    assert bundle.override_key


def test_abi_reads_ptx_entry() -> None:
    abi = _vector_add("cuda:90").abi()
    assert abi.threads_per_block == 128
    assert abi.reqntid == (128,)
    # four kernel parameters plus the two scratch pointers Triton's launcher appends
    assert abi.ptx_params == (".u64", ".u64", ".u64", ".u32", ".u64", ".u64")


def test_cache_entry_round_trip(tmp_path: Path) -> None:
    original = _vector_add("cuda:90", cache_dir=tmp_path / "triton")
    assert original.origin is not None and Path(original.origin).parent == tmp_path / "triton"
    entry = write_cache_entry(original, tmp_path / "copy")
    loaded = load_cache_entry(entry)
    assert loaded.levels == original.levels
    assert loaded.metadata == original.metadata
    grp = json.loads((entry / "__grp__vector_add_kernel.json").read_text())
    assert all(Path(p).parent == entry for p in grp["child_paths"].values())
    # writing the same bundle again is a no-op; a different one is refused without --force
    assert write_cache_entry(loaded, tmp_path / "copy") == entry
    loaded.levels["ptx"] = loaded.text("ptx") + "\n// edited\n"
    with pytest.raises(BundleError, match="different contents"):
        write_cache_entry(loaded, tmp_path / "copy")
    write_cache_entry(loaded, tmp_path / "copy", overwrite=True)
    assert load_cache_entry(entry).text("ptx").endswith("// edited\n")


def test_dump_dir_key_is_the_override_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_KERNEL_DUMP", "1")
    monkeypatch.setenv("TRITON_DUMP_DIR", str(tmp_path / "dump"))
    compiled = _vector_add("hip:gfx942")
    bundles, errors = load_dump_root(tmp_path / "dump")
    assert not errors and len(bundles) == 1
    dumped = bundles[0]
    assert dumped.override_key == compiled.override_key
    assert dumped.target == Target.parse("hip:gfx942")
    assert dumped.levels["hsaco"] == compiled.levels["hsaco"]
    assert dumped.num_warps == 4 and dumped.num_stages is None
    assert load_any(tmp_path / "dump")[0][0].levels == dumped.levels


def test_override_is_picked_up_by_triton(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = _vector_add("cuda:90")
    marker = "// kstrata override marker"
    bundle.levels["ptx"] = bundle.text("ptx") + f"\n{marker}\n"
    write_override(bundle, tmp_path / "override", levels=["ptx"])
    monkeypatch.setenv("TRITON_KERNEL_OVERRIDE", "1")
    monkeypatch.setenv("TRITON_OVERRIDE_DIR", str(tmp_path / "override"))
    recompiled = _vector_add("cuda:90")  # a fresh cache: Triton compiles and consults the override dir
    assert marker in recompiled.text("ptx")


def test_override_needs_a_key() -> None:
    bundle = _vector_add("cuda:90")
    bundle.override_key = None
    with pytest.raises(BundleError, match="override key"):
        write_override(bundle, "/nonexistent")


@pytest.fixture
def entry(tmp_path: Path) -> Path:
    bundle = _vector_add("cuda:90")
    return write_cache_entry(bundle, tmp_path / "cache")


def test_missing_level_file_is_named(entry: Path) -> None:
    (entry / "vector_add_kernel.ttgir").unlink()
    with pytest.raises(BundleError) as info:
        load_cache_entry(entry)
    assert "vector_add_kernel.ttgir" in str(info.value) and "missing" in str(info.value)


def test_truncated_cubin_is_named(entry: Path) -> None:
    cubin = entry / "vector_add_kernel.cubin"
    cubin.write_bytes(cubin.read_bytes()[: len(cubin.read_bytes()) // 2])
    with pytest.raises(BundleError, match=r"vector_add_kernel\.cubin.*truncated ELF"):
        load_cache_entry(entry)


def test_truncated_ir_is_named(entry: Path) -> None:
    ttir = entry / "vector_add_kernel.ttir"
    ttir.write_text(ttir.read_text()[:400])
    with pytest.raises(BundleError, match=r"vector_add_kernel\.ttir.*(truncated|not Triton IR)"):
        load_cache_entry(entry)


def test_corrupt_metadata_is_named(entry: Path) -> None:
    (entry / "vector_add_kernel.json").write_text("{not json")
    with pytest.raises(BundleError, match=r"vector_add_kernel\.json: corrupt JSON"):
        load_cache_entry(entry)


def test_unknown_target_is_named(entry: Path) -> None:
    meta = entry / "vector_add_kernel.json"
    data = json.loads(meta.read_text())
    data["target"] = {"backend": "cuda", "arch": 91, "warp_size": 32}
    meta.write_text(json.dumps(data))
    with pytest.raises(TargetError) as info:
        load_cache_entry(entry)
    assert str(meta) in str(info.value) and "cuda:91" in str(info.value)


def test_cache_root_reports_bad_entries_and_loads_the_rest(entry: Path) -> None:
    root = entry.parent
    bad = root / "BADENTRY"
    shutil.copytree(entry, bad)
    (bad / "vector_add_kernel.llir").write_text("")
    (root / "not-a-kernel").mkdir()  # launcher entries and strays are skipped, not errors
    bundles, errors = load_cache_root(root)
    assert len(bundles) == 1 and len(errors) == 1
    assert "BADENTRY" in str(errors[0]) and "empty llir" in str(errors[0])


def test_load_any_rejects_what_is_not_a_cache(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no such file"):
        load_any(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match="neither a Triton cache nor a dump"):
        load_any(tmp_path / "empty")


def test_suite_cache_has_an_index_with_override_keys(suite_cache: Path) -> None:
    assert (suite_cache / INDEX_FILE).exists()
    bundles, errors = load_cache_root(suite_cache)
    assert not errors
    assert bundles and all(b.override_key and b.source for b in bundles)


def test_entry_params_with_attributes() -> None:
    text = ('module { tt.func public @k(%a: !tt.ptr<f16> {tt.divisibility = 16 : i32} loc("a"(#loc)), '
            '%b: i64 loc("b"(#loc)), %c: !tt.ptr<i8, 1>) attributes {noinline = false} { tt.return } }')
    params = parse_entry_params(text, "k")
    assert [(p.name, p.triton_type, p.divisibility) for p in params] == [
        ("a", "*fp16", 16), ("b", "i64", None), ("c", "*i8", None)]


def test_index_updates_from_two_processes_at_once_lose_nothing(tmp_path: Path) -> None:
    """Two builds into one cache root (one target each, as the test session's suite build does) merge
    their index records in turn."""
    import multiprocessing

    from kstrata.ir.triton_layout import read_index, update_index

    def write(tag: str) -> None:
        for i in range(60):
            update_index(tmp_path, {f"{tag}{i}": {"name": tag, "target": tag, "override_key": "k", "source": ""}})

    procs = [multiprocessing.get_context("fork").Process(target=write, args=(t,)) for t in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(read_index(tmp_path)) == 120
