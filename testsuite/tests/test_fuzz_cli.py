"""The CLI fuzzer (`kstrata.tools.fuzz_cli`): its classifier, and a bounded seeded sample of its cases.

The full run (`python -m kstrata.tools.fuzz_cli --results testsuite/results`, about 25 minutes on 2 cores)
writes `fuzz-cli-<date>.md`; here a sample of the quick commands must end clean, ok or failed — never a
traceback, a signal, a hang or an error that quotes megabytes of input.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kstrata.tools import fuzz_cli


def _run(code: str, tmp: Path, timeout: float = 20) -> fuzz_cli.Outcome:
    case = fuzz_cli.Case("probe", (code,), timeout_s=timeout, launcher=("-c",))
    return fuzz_cli.run_case(case, fuzz_cli.child_env(tmp), tmp / "run")


@pytest.mark.parametrize(("code", "cls", "detail"), [
    ("import sys; print('error: x.ttir:3: bad', file=sys.stderr); sys.exit(2)", "clean", "error: x.ttir:3: bad"),
    ("pass", "ok", ""),
    ("import sys; sys.exit(1)", "failed", ""),
    ("import json; json.loads('{')", "traceback", "json.decoder.JSONDecodeError"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "signal", "SIGSEGV"),
    ("import sys; sys.stderr.write('error: ' + 'x' * 100000); sys.exit(2)", "noisy", "100007 bytes"),
    ("import sys; sys.exit(3)", "noisy", "exit 3"),
])
def test_classifier(tmp_path: Path, code: str, cls: str, detail: str) -> None:
    o = _run(code, tmp_path)
    assert o.cls == cls and detail in o.detail, o


def test_a_hang_and_what_it_left_behind_are_killed(tmp_path: Path) -> None:
    marker = tmp_path / "grandchild-alive"
    code = (f"import os, time\nif os.fork() == 0:\n    time.sleep(3)\n    open({str(marker)!r}, 'w').close()\n"
            "    os._exit(0)\ntime.sleep(60)\n")
    o = _run(code, tmp_path, timeout=1)
    assert o.cls == "hang" and o.seconds < 10
    import time

    time.sleep(3.5)
    assert not marker.exists()  # the forked grandchild died with its process group


def test_every_mutation_changes_its_input() -> None:
    rng = random.Random(0)
    seed = b'module {\n  tt.func public @k(%arg0: !tt.ptr<f32>) {\n    %0 = tt.get_program_id x : i32 loc("k.py":3:0)\n  }\n}\n'
    for name, mut in {**fuzz_cli.TEXT_MUTATIONS, **fuzz_cli.PATCH_MUTATIONS}.items():
        if name in ("wrong-anchor", "no-header", "bad-level", "context-missing", "huge-anchor"):
            continue  # patch-specific: they rewrite the patch header and hunks
        assert mut(seed, rng) != seed, name


def test_seeded_sample_of_quick_commands(tmp_path: Path) -> None:
    """8 cases of the quick commands (seed 0), 2 at a time: about 15 s on 2 cores."""
    seeds = fuzz_cli.build_seeds(tmp_path)
    quick = ("ir-show", "ir-roundtrip", "passes-apply", "bundle-show", "asm-patch")
    cases = [c for c in fuzz_cli.generate_cases(seeds, tmp_path, 0)
             if c.name.rsplit("/", 1)[-1] in quick and "huge" not in c.name]
    sample = random.Random(0).sample(cases, 8)
    outcomes = fuzz_cli.run_cases(sample, tmp_path, jobs=2)
    bugs = [(o.case, o.cls, o.detail) for o in outcomes if o.bug]
    assert not bugs, bugs
    assert {o.cls for o in outcomes} <= {"clean", "ok", "failed"}
