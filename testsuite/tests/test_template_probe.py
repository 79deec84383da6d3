"""`tools/template_probe.py` off the GPU: probe specs are parsed or refused in one line (exit 2), Nsight Compute's
raw CSV page is read into per-kernel metrics, and the stall reasons are ranked."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kstrata.tools import template_probe as tp

#: the shape of `ncu --csv --page raw`: a header row, a units row, a row per kernel (numbers with thousands commas)
NCU_CSV = '''==PROF== Connected to process 1
"ID","Kernel Name","gpu__time_duration.sum","smsp__issue_active.avg.pct_of_peak_sustained_active","launch__registers_per_thread","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_selected_per_issue_active.ratio"
"","","nsecond","%","register/thread","ratio","ratio","ratio"
"0","_conv_kernel","855,840","57.2","255","0.95","0","1"
"1","_conv_gn_apply_kernel","265,100","18.0","31","52.36","0.4","1"
'''


def test_probe_specs_are_parsed_or_refused_with_the_reason() -> None:
    path, template, params = tp.parse_probe('05:conv:{"strategy": "fmat", "BLOCK_M": 256}')
    assert path.name == "05_conv_relu_hardswish_fp32.py" and template == "conv"
    assert params == {"strategy": "fmat", "BLOCK_M": 256}
    for bad, why in [("05:conv", "expected TASK-PREFIX:TEMPLATE:PARAMS-JSON"),
                     ("0:conv:{}", "names 6 gap tasks"), ("05:conv:{x}", "its parameters are not JSON"),
                     ("05:conv:[1]", "its parameters are not a JSON object")]:
        with pytest.raises(ValueError, match=why):
            tp.parse_probe(bad)


def test_ncu_raw_csv_becomes_per_kernel_metrics_and_ranked_stalls() -> None:
    parsed = tp.parse_ncu(NCU_CSV)
    assert list(parsed) == ["_conv_kernel #0", "_conv_gn_apply_kernel #1"]
    conv = tp.summarize(parsed["_conv_kernel #0"])
    assert conv["duration_ns"] == 855840.0 and conv["issue_active_pct"] == 57.2 and conv["registers"] == 255.0
    assert conv["stalls"] == {"selected": 1.0, "long_scoreboard": 0.95}  # zero reasons left out, largest first
    assert list(tp.summarize(parsed["_conv_gn_apply_kernel #1"])["stalls"]) == ["long_scoreboard", "selected", "barrier"]
    assert tp.parse_ncu("==ERROR== no kernels were profiled") == {}


def test_the_report_has_a_row_per_kernel_and_says_why_a_probe_did_not_run() -> None:
    res = {"device": "NVIDIA H200", "date": "2026-12-04", "versions": {"torch": "t", "triton": "t"}, "probes": [
        {"probe": "05 conv {}", "median_us": 862.4, "ncu": {k: tp.summarize(v) for k, v in tp.parse_ncu(NCU_CSV).items()}},
        {"probe": "04 conv {}", "error": "not correct under strict: error 0.1"}]}
    md = tp.markdown(res)
    rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert len(rows) == 4 and "| 05 conv {} | 862.4 | _conv_kernel #0 | 855.8 | 57 |" in rows[1]
    assert rows[3] == "| 04 conv {} | | | | | | | | not correct under strict: error 0.1 |"
    assert "Incomplete" not in md
    # written after every probe: a run stopped by the call's limit says so
    assert "**Incomplete: the run stopped after the probes below.**" in tp.markdown({**res, "complete": False})


def test_a_bad_probe_is_one_line_and_exit_2() -> None:
    r = subprocess.run([sys.executable, "-m", "kstrata.tools.template_probe", "05:conv:{\"strategy\": \"fmat\"}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("template_probe: template conv: schedule {") and "is not valid here" in r.stderr
