"""Bad input to the command lines the CLI fuzzer does not drive (skill libraries, tuned databases, output
directories, LLM configs, launch-record fields): each is one `error:` line naming the file, exit 2, never a
traceback. Each case here printed a traceback (or a second line) before it was fixed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_task_isolation import GOOD
from .test_user_errors import entry, one_line_error

__all__ = ["entry"]  # the module-scoped fixture, shared with the user-error tests

SEED_SKILL = Path(__file__).resolve().parents[2] / "agents" / "skills" / "seed" / \
    "library-cuda-graphs-eager-cuda-graph.json"



def kstrata(*args: str, tmp: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`kstrata ARGS` in a child, with its skill library and engine cache under `tmp` (never the user's)."""
    env = {**os.environ, "HOME": str(tmp / "home"), "KSTRATA_SKILLS_DIR": str(tmp / "skills"),
           "KSTRATA_ENGINE_CACHE": str(tmp / "engine")}
    return subprocess.run([sys.executable, "-m", "kstrata.tools.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=tmp, env=env)


def _skill(tmp: Path, change: dict[str, object] | None = None) -> Path:
    data = json.loads(SEED_SKILL.read_text())
    data["id"] = "my-skill"
    data.update(change or {})
    path = tmp / "my-skill.json"
    path.write_text(json.dumps(data))
    return path


# --- skill libraries --------------------------------------------------------------------------------
def test_a_skill_file_that_is_not_utf8_names_it(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "a.json").write_bytes(b'{"id": "\xff"}')
    one_line_error(kstrata("skills", "list", "--dir", str(lib), tmp=tmp_path), f"{lib / 'a.json'}:1", "UTF-8")


def test_a_skill_file_that_is_a_directory_names_it(tmp_path: Path) -> None:
    (tmp_path / "lib" / "a.json").mkdir(parents=True)
    one_line_error(kstrata("skills", "list", "--dir", str(tmp_path / "lib"), tmp=tmp_path),
                   str(tmp_path / "lib" / "a.json"), "directory")
    one_line_error(kstrata("skills", "add", str(tmp_path / "lib" / "a.json"), tmp=tmp_path),
                   str(tmp_path / "lib" / "a.json"), "directory")


@pytest.mark.parametrize(("change", "field"), [
    ({"applies": "x"}, "field applies"),
    ({"example": "abc"}, "field example"),
    ({"evidence": [{"task": "t", "device": "d", "versions": {}, "speedup": "x", "baseline": "eager"}]},
     "field evidence[0].speedup"),
])
def test_a_skill_of_the_wrong_shape_names_the_file_and_field(tmp_path: Path, change: dict[str, object],
                                                             field: str) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    path = _skill(lib, change)
    one_line_error(kstrata("skills", "list", "--dir", str(lib), tmp=tmp_path), str(path), field)


def test_skills_add_into_a_library_that_is_a_file(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.write_text("x")
    one_line_error(kstrata("skills", "add", str(_skill(tmp_path)), "--dir", str(lib), tmp=tmp_path), str(lib))
    one_line_error(kstrata("skills", "list", "--dir", str(lib), tmp=tmp_path), str(lib), "not a file")


def test_skills_export_onto_a_directory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    one_line_error(kstrata("skills", "export", str(out), tmp=tmp_path), str(out), "directory")


# --- tuned databases --------------------------------------------------------------------------------
def test_a_tuned_record_of_the_wrong_types_is_listed_unreadable_and_pruned(tmp_path: Path, entry: Path) -> None:
    from kstrata.agents.tuned import TunedDB

    db = TunedDB(tmp_path / "db").create()
    db.add(entry, entry, edit="config(x)", tolerance=None, spaces=["config"], verdict="equivalent", speedup=1.2,
           speedup_range=[1.1, 1.3], time_before_us=2.0, time_after_us=1.5, device="cpu")
    record = next(db.root.glob("*/tuned.json"))
    data = json.loads(record.read_text())
    data["speedup"] = "x"  # before: `tuned list` died formatting it, `show` and `prune` took it as sound
    record.write_text(json.dumps(data))
    proc = kstrata("tuned", "list", str(db.root), "--json", tmp=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    (row,) = json.loads(proc.stdout)["tuned"]
    assert row["id"] == record.parent.name and "field speedup" in row["error"], row
    one_line_error(kstrata("tuned", "show", str(db.root), "vector_add_kernel", tmp=tmp_path), str(db.root))
    proc = kstrata("tuned", "prune", str(db.root), "--dry-run", tmp=tmp_path)
    assert proc.returncode == 0 and "would remove" in proc.stdout and "field speedup" in proc.stdout, proc.stdout


# --- output paths that are files, or directories ----------------------------------------------------
def test_run_passes_out_is_a_file(tmp_path: Path, entry: Path) -> None:
    out = tmp_path / "o"
    out.write_text("x")
    one_line_error(kstrata("run-passes", str(entry.parent), "-p", "ptx(cache-hints)", "--out", str(out),
                           tmp=tmp_path), str(out))


def test_run_passes_missing_dump_dir_is_the_only_line(tmp_path: Path, entry: Path) -> None:
    one_line_error(kstrata("run-passes", str(entry.parent), "-p", "ptx(cache-hints)", "--out", str(tmp_path / "o"),
                           "--dump-dir", str(tmp_path / "nope"), tmp=tmp_path), str(tmp_path / "nope"))


def test_passes_apply_output_is_a_directory(tmp_path: Path, entry: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    one_line_error(kstrata("passes", "apply", str(next(entry.glob("*.ttgir"))), "-p", "ttgir(num-stages{n=4})",
                           "-o", str(out), tmp=tmp_path), str(out), "directory")


def test_asm_rebuild_out_is_a_file(tmp_path: Path, entry: Path) -> None:
    out = tmp_path / "o"
    out.write_text("x")
    one_line_error(kstrata("asm", "rebuild", str(entry), "--out", str(out), tmp=tmp_path), str(out))


def test_suite_build_cache_dir_is_a_file(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    cache.write_text("x")
    one_line_error(kstrata("suite", "build", "-t", "cuda:90", "--cache-dir", str(cache), "--only", "vector_add",
                           tmp=tmp_path), str(cache))
    assert cache.read_text() == "x"


def test_record_out_is_a_file(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.write_text("x")
    one_line_error(kstrata("record", "--out", str(out), "--", sys.executable, "-c", "pass", tmp=tmp_path), str(out))


def test_optimize_out_is_a_file(tmp_path: Path) -> None:
    task, out = tmp_path / "task.py", tmp_path / "o"
    task.write_text(GOOD)
    out.write_text("x")
    one_line_error(kstrata("optimize", str(task), "--out", str(out), "--device", "cpu", tmp=tmp_path), str(out))


def test_optimize_llm_config_not_utf8(tmp_path: Path) -> None:
    task, config = tmp_path / "task.py", tmp_path / "llm.json"
    task.write_text(GOOD)
    config.write_bytes(b'{"model": "\xff"}')
    one_line_error(kstrata("optimize", str(task), "--out", str(tmp_path / "o"), "--device", "cpu", "--llm",
                           "--llm-config", str(config), tmp=tmp_path), f"{config}:1", "UTF-8")


# --- launch records -----------------------------------------------------------------------------------
def test_a_launch_record_whose_cache_key_is_not_hex(tmp_path: Path, entry: Path) -> None:
    """Before: `run-passes --launches` and `optimize CACHE --launches` died in `bytes.fromhex`."""
    from kstrata.testsuite.kernels import all_kernels
    from kstrata.testsuite.kernels.launch import suite_launch_record

    kernel = next(k for k in all_kernels() if k.name == "vector_add")
    data = suite_launch_record(kernel, "cuda:90").to_json()
    data["cache_key"] = "ZZZZ"
    records = tmp_path / "records"
    records.mkdir()
    path = records / "vector_add_kernel-1.json"
    path.write_text(json.dumps(data))
    one_line_error(kstrata("verify", str(entry), str(entry), "--launch", str(path), "--device", "cpu", tmp=tmp_path),
                   str(path), "cache_key")
    proc = kstrata("run-passes", str(entry.parent), "-p", "ptx(cache-hints)", "--out", str(tmp_path / "o"),
                   "--launches", str(records), tmp=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"1 launch records unreadable, the first: {path}: malformed" in proc.stdout, proc.stdout
