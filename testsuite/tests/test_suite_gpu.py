"""On a machine with an NVIDIA GPU: every suite kernel runs on it and matches its reference."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import has_cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")]


def test_every_kernel_matches_its_reference_on_the_gpu() -> None:
    proc = subprocess.run([sys.executable, "-m", "kstrata.testsuite.kernels.run", "--device", "cuda", "--json"],
                          capture_output=True, text=True, timeout=1200, check=False)
    runs = json.loads(proc.stdout)["runs"]
    failed = [r for r in runs if not r["ok"]]
    assert not failed, json.dumps(failed, indent=1)
