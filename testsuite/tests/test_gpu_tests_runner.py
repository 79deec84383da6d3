"""`kstrata.tools.gpu_tests`: each marked test in its own process, its own limit, its failure said as it ends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TESTS = '''
import time
import pytest

@pytest.mark.gpu
def test_fine():
    assert True

@pytest.mark.gpu
def test_broken():
    assert 1 == 2, "boom-4711"

@pytest.mark.gpu
def test_hangs():
    time.sleep(60)

def test_not_marked():
    assert False
'''

INI = "[pytest]\nmarkers =\n    gpu: needs a GPU\n"


def test_each_test_alone_with_its_own_limit_and_its_failure_said(tmp_path: Path) -> None:
    (tmp_path / "test_some.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text(INI)
    log = tmp_path / "detail.log"
    r = subprocess.run([sys.executable, "-m", "kstrata.tools.gpu_tests", "--per-test-s", "8", "--log", str(log), "--json",
                        "test_some.py"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    got = {t["test"].split("::")[-1]: t for t in out["tests"]}
    assert set(got) == {"test_fine", "test_broken", "test_hangs"}  # the unmarked test is not run
    assert got["test_fine"]["outcome"] == "passed"
    assert got["test_broken"]["outcome"] == "failed" and "boom-4711" in got["test_broken"]["detail"]
    assert got["test_hangs"]["outcome"] == "timeout" and got["test_hangs"]["seconds"] < 30
    text = log.read_text()  # written as each test ended, the failure's reason with it
    assert "FAILED" in text and "boom-4711" in text and "TIMEOUT" in text
    assert "boom-4711" in r.stderr  # said on the way, not only at the end


def test_a_missing_file_is_one_line_exit_2(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "kstrata.tools.gpu_tests", "no_such_test.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "no_such_test.py" in r.stderr
