"""What a new user trips on (issue 21): every bad input is one line naming the file (and line), exit 2.

Each test here is a case the CLI fuzzer (`kstrata.tools.fuzz_cli`) found as a traceback, a hang, a
crash or an error that quoted megabytes of input.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kstrata.ir.errors import KstrataError
from kstrata.ir.target import Target


def kstrata(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kstrata.tools.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=cwd)


def one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Assert `proc` failed as a user error: exit 2, no traceback, one `error:` line holding `needles`."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr[-2000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def entry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cuda:90 cache entry of the suite's vector_add (about 2 s to build)."""
    from kstrata.testsuite.kernels import all_kernels
    from kstrata.testsuite.kernels.build import build_suite

    root = tmp_path_factory.mktemp("cache")
    res = build_suite(Target.parse("cuda:90"), root, [k for k in all_kernels() if k.name == "vector_add"])
    assert not res.errors
    return Path(str(res.bundles["vector_add"].origin))


def _copy(entry: Path, dest: Path) -> Path:
    shutil.copytree(entry, dest / entry.name)
    return dest / entry.name


# --- reading files --------------------------------------------------------------------------------
def test_non_utf8_ir_names_file_and_line(tmp_path: Path, entry: Path) -> None:
    ttgir = next(entry.glob("*.ttgir")).read_bytes()
    bad = tmp_path / "k.ttgir"
    bad.write_bytes(ttgir.replace(b"module", b"mod\xffule", 1))
    line = ttgir[: ttgir.index(b"module")].count(b"\n") + 1
    one_line_error(kstrata("passes", "apply", str(bad), "-p", "ttgir(num-stages{n=4})"), f"{bad}:{line}", "UTF-8")
    one_line_error(kstrata("ir", "roundtrip", str(bad), "--no-compile"), f"{bad}:{line}", "UTF-8")
    one_line_error(kstrata("verify", str(entry), str(bad), "--device", "cpu"), f"{bad}:{line}", "UTF-8")


def test_non_utf8_patch(tmp_path: Path, entry: Path) -> None:
    patch = tmp_path / "p.patch"
    patch.write_bytes(b"# kstrata asm patch v1\nlevel: ptx\n\n@@\n-\xfe\n")
    one_line_error(kstrata("asm", "patch", str(entry), str(patch), "--out", str(tmp_path / "o")), f"{patch}:5")


def test_directory_where_a_file_belongs(tmp_path: Path, entry: Path) -> None:
    d = tmp_path / "k.ttir"
    d.mkdir()
    one_line_error(kstrata("ir", "show", str(d)), str(d), "directory")
    broken = _copy(entry, tmp_path / "cache")
    ptx = next(broken.glob("*.ptx"))
    ptx.unlink()
    ptx.mkdir()
    from kstrata.ir.triton_layout import load_cache_entry

    with pytest.raises(KstrataError, match="found a directory") as info:
        load_cache_entry(broken)
    assert str(ptx) in str(info.value)


def test_deeply_nested_and_invalid_json_metadata(tmp_path: Path, entry: Path) -> None:
    from kstrata.ir.triton_layout import load_cache_entry

    broken = _copy(entry, tmp_path / "cache")
    meta = next(p for p in broken.glob("*.json") if not p.name.startswith("__grp"))
    meta.write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
    with pytest.raises(KstrataError, match="nested 100001 levels deep"):
        load_cache_entry(broken)
    meta.write_text('{"name": "k",\n "target": }')
    with pytest.raises(KstrataError, match="corrupt JSON") as info:
        load_cache_entry(broken)
    assert f"{meta}: corrupt JSON (metadata): Expecting value at line 2" in str(info.value)


@pytest.mark.parametrize("value", ["cuda:90", ["cuda", 90], 7, {"backend": 1, "arch": 90, "warp_size": 32}])
def test_target_from_wrong_metadata_types(value: object) -> None:
    with pytest.raises(KstrataError, match="not a Triton target"):
        Target.from_triton(value)


def test_load_any_expands_home(tmp_path: Path, entry: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kstrata.ir.triton_layout import load_any

    shutil.copytree(entry.parent, tmp_path / "cache")
    monkeypatch.setenv("HOME", str(tmp_path))
    bundles, errors = load_any("~/cache")
    assert not errors and [b.name for b in bundles] == ["vector_add_kernel"]


def test_markup_in_a_message_is_printed_as_text(tmp_path: Path) -> None:
    odd = tmp_path / "[bold]x.ttir"
    odd.write_text("module {\n")
    line = one_line_error(kstrata("passes", "apply", str(odd), "-p", "ttir(load-eviction{policy=evict_last})"))
    assert "[bold]x.ttir" in line
    task = tmp_path / "t.py"
    task.write_text("raise ValueError('[/] closes nothing')\n")
    line = one_line_error(kstrata("task", "show", str(task)), f"{task}:1", "[/] closes nothing")


# --- IR that is not what `ir` reads, or that parsers choke on ---------------------------------------
@pytest.mark.parametrize("ext", ["ptx", "llir"])
def test_ir_show_names_the_levels_it_reads(tmp_path: Path, ext: str) -> None:
    f = tmp_path / f"x.{ext}"
    f.write_text("//\n.version 8.0\n" if ext == "ptx" else "define void @f() {\n  ret void\n}\n")
    one_line_error(kstrata("ir", "show", str(f)), str(f), ".ttir or .ttgir", f"--level {ext}")


def test_ttgir_that_is_not_mlir(tmp_path: Path) -> None:
    f = tmp_path / "x.ttgir"
    f.write_text("//\n.version 8.0\n.target sm_90a\n")
    one_line_error(kstrata("ir", "roundtrip", str(f), "--no-compile"), f"{f}:2")


def test_unterminated_string_literal_returns_at_once(tmp_path: Path, entry: Path) -> None:
    ttir = next(entry.glob("*.ttir")).read_text()
    cut = ttir.index('"')
    f = tmp_path / "k.ttir"
    f.write_text(ttir[:cut] + '"' + "a" * 60)
    start = time.monotonic()
    one_line_error(kstrata("ir", "show", str(f), timeout=60), f"{f}:", "string literal")
    assert time.monotonic() - start < 30  # xDSL's lexer alone takes minutes (exponential backtracking)


def test_deeply_nested_types(tmp_path: Path, entry: Path) -> None:
    from kstrata.ir.triton_ir import IRParseError, parse_triton

    ttir = next(entry.glob("*.ttir")).read_text()
    deep = ttir.replace("f32", "!tt.ptr<" * 20000 + "f32" + ">" * 20000, 1)
    with pytest.raises(IRParseError, match="nested too deeply"):
        parse_triton(deep, "deep.ttir")


def test_huge_line_is_refused_and_not_echoed(tmp_path: Path, entry: Path) -> None:
    ttir = next(entry.glob("*.ttir")).read_text()
    f = tmp_path / "k.ttir"
    f.write_text(ttir + "x" * (10 << 20) + "\n")
    start = time.monotonic()
    for proc in (kstrata("ir", "show", str(f)), kstrata("verify", str(entry), str(f), "--device", "cpu"),
                 kstrata("passes", "apply", str(f), "-p", "ttir(load-eviction{policy=evict_last})")):
        one_line_error(proc, "10,485,", "characters")
        assert len(proc.stderr) < 1000
    assert time.monotonic() - start < 60


def test_quoted_input_is_cut() -> None:
    from kstrata.ir.errors import cut_text

    long = "y" * (8 << 20)
    assert len(cut_text(long)) < 300 and "8,388,608 characters" in cut_text(long)
    assert cut_text("short") == "short"


# --- errors name the user's file (item 11) ---------------------------------------------------------
def test_tool_failure_names_the_users_file_not_the_temp_copy(tmp_path: Path, entry: Path) -> None:
    broken = _copy(entry, tmp_path / "cache")
    ptx = next(broken.glob("*.ptx"))
    text = ptx.read_text()
    ptx.write_text(text.replace("ld.global", "ld.glowbal", 1))
    line = one_line_error(kstrata("asm", "rebuild", str(broken)), f"{ptx}: ptxas failed")
    assert "kstrata-ptxas" not in line.split("; repro:")[0]  # the temp copy only as the repro's output
    repro = line.split("; repro: ")[1]
    assert str(ptx) in repro and f"-o {ptx.with_suffix('.cubin')}" not in repro  # never writes over the user's file


def test_elf_decode_error_names_the_binary(tmp_path: Path, entry: Path) -> None:
    broken = _copy(entry, tmp_path / "cache")
    cubin = next(broken.glob("*.cubin"))
    cubin.write_bytes(cubin.read_bytes()[:40])
    from kstrata.ir.triton_layout import load_cache_entry

    with pytest.raises(KstrataError) as info:
        load_cache_entry(broken)
    assert str(cubin) in str(info.value)


def test_patch_hunk_error_names_patch_file_and_line(tmp_path: Path, entry: Path) -> None:
    patch = tmp_path / "p.patch"
    patch.write_text("# kstrata asm patch v1\nlevel: ptx\n\n@@ $L__nowhere\n-\tld.global.b32 %r1, [%rd1];\n"
                     "+\tld.global.nc.b32 %r1, [%rd1];\n")
    one_line_error(kstrata("asm", "patch", str(entry), str(patch), "--out", str(tmp_path / "o")),
                   f"{patch}:4:", "hunk 1: anchor")
    from kstrata.backends.patch import AsmPatch, AsmPatchError, apply_patch

    huge = AsmPatch.from_text(patch.read_text().replace("$L__nowhere", "y" * (8 << 20)), str(patch))
    start = time.monotonic()
    with pytest.raises(AsmPatchError) as info:
        apply_patch(next(entry.glob("*.ptx")).read_text(), huge)
    assert time.monotonic() - start < 5 and len(str(info.value)) < 1000 and f"{patch}:4" in str(info.value)


def test_launch_record_mismatch_names_the_record(tmp_path: Path, entry: Path) -> None:
    from kstrata.ir.launch import LaunchRecord
    from kstrata.ir.triton_layout import load_cache_entry
    from kstrata.testsuite.kernels import all_kernels
    from kstrata.testsuite.kernels.launch import suite_launch_record

    kernel = next(k for k in all_kernels() if k.name == "vector_add")
    data = suite_launch_record(kernel, "cuda:90").to_json()
    data["args"] = data["args"][:-1]
    path = tmp_path / "launch.json"
    path.write_text(json.dumps(data))
    record = LaunchRecord.load(path)
    with pytest.raises(KstrataError, match="do not match the kernel's parameters") as info:
        record.check_against(load_cache_entry(entry).params)
    assert str(path) in str(info.value)


def test_verify_with_a_record_of_another_kernel_names_the_record(tmp_path: Path, entry: Path) -> None:
    """A launch record of another kernel, or of other arguments, given to `verify`: one line naming the record,
    even where the candidate is the original's code and no run would read it (it exited 0 before)."""
    from kstrata.testsuite.kernels import all_kernels
    from kstrata.testsuite.kernels.launch import suite_launch_record

    kernel = next(k for k in all_kernels() if k.name == "vector_add")
    data = suite_launch_record(kernel, "cuda:90").to_json()
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**data, "kernel": "softmax_kernel"}))
    one_line_error(kstrata("verify", str(entry), str(entry), "--launch", str(other), "--device", "cpu"),
                   str(other), "of kernel softmax_kernel, not vector_add_kernel")
    fewer = tmp_path / "fewer.json"
    fewer.write_text(json.dumps({**data, "args": data["args"][:-1]}))
    one_line_error(kstrata("verify", str(entry), str(entry), "--launch", str(fewer), "--device", "cpu"),
                   str(fewer), "do not match the kernel's parameters")
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(data))
    assert kstrata("verify", str(entry), str(entry), "--launch", str(ok), "--device", "cpu").returncode == 0


def test_verify_parses_a_ttgir_candidate_before_triton_does(tmp_path: Path, entry: Path) -> None:
    empty = tmp_path / "c.ttgir"
    empty.write_text("")  # Triton's C++ parser segfaulted the kstrata process on it
    one_line_error(kstrata("verify", str(entry), str(empty), "--device", "cpu"), f"{empty}", "empty")


# --- names (item 3) --------------------------------------------------------------------------------
def test_kernel_option_takes_suite_and_function_names(entry: Path) -> None:
    root = entry.parent
    for name in ("vector_add", "vector_add_kernel"):
        proc = kstrata("bundle", "show", str(root), "--kernel", name, "--json")
        assert proc.returncode == 0, proc.stderr
        assert [b["name"] for b in json.loads(proc.stdout)["bundles"]] == ["vector_add_kernel"]
    one_line_error(kstrata("asm", "report", str(root), "--kernel", "vector_ad"), "no kernel named 'vector_ad'",
                   "did you mean", "vector_add")


def test_suite_names_accept_both_spellings_and_suggest() -> None:
    from kstrata.tools.cli import suite_kernel_names

    assert suite_kernel_names("layernorm_fwd_kernel") == ["layernorm_fwd"] == suite_kernel_names("layernorm_fwd")
    assert {"matmul_fp16", "matmul_bf16"} <= set(suite_kernel_names("matmul_kernel"))
    one_line_error(kstrata("suite", "build", "--target", "cuda:90", "--cache-dir", "unused", "--only", "layernorm_fw"),
                   "unknown suite kernel 'layernorm_fw'", "did you mean layernorm_fwd")


@pytest.mark.parametrize("level", ["ttgir", "ptx"])
def test_huge_line_in_a_cache_entry(tmp_path: Path, entry: Path, level: str) -> None:
    from kstrata.ir.triton_layout import load_cache_entry

    broken = _copy(entry, tmp_path / "cache")
    ttgir = next(broken.glob(f"*.{level}"))
    ttgir.write_text(ttgir.read_text() + "y" * (2 << 20) + "\n")
    with pytest.raises(KstrataError, match="has a line of 2,097,152 characters") as info:
        load_cache_entry(broken)
    assert f"{ttgir}:" in str(info.value)


def test_corrupt_metadata_beside_an_ir_file_is_an_error_not_ignored(tmp_path: Path, entry: Path) -> None:
    # It was read as "no metadata" and the file was then compiled with Triton's default options: a
    # round trip that holds or fails for the wrong reason.
    ttgir = next(entry.glob("*.ttgir"))
    f = tmp_path / ttgir.name
    shutil.copy(ttgir, f)
    f.with_suffix(".json").write_text('{"num_warps": 4,')
    one_line_error(kstrata("ir", "roundtrip", str(f), "--no-compile"), str(f.with_suffix(".json")), "corrupt JSON")


def test_run_passes_on_an_entry_with_deeply_nested_metadata(tmp_path: Path, entry: Path) -> None:
    broken = _copy(entry, tmp_path / "cache")
    meta = next(p for p in broken.glob("*.json") if not p.name.startswith("__grp"))
    meta.write_text('{"a": ' + "[" * 100000 + "]" * 100000 + "}")
    proc = kstrata("run-passes", str(tmp_path / "cache"), "-p", "ptx(cache-hints)", "--out", str(tmp_path / "o"))
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "nested 100001 levels deep" in proc.stderr + proc.stdout


def test_verify_of_a_broken_ptx_candidate_names_it_and_says_it_once(tmp_path: Path, entry: Path) -> None:
    ptx = next(entry.glob("*.ptx")).read_text()
    cand = tmp_path / "cand.ptx"
    cand.write_text(ptx[: len(ptx) // 2])
    proc = kstrata("verify", str(entry), str(cand), "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    # ptxas's own line names the user's file (not Triton's temporary copy), and Triton's printed log is
    # not repeated above the error (it was 5-190 KB).
    assert f"ptxas {cand}, line " in proc.stderr and len(proc.stderr) < 2000, proc.stderr[-3000:]
    assert proc.stderr.startswith("error:")


def test_verify_of_an_entry_with_deeply_nested_ttgir(tmp_path: Path, entry: Path) -> None:
    broken = _copy(entry, tmp_path / "cand")
    ttgir = next(broken.glob("*.ttgir"))
    ttgir.write_text(ttgir.read_text().replace("f32", "!tt.ptr<" * 20000 + "f32" + ">" * 20000, 1))
    proc = kstrata("verify", str(entry), str(broken), "--device", "cpu")  # Triton's parser: SIGSEGV
    assert proc.returncode in (1, 2, 3) and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert "nested too deeply" in proc.stderr + proc.stdout


def test_verify_of_a_corrupt_amdgcn_candidate_quotes_a_few_diagnostics(tmp_path: Path) -> None:
    """LLVM's in-process assembler writes one diagnostic per bad line straight to stderr (about 180 KB for
    a text corrupted throughout); the error names the user's file and quotes the first few."""
    from kstrata.testsuite.kernels import get_kernel
    from kstrata.testsuite.kernels.build import build_suite

    built = build_suite(Target.parse("hip:gfx942"), tmp_path / "cache", [get_kernel("vector_add")])
    entry = Path(built.bundles["vector_add"].origin or "")
    amdgcn = next(entry.glob("*.amdgcn")).read_text()
    cand = tmp_path / "cand.amdgcn"
    cand.write_text(amdgcn.replace("\ts_", "\ts[").replace("\tv_", "\tv["))
    proc = kstrata("verify", str(entry), str(cand), "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.startswith(f"error: {cand}:"), proc.stderr[:500]
    assert "more lines of diagnostics" in proc.stderr and len(proc.stderr) < 4000, len(proc.stderr)


def test_a_bare_cubin_without_its_launch_record_is_one_line(tmp_path: Path, entry: Path) -> None:
    """`kstrata optimize KERNEL.cubin --launches R` with no record of its kernel in R: one line naming the kernel
    and the directory, not a misread as a task file. The binary's kind is read from its ELF machine, not its
    file name."""
    from kstrata.agents.compiled.program import bare_binary_kind

    cubin = next(entry.glob("*.cubin"))
    proc = kstrata("optimize", str(cubin), "--launches", str(tmp_path), "--out", str(tmp_path / "o"))
    one_line_error(proc, str(tmp_path), "no launch record of kernel vector_add_kernel")
    assert not (tmp_path / "o").exists()
    proc = kstrata("optimize", str(cubin), "--out", str(tmp_path / "o"))
    one_line_error(proc, cubin.name, "needs --launches")
    amd = bytearray(cubin.read_bytes())
    amd[18:20] = (224).to_bytes(2, "little")  # e_machine: EM_AMDGPU
    fake = tmp_path / "kernel.bin"
    fake.write_bytes(bytes(amd))
    assert bare_binary_kind(fake) == "hsaco" and bare_binary_kind(cubin) == "cubin"
    assert bare_binary_kind(entry) is None and bare_binary_kind(next(entry.glob("*.ptx"))) is None
