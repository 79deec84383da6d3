"""The split-products probe (`tools/split_dot_probe.py`) on the CPU: its operand split is exact, its report
renders measured and failed variants, and without a GPU it says so in one line (exit 2)."""

from __future__ import annotations

import pytest
import torch

from kstrata.tools import split_dot_probe


def test_split3_parts_sum_to_the_operand_exactly() -> None:
    torch.manual_seed(0)
    x = torch.randn(257, 129) * torch.exp(4 * torch.randn(257, 129))  # magnitudes over many binades
    parts = split_dot_probe.split3(x)
    assert parts.dtype == torch.bfloat16 and parts.shape == (3, 257, 129)
    assert torch.equal(parts[0].float() + parts[1].float() + parts[2].float(), x)
    assert not torch.equal(parts[0].float(), x)  # the hi part alone is not the operand (the test can fail)


def test_report_lists_measured_and_failed_variants() -> None:
    res = {"device": "GPU", "date": "2026-12-04", "versions": {"torch": "t", "triton": "3.6.0"}, "shape": [4, 5, 6],
           "bound_rel_l2": 2.5e-6, "bound_max_abs": 1e-3, "parts_exact": True,
           "rows": [{"variant": "triton bf16x6", "median_us": 10.0, "tflops": 1.0, "rel_l2": 1.2e-7, "max_abs": 1e-5,
                     "strict_ok": True},
                    {"variant": "triton tf32", "median_us": 5.0, "tflops": 2.0, "rel_l2": 7.7e-4, "max_abs": 0.1,
                     "strict_ok": False},
                    {"variant": "triton bf16x9", "error": "ValueError: not supported"}]}
    md = split_dot_probe.markdown(res)
    assert "| triton bf16x6 | 10.0 | 1.0 | 1.2e-07 | 1e-05 | ok |" in md
    assert "| triton tf32 | 5.0 | 2.0 | 0.00077 | 0.1 | rejected |" in md
    assert "| triton bf16x9 | | | | | ValueError: not supported |" in md and "exactly: True" in md


def test_without_a_gpu_it_says_so(capsys: object) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the probe runs instead")
    assert split_dot_probe.main([]) == 2
    assert "needs an NVIDIA GPU" in capsys.readouterr().out  # type: ignore[attr-defined]
