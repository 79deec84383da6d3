"""Triton kernel templates (kstrata.agents.templates): graph matching, schedule spaces, rendered ModelNew sources
run under Triton's interpreter against the task's own Model (small shapes, masked tails, several chunks per
row, non-contiguous inputs), rejections with reasons, the proposer adapter, `kstrata eval --device cpu` on a
rendered source; GPU twins at the end."""

from __future__ import annotations

import ast
import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kstrata.agents.tasks import load_task
from kstrata.agents.templates import TEMPLATES, analyse, match
from kstrata.agents.templates.cpucheck import compare, compile_recorded, run_jobs
from kstrata.agents.templates.graph import describe
from kstrata.testsuite.tasks import TASKS_DIR

from .conftest import assert_schedules_match, computed_once, has_cuda

GAPS = TASKS_DIR / "gaps"
#: Tiny tasks written for these tests (not benchmarked): chains and sizes the suite's tasks do not have.
SMALL = TASKS_DIR.parent / "template_tasks"
NAMES = {m.NAME for m in TEMPLATES}
gpu = pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")


def shrunk(tmp_path: Path, rel: str, sizes: dict[str, int]) -> Path:
    """A copy of a suite task with its module-level size constants replaced (same Model, smaller inputs)."""
    src = (TASKS_DIR / rel).read_text()
    for name, value in sizes.items():
        src, n = re.subn(rf"^{name} = \d+$", f"{name} = {value}", src, flags=re.M)
        assert n == 1, f"{rel} has no line `{name} = <int>`"
    path = tmp_path / Path(rel).name
    path.write_text(src)
    return path


def one(path: Path, template: str, policy: str = "strict") -> Any:
    """The task's match of `template` (a TemplateMatch)."""
    found = [m for m in match(load_task(path), policy) if m.template == template]
    assert len(found) == 1, f"{path.name}: {template} matches {len(found)} times"
    return found[0]


def write_task(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).lstrip())
    return path


# ---------------------------------------------------------------------------------------------------
# Matching the gap tasks at full size (meta tensors: no memory)
# ---------------------------------------------------------------------------------------------------
GAP_TEMPLATES = {
    "01_layernorm_three_dims_fp32": ("norm", "layer_norm over 16 segments of 4194304", "split"),
    "02_maxpool2d_k4_s1_p1_fp32": ("pool2d", "max_pool2d kernel (4, 4) stride (1, 1) padding (1, 1)", None),
    "03_softmax_wide_rows_fp32": ("softmax", "softmax over 4096 rows of 393216", "split"),
    "04_conv_add_scale_sigmoid_groupnorm_fp32": ("norm", "prologue sigmoid(mul(add(x, bias), scale))", "split"),
    "05_conv_relu_hardswish_fp32": ("pointwise", "conv (PyTorch) then one fused Triton kernel", None),
    "06_gemm_swish_sum_groupnorm_fp32": ("norm", "group_norm over 2097152 segments of 64", "fused"),
}


#: the gap tasks the `conv` template also covers (computing the convolution itself: test_conv_template.py), and
#: task 06, which `gemm_norm` covers in one kernel (test_gemm_norm_template.py)
GAP_CONV = {"04_conv_add_scale_sigmoid_groupnorm_fp32": ["norm", "conv"], "05_conv_relu_hardswish_fp32": ["conv", "pointwise"],
            "06_gemm_swish_sum_groupnorm_fp32": ["norm", "gemm_norm"]}


@pytest.mark.parametrize("name", sorted(GAP_TEMPLATES))
def test_gap_tasks_match_one_template_at_full_size(name: str) -> None:
    template, words, strategy = GAP_TEMPLATES[name]
    a = analyse(load_task(GAPS / f"{name}.py"))
    expected = GAP_CONV.get(name, [template])
    assert [m.template for m in a.matches] == expected
    m = a.matches[expected.index(template)]
    assert words in m.description
    assert {r.template for r in a.rejected} == NAMES - set(expected)
    assert all(r.reason for r in a.rejected)
    if strategy:
        assert m.default_params()["strategy"] == strategy
    src = m.render()
    tree = ast.parse(src)
    imported = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"torch", "triton", "math"}, imported
    assert "class ModelNew(Model):" in src and "def get_inputs" not in src
    assert "torch.backends.cudnn.allow_tf32 = False" in src and "precision policy: strict" in src
    tf32 = m.render(policy="tf32")
    assert "torch.backends.cudnn.allow_tf32 = True" in tf32 and "precision policy: tf32" in tf32


def test_schedule_space_is_enumerable_and_checked() -> None:
    m = match(load_task(GAPS / "01_layernorm_three_dims_fp32.py"))[0]
    space = m.schedule_space()
    assert set(space) == {"strategy", "BLOCK_M", "BLOCK", "SPLIT", "GROUP_ROWS", "num_warps", "GRAPH", "EVICT",
                          "PREFETCH"}
    assert space["EVICT"] == (0, 1) and space["PREFETCH"] == (0, 1, 2)
    # a 4M-element row cannot be kept in one program's registers: split, or held by a resident team
    assert space["strategy"] == ("split", "resident", "pipe", "stream")
    configs = m.configs()
    assert configs[0] == m.default_params() and len(configs) > 20
    assert len({str(sorted(c.items())) for c in configs}) == len(configs)
    for c in configs[:: max(1, len(configs) // 10)]:
        assert f'"SPLIT": {c["SPLIT"]}' in m.render(c)  # every valid schedule renders, its schedule in the header
    with pytest.raises(ValueError, match="unknown parameter"):
        m.render({"WARPS": 4})
    with pytest.raises(ValueError, match="not in its space"):
        m.render({"BLOCK": 1000})
    # hints: resident teams of chunks held in registers (a segment read once), then a row group that fits in L2
    # with the row split over enough programs; rendered like any schedule
    resident = [h for h in m.hint_params() if h["strategy"] == "resident"]
    # fewest programs a team first: 128 chunks of 32768 (64 values a thread at 16 warps) fit the H200's 132 SMs
    # even at one block an SM (128 registers by its ptxas)
    # (first the 16-warp teams of chunks up to 16384 with L2 eviction priorities, smallest first: 16 rows share the
    # weights, and on the H100 8192 with EVICT beat the others; no L2 prefetches: slower wherever timed)
    assert [(h["BLOCK"], h["num_warps"], h.get("EVICT", 0), h.get("PREFETCH", 0)) for h in resident] == [
        (8192, 16, 1, 0), (16384, 16, 1, 0), (32768, 16, 0, 0), (16384, 16, 0, 0), (16384, 8, 0, 0), (8192, 16, 0, 0),
        (8192, 8, 0, 0)]
    n_resident = len(resident)
    resident = [h for h in resident if not h.get("EVICT")]  # the teams without priorities, largest chunk first
    group = {**m.default_params(), "GROUP_ROWS": 1, "SPLIT": 256, "BLOCK": 2048}
    # then a persistent team a row streaming its chunks twice (one and two rows in flight), then the row groups,
    # last a row at a time from a CUDA graph (a 16 MB row and its output fit in L2; two would not): measured
    # slower than one launch over all rows (H100, 2026-12-07)
    graphed = [{**group, "strategy": s, "GRAPH": 1} for s in ("pipe", "split")]
    streams = [{**group, "strategy": "stream", "GROUP_ROWS": g, "SPLIT": k} for g, k in ((1, 256), (2, 256), (2, 128))]
    assert m.hint_params()[n_resident:] == [*streams, group, {**group, "strategy": "pipe"}, *graphed]
    assert all(h.get("GRAPH", 0) == 0 for h in m.hint_params() if h not in graphed)
    # a graphed schedule: the launches in `_launches`, replayed through a CUDA graph when the inputs are on the GPU
    src = m.render(graphed[0])
    ast.parse(src)
    assert "class _KstrataGraphs:" in src and "def _launches(self, x):" in src
    assert "_KstrataGraphs(self._launches, self)" in src and "return self._launches(x)" in src
    assert "def _launches" not in m.render(group) and "_KstrataGraphs" not in m.render(group)
    # EVICT: the input's loads and the output's stores evicted from L2 first, the weights' loads last; only where
    # nothing reads the input again from L2 (a resident team, or `split` over all rows at once)
    for ok in ({**resident[0], "EVICT": 1}, {**group, "GROUP_ROWS": 0, "EVICT": 1}):
        src = m.render(ok)
        loads = [ln.strip() for ln in src.splitlines() if "tl.load(" in ln and "eviction_policy" in ln]
        assert loads and all(("evict_first" in ln) == ln.startswith("x =") for ln in loads), loads
        assert {ln.split(" =")[0] for ln in loads} == {"x", "aw", "ab"}, loads
        assert all("eviction_policy='evict_first'" in ln for ln in src.splitlines() if "tl.store(out_ptr" in ln)
    assert "eviction_policy" not in m.render(resident[0]) and "eviction_policy" not in m.render(group)
    # PREFETCH: a resident member asks the L2 for its chunk of the team's next row (guarded: the last rows have
    # none) and of the weights, before it waits for its team; PTX only, behind a compile-time constant
    src = m.render({**resident[0], "PREFETCH": 1})
    body = src[src.index("def _norm_resident_kernel"):]
    prefetches = [ln.strip() for ln in body.splitlines() if "prefetch.global.L2" in ln]
    assert len(prefetches) == 3 and [p.split("[")[3].split(" ")[0] for p in prefetches] == ["h_ptr", "w_ptr", "b_ptr"]
    assert "_KSTRATA_PTX = tl.constexpr(torch.version.hip is None)" in src and "if _KSTRATA_PTX:" in body
    assert "if row + teams < 16:" in body and "pidx = (row + teams) * 4194304 + pcol" in body
    assert body.index("tl.load(h_ptr") < body.index("prefetch.global.L2") < body.index("tl.atomic_add(cnt_ptr")
    early = m.render({**resident[0], "PREFETCH": 2})  # first in the row's turn, before the chunk's load
    early = early[early.index("def _norm_resident_kernel"):]
    assert early.count("prefetch.global.L2 [$1];") == 3 and early.index("prefetch.global.L2") < early.index("tl.load(h_ptr")
    assert "prefetch" not in m.render(resident[0]) and "_KSTRATA_PTX" not in m.render(resident[0])
    for bad in ({**group, "GROUP_ROWS": 0, "GRAPH": 1}, {**resident[0], "GRAPH": 1}, {**streams[0], "GRAPH": 1},
                {**group, "EVICT": 1}, {**streams[0], "EVICT": 1}, {**group, "strategy": "pipe", "EVICT": 1},
                {**group, "GROUP_ROWS": 0, "PREFETCH": 1}, {**streams[0], "PREFETCH": 1}):
        with pytest.raises(ValueError, match="not valid"):
            m.render(bad)  # a graph only for a launch or two a row group
    # a GroupNorm's weights are a channel each (task 04): only the input's next row is prefetched, never 256 bytes
    # past a weight tensor of a few channels
    gn = next(t for t in match(load_task(GAPS / "04_conv_add_scale_sigmoid_groupnorm_fp32.py")) if t.template == "norm")
    src = gn.render({**next(h for h in gn.hint_params() if h["strategy"] == "resident"), "PREFETCH": 1})
    assert [ln.split("[")[3].split(" ")[0] for ln in src.splitlines() if "prefetch.global.L2 [$1];" in ln] == ["h_ptr"]
    streamed = m.render(streams[1])  # 256 programs a row, at most 2 teams: the launcher caps them
    assert "c = pid % 256" in streamed and "teams = min(2, slots // 256)" in streamed
    assert streamed.count("for start in range(c * 16384, c * 16384 + 16384, BLOCK):") == 4  # 2 in it, 2 in split's
    with pytest.raises(ValueError, match="not valid"):
        m.render({**streams[0], "SPLIT": 1})  # a team of one streams a whole 4M-element row alone
    assert "for row0 in range(0, 16, 1):" in m.render(group)
    # pipe: the first row's partials, then one launch a row: its normalization and the next row's partials
    piped = m.render({**group, "strategy": "pipe"})
    assert "_norm_stats_kernel[(1, 256)](" in piped and "_norm_pipe_kernel[((n_apply + n_stats) * 256,)](" in piped
    assert "_norm_apply_kernel" not in piped and "def _norm_apply_chunk(" in piped
    with pytest.raises(ValueError, match="not valid"):
        m.render({**group, "strategy": "pipe", "GROUP_ROWS": 0})  # a launch a group needs groups
    held = m.render(resident[0])  # 128 programs a segment, their partials read in one vector of 128
    assert "c = pid % 128" in held and "j = tl.arange(0, 128)" in held and "_kstrata_resident(" in held
    with pytest.raises(ValueError, match="not valid"):
        m.render({**resident[0], "BLOCK": 32768, "num_warps": 8})  # 128 values a thread
    wide = match(load_task(GAPS / "03_softmax_wide_rows_fp32.py"))[0]
    assert [(h["strategy"], h["GROUP_ROWS"], h["SPLIT"], h["RESIDENT"], h["GRAPH"]) for h in wide.hint_params()] == [
        *[("resident", 0, 1, 1, 0)] * 5, *[("team", 0, k, r, 0) for k in (4, 8, 16, 32) for r in (2, 3, 4)],
        ("split", 8, 32, 1, 1), ("split", 16, 16, 1, 1), ("split", 8, 32, 1, 0), ("split", 16, 16, 1, 0)]
    assert "def _launches(self, x):" in wide.render(wide.hint_params()[17])  # 512 groups of 8 rows from one graph
    with pytest.raises(ValueError, match="not valid"):
        wide.render({**wide.hint_params()[0], "GRAPH": 1})  # a graph only for row groups
    assert "c = pid % 12" in wide.render(wide.hint_params()[0])  # 393216 = 12 chunks of 32768
    soft = match(load_task(TASKS_DIR / "level1" / "17_softmax_fp32.py"))[0]
    assert soft.hint_params() == []
    assert soft.schedule_space()["strategy"] == ("fused", "split", "team")
    with pytest.raises(ValueError, match="not valid"):
        soft.render({"strategy": "fused", "SPLIT": 4})  # a fused row is not split


# ---------------------------------------------------------------------------------------------------
# Execution under the interpreter against the task's Model
# ---------------------------------------------------------------------------------------------------
#: The persistent softmax: its team kernel runs on a GPU only (on the CPU the source runs the split kernels).
TEAM = {"strategy": "team", "BLOCK": 1024, "SPLIT": 2, "BLOCK_M": 1, "GROUP_ROWS": 0, "RESIDENT": 2}
#: (task, sizes, template, schedules): sizes leave masked tails; split schedules put several chunks in a row.
CASES: list[tuple[str, dict[str, int], str, list[dict[str, Any]]]] = [
    ("gaps/01_layernorm_three_dims_fp32.py", {"batch": 2, "features": 3, "dim1": 29, "dim2": 31}, "norm",
     [{}, {"strategy": "split", "BLOCK": 1024, "SPLIT": 2, "BLOCK_M": 1, "GROUP_ROWS": 1},
      {"strategy": "fused", "BLOCK_M": 2}]),
    ("gaps/02_maxpool2d_k4_s1_p1_fp32.py", {"batch": 1, "channels": 2, "height": 11, "width": 19}, "pool2d",
     [{}, {"strategy": "rows", "BLOCK_H": 4, "BLOCK_W": 32}, {"strategy": "rows", "BLOCK_H": 4, "BLOCK_W": 32, "AHEAD": 1},
      {"strategy": "rows", "BLOCK_H": 8, "BLOCK_W": 32, "AHEAD": 2},
      {"strategy": "rows", "BLOCK_H": 8, "BLOCK_W": 32, "UNROLL": 4}, {"strategy": "rows", "BLOCK_H": 4, "BLOCK_W": 32, "UNROLL": 2}]),
    ("gaps/03_softmax_wide_rows_fp32.py", {"batch": 19, "dim": 3000}, "softmax",
     [{}, {"strategy": "split", "BLOCK": 1024, "SPLIT": 2, "GROUP_ROWS": 8, "BLOCK_M": 1},
      TEAM, {"strategy": "split", "BLOCK": 1024, "SPLIT": 2, "GROUP_ROWS": 8, "BLOCK_M": 1, "GRAPH": 1}]),
    ("gaps/04_conv_add_scale_sigmoid_groupnorm_fp32.py", {"batch": 2, "height": 20, "width": 18}, "norm",
     [{}, {"strategy": "split", "BLOCK": 1024, "SPLIT": 2, "BLOCK_M": 1}]),
    ("gaps/05_conv_relu_hardswish_fp32.py", {"batch": 2, "height": 9, "width": 11}, "pointwise",
     [{}, {"BLOCK": 512}]),
    ("gaps/06_gemm_swish_sum_groupnorm_fp32.py", {"batch": 7, "in_features": 24, "out_features": 64, "num_groups": 4},
     "norm", [{}]),
    ("level1/19_layernorm_fp16.py", {"batch": 2, "seq": 3, "hidden": 1000}, "norm", [{}]),
    ("level1/22_groupnorm_fp16.py", {"batch": 2, "groups": 4, "channels": 8, "height": 5, "width": 7}, "norm", [{}]),
    ("level1/18_log_softmax_bf16.py", {"batch_size": 5, "vocab": 1500}, "softmax", [{}]),
    ("level1/12_gelu_fp16.py", {"batch_size": 3, "dim": 700}, "pointwise", [{}]),
    ("level2/04_conv_gelu_maxpool_fp16.py", {"batch": 2, "in_channels": 3, "out_channels": 4, "height": 10, "width": 14},
     "pool2d", [{}]),
    ("level2/08_conv_transpose_bias_tanh_fp32.py", {"batch": 2, "in_channels": 3, "out_channels": 5, "height": 6, "width": 7},
     "pointwise", [{}]),
    ("level2/02_gemm_scale_residual_bf16.py", {"batch": 5, "features": 40}, "pointwise", [{}]),
    ("level2/07_gemm_swish_scale_fp32.py", {"batch": 5, "in_features": 12, "out_features": 33}, "pointwise", [{}]),
    ("level2/05_matmul_layernorm_bf16.py", {"batch": 2, "seq": 3, "in_features": 16, "out_features": 200}, "norm", [{}]),
    ("level2/11_gemm_sigmoid_sum_fp32.py", {"batch": 3, "in_features": 8, "out_features": 300}, "reduce", [{}]),
    ("level2/09_gemm_logsumexp_bf16.py", {"batch": 3, "in_features": 8, "out_features": 700}, "reduce",
     [{}, {"BLOCK_R": 256, "BLOCK_O": 2}]),
    ("level2/01_gemm_bias_relu_fp16.py", {"batch": 19, "in_features": 40, "out_features": 56}, "gemm",
     [{}, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}]),
    ("level2/02_gemm_scale_residual_bf16.py", {"batch": 5, "features": 40}, "gemm", [{}]),
    ("level1/03_batched_gemm_bf16.py", {"batch": 2, "M": 17, "K": 24, "N": 40}, "gemm", [{}]),
    ("level1/05_gemm_transposed_a_fp16.py", {"M": 37, "K": 40, "N": 29}, "gemm",  # A.T read through its strides
     [{}, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}]),
]
#: The `resident` strategy (segments or rows held in registers by persistent teams) applies to segments wider than
#: the fused strategy's: its GPU kernel never runs under the interpreter, its two-kernel path with the same chunks
#: does (tails in the last chunk of each row), and the GPU kernel is compiled for sm_90 below.
RESIDENT = {"strategy": "resident", "BLOCK_M": 1, "GROUP_ROWS": 0, "SPLIT": 1, "num_warps": 4}
RESIDENT_CASES: dict[str, tuple[str, dict[str, int], str, list[dict[str, Any]]]] = {
    "resident-layernorm": ("gaps/01_layernorm_three_dims_fp32.py", {"batch": 2, "features": 2, "dim1": 97, "dim2": 89},
                           "norm", [{**RESIDENT, "BLOCK": 4096}, {**RESIDENT, "BLOCK": 8192},
                                    {**RESIDENT, "BLOCK": 8192, "EVICT": 1}]),  # L2 priorities (and in `split`)
    "resident-groupnorm": ("level1/22_groupnorm_fp16.py", {"batch": 2, "groups": 2, "channels": 4, "height": 97,
                                                           "width": 89}, "norm", [{**RESIDENT, "BLOCK": 4096}]),
    "resident-softmax": ("gaps/03_softmax_wide_rows_fp32.py", {"batch": 3, "dim": 20000}, "softmax",
                         [{**RESIDENT, "BLOCK": 4096, "RESIDENT": 1}, {**RESIDENT, "BLOCK": 8192, "RESIDENT": 1}]),
}
#: The `pipe` strategy (a launch a row group: its normalization and the next group's partials): three rows in
#: groups of one and of two (the last group short), chunks with tails; GroupNorm with its affine per channel.
#: The `GRAPH` schedule runs its launches directly under the interpreter, from a CUDA graph on the GPU.
PIPE = {"strategy": "pipe", "BLOCK_M": 1, "BLOCK": 1024, "SPLIT": 2, "num_warps": 4}
PIPE_CASES: dict[str, tuple[str, dict[str, int], str, list[dict[str, Any]]]] = {
    "pipe-layernorm": ("gaps/01_layernorm_three_dims_fp32.py", {"batch": 3, "features": 2, "dim1": 97, "dim2": 89},
                       "norm", [{**PIPE, "GROUP_ROWS": 1}, {**PIPE, "GROUP_ROWS": 2}, {**PIPE, "GROUP_ROWS": 1, "GRAPH": 1}]),
    "pipe-groupnorm": ("level1/22_groupnorm_fp16.py", {"batch": 3, "groups": 2, "channels": 4, "height": 97,
                                                       "width": 89}, "norm", [{**PIPE, "GROUP_ROWS": 4}]),
}
#: The `stream` strategy (a persistent team a row: the chunk's partials, the team's exchange, the chunk read again
#: to normalize it): its GPU kernel never runs under the interpreter (a member would wait for siblings that run
#: after it), its two-kernel path with the same chunks does; teams capped at one and two rows in flight.
STREAM = {"strategy": "stream", "BLOCK_M": 1, "BLOCK": 1024, "SPLIT": 4, "num_warps": 4}
STREAM_CASES: dict[str, tuple[str, dict[str, int], str, list[dict[str, Any]]]] = {
    "stream-layernorm": ("gaps/01_layernorm_three_dims_fp32.py", {"batch": 3, "features": 2, "dim1": 97, "dim2": 89},
                         "norm", [{**STREAM, "GROUP_ROWS": 1}, {**STREAM, "GROUP_ROWS": 2, "SPLIT": 8}]),
    "stream-groupnorm": ("level1/22_groupnorm_fp16.py", {"batch": 3, "groups": 2, "channels": 4, "height": 97,
                                                         "width": 89}, "norm", [{**STREAM, "GROUP_ROWS": 0}]),
}
#: GEMM + epilogue on the tiny tasks (policy, schedules): every size leaves a tail of the default blocks; the
#: second schedules have several tiles per dim in groups of GROUP_M rows and a K tail. All also run on
#: non-contiguous (column-major) inputs, which the kernel reads through their strides.
GEMM_CASES: list[tuple[str, str, list[dict[str, Any]]]] = [
    ("01_linear_gelu_scale_residual_fp16.py", "strict", [{}, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4}]),
    ("02_bmm_tanh_scale_bf16.py", "strict", [{}, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}]),
    ("03_matmul_shared_weight_relu_fp16.py", "strict", [{}]),
]


POOL_TASK = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.rand(1, 3, 1, 1) + 0.5)

        def forward(self, x):
            y = F.{op}(torch.relu(x) * self.scale, {args})
            return torch.sigmoid(y) - 0.25


    def get_inputs():
        return [torch.randn(2, 3, 11, 13)]


    def get_init_inputs():
        return []
"""

POOL_VARIANTS = [  # small windows: the interpreter's cost is per op, and a window is unrolled
    ("avg_pool2d", "2, stride=2, padding=1"),
    ("avg_pool2d", "(2, 3), stride=(1, 2), padding=(1, 1), count_include_pad=False"),
    ("max_pool2d", "2, stride=2, padding=1, dilation=2"),
    ("max_pool2d", "3, stride=(1, 2), padding=1"),
]
#: `rows`' prefetch distances the variants it applies to run with (0: the loop without prefetch)
ROWS_AHEAD = (0, 1, 2)
#: the `rows` schedules the variants it applies to run with: the unrolled loop (1, 2 and 4 output rows an
#: iteration; 2 and 4 iterations of 4 and 2 rows on an 8-row block), then each prefetch distance
ROWS_SCHEDULES = [{"BLOCK_H": 4, "UNROLL": 1}, {"BLOCK_H": 8, "UNROLL": 4}, {"BLOCK_H": 8, "UNROLL": 2},
                  *({"BLOCK_H": 4, "AHEAD": a, "UNROLL": 1} for a in ROWS_AHEAD[1:])]
POOLND_TASK = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.rand(1) + 0.5)

        def forward(self, x):
            y = F.{op}(torch.relu(x) * self.scale, {args})
            return torch.sigmoid(y) - 0.25


    def get_inputs():
        return [torch.randn{shape}]


    def get_init_inputs():
        return []
"""
#: 1-D and 3-D poolings (op, arguments, input shape, whether `rows` applies — 3-D with stride 1 and dilation 1
#: along H — and is run too): dilation, unbatched input, padding counted or not
POOLND_VARIANTS = [
    ("max_pool1d", "4, stride=3, padding=2, dilation=2", (2, 3, 29), False),
    ("avg_pool1d", "3", (4, 20), False),
    ("avg_pool3d", "(2, 2, 3), stride=(1, 2, 1), padding=(1, 0, 1)", (1, 2, 4, 5, 6), False),
    ("avg_pool3d", "2, stride=1, padding=1, count_include_pad=False", (1, 2, 3, 5, 6), True),
    ("max_pool3d", "(2, 2, 2), stride=(1, 1, 2), dilation=(2, 1, 2)", (1, 2, 5, 5, 7), True),
]
#: the tiny tasks' poolings (template, schedules), also run on non-contiguous inputs
POOLND_CASES: list[tuple[str, str, list[dict[str, Any]]]] = [
    ("04_avgpool1d_relu_scale_fp32.py", "pool1d", [{}, {"strategy": "direct", "BLOCK_H": 4, "BLOCK_W": 16}]),
    ("05_maxpool3d_tanh_fp16.py", "pool3d", [{}, {"strategy": "rows", "BLOCK_H": 4, "BLOCK_W": 32},
                                             {"strategy": "rows", "BLOCK_H": 8, "BLOCK_W": 32, "UNROLL": 4},
                                             {"strategy": "rows", "BLOCK_H": 4, "BLOCK_W": 32, "AHEAD": 2}]),
]
ATTN_TASK = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Model(nn.Module):
        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, {args})


    def get_inputs():
        return [torch.randn({q}, dtype=torch.{dtype}), torch.randn({k}, dtype=torch.{dtype}),
                torch.randn({v}, dtype=torch.{dtype})]


    def get_init_inputs():
        return []
"""
#: attention (arguments, q/k/v shapes, dtype, policy): causal with fewer and with more queries than keys
#: (top-left aligned), fp32 under tf32, keys a multiple of the block
ATTN_VARIANTS = [
    ("is_causal=True", (2, 19, 32), (2, 45, 32), (2, 45, 16), "float16", "strict"),
    ("None, 0.0, True", (1, 2, 45, 16), (1, 2, 19, 16), (1, 2, 19, 16), "bfloat16", "strict"),
    ("is_causal=True, scale=0.5", (2, 21, 24), (2, 21, 24), (2, 21, 24), "float32", "tf32"),
    ("is_causal=True", (1, 24, 16), (1, 32, 16), (1, 32, 16), "float16", "strict"),  # no key tail: unmasked loads
]
#: the tiny tasks' attention (schedules), also on non-contiguous q, k, v; the second schedules walk several
#: key blocks with several query blocks (a causal loop bound per query block)
ATTN_CASES: list[tuple[str, list[dict[str, Any]]]] = [
    ("06_sdpa_causal_tanh_fp16.py", [{}, {"BLOCK_M": 16, "BLOCK_N": 16}]),
    ("07_sdpa_cross_scaled_bf16.py", [{}, {"BLOCK_M": 16, "BLOCK_N": 32}]),
]
GEMM_REDUCE_TASK = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(70, 24, dtype=torch.{dtype}) / 5.0)
            self.b = nn.Parameter(torch.randn(70, dtype=torch.{dtype}))

        def forward(self, x):
            return {body}


    def get_inputs():
        return [torch.randn(13, 24, dtype=torch.{dtype})]


    def get_init_inputs():
        return []
"""
#: GEMM + row reduction (body over `F.linear(x, self.w, self.b)` = y, dtype, policy, schedule): amax keepdim with
#: a NaN-aware max over SPLIT partials, a mean of fp32 operands under tf32, a sum with a column-broadcast prologue
GEMM_REDUCE_VARIANTS = [
    ("torch.amax(F.relu(y), dim=-1, keepdim=True) * 2.0", "bfloat16", "strict",
     {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT": 4}),
    ("torch.mean(y * 0.5, dim=1)", "float32", "tf32", {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT": 1}),
    ("torch.sum(y - self.b, dim=1) - 1.0", "float16", "strict", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT": 2}),
]
#: the tiny task's GEMM + logsumexp: one program per row block (SPLIT 1) and split column groups
GEMM_REDUCE_CASES: list[tuple[str, list[dict[str, Any]]]] = [
    ("08_linear_sigmoid_logsumexp_fp16.py", [{}, {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT": 1},
                                             {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT": 8}]),
]
BCAST_TASK = """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F


        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(5, 1, 7))

            def forward(self, x, y):
                return F.leaky_relu(x * self.w + y, 0.1).clamp(min=-0.5) / 3.0 + F.softplus(x) - F.silu(y)


        def get_inputs():
            return [torch.randn(3, 5, 6, 7), torch.randn(6, 1)]


        def get_init_inputs():
            return []
    """
FLINEAR_TASK = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(24, 40, dtype=torch.bfloat16) / 6.0)
            self.b = nn.Parameter(torch.randn(24, dtype=torch.bfloat16))

        def forward(self, x, y):
            return F.silu(F.linear(x, self.w, self.b)) - y


    def get_inputs():
        return [torch.randn(3, 7, 40, dtype=torch.bfloat16), torch.randn(7, 24, dtype=torch.bfloat16)]


    def get_init_inputs():
        return []
"""
TRANSPOSED_TASK = """
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(24, 40, dtype=torch.bfloat16) / 6.0)

        def forward(self, x):
            return torch.relu(x @ self.w.t()) * 2.0


    def get_inputs():
        return [torch.randn(3, 5, 40, dtype=torch.bfloat16).transpose(0, 1)]  # a strided input of the task's own


    def get_init_inputs():
        return []
"""
REDUCE_TASK = """
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x):
            return {body}


    def get_inputs():
        return [torch.randn(3, 37, 5, 6)]


    def get_init_inputs():
        return []
"""
#: a middle run of dims (columns, axis 0 of the tile), trailing runs (rows), keepdim, prologue and epilogue
REDUCE_BODIES = ["torch.sum(x * 2.0, dim=1, keepdim=True) + 1.0", "torch.amax(torch.relu(x), dim=(2, 3))",
                 "x.mean(dim=-1)"]
NONCONTIGUOUS = ["gaps/01_layernorm_three_dims_fp32.py", "gaps/02_maxpool2d_k4_s1_p1_fp32.py",
                 "gaps/03_softmax_wide_rows_fp32.py"]


def _job(task_path: Path, template: str, params: dict[str, Any], policy: str = "strict", **kw: Any) -> dict[str, Any]:
    a = analyse(load_task(task_path), policy)
    found = [x for x in a.matches if x.template == template]
    assert found, f"{task_path.name}: {template} does not match: {a.rejected}"
    return {"task": str(task_path), "source": found[0].render(params), **kw}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every execution case below, run in one child process under TRITON_INTERPRET=1 (Triton reads it at import),
    once per session."""
    def make(tmp: Path) -> None:
        jobs: dict[str, list[dict[str, Any]]] = {}
        for rel, sizes, template, schedules in CASES:
            path = shrunk(tmp, rel, sizes)
            jobs[Path(rel).stem] = [_job(path, template, p) for p in schedules]
            if rel in NONCONTIGUOUS:
                jobs["noncontiguous-" + Path(rel).stem] = [_job(path, template, {}, noncontiguous=True)]
        for i, (op, args) in enumerate(POOL_VARIANTS):
            path = write_task(tmp, f"pool_task_{i}.py", POOL_TASK.format(op=op, args=args))
            jobs[f"pool-{i}"] = [_job(path, "pool2d", {"strategy": "direct", "BLOCK_H": 8, "BLOCK_W": 16})]
            if "stride=(1," in args:  # unit stride along H: the rolling-window strategy applies
                jobs[f"pool-{i}"] += [_job(path, "pool2d", {"strategy": "rows", "BLOCK_W": 32, **r})
                                      for r in ROWS_SCHEDULES]
        for i, (op, args, shape, rows) in enumerate(POOLND_VARIANTS):
            path = write_task(tmp, f"poolnd_task_{i}.py", POOLND_TASK.format(op=op, args=args, shape=shape))
            tmpl = "pool" + op[-2:]
            jobs[f"poolnd-{i}"] = [_job(path, tmpl, {"strategy": "direct", "BLOCK_H": 4, "BLOCK_W": 16})]
            if rows:
                jobs[f"poolnd-{i}"] += [_job(path, tmpl, {"strategy": "rows", "BLOCK_W": 32, **r})
                                        for r in ROWS_SCHEDULES]
        for name, tmpl, schedules in POOLND_CASES:
            jobs["poolnd-" + name] = [_job(SMALL / name, tmpl, p) for p in schedules]
            jobs["poolnd-noncontiguous-" + name] = [_job(SMALL / name, tmpl, {}, noncontiguous=True)]
        for i, (args, q, k, v, dtype, policy) in enumerate(ATTN_VARIANTS):
            path = write_task(tmp, f"attn_task_{i}.py", ATTN_TASK.format(args=args, q=q, k=k, v=v, dtype=dtype))
            jobs[f"attn-{i}"] = [_job(path, "attention", {"BLOCK_M": 16, "BLOCK_N": 16}, policy)]
        for name, schedules in ATTN_CASES:
            jobs["attn-" + name] = [_job(SMALL / name, "attention", p) for p in schedules]
            jobs["attn-noncontiguous-" + name] = [_job(SMALL / name, "attention", {}, noncontiguous=True)]
        for i, (body, dtype, policy, params) in enumerate(GEMM_REDUCE_VARIANTS):
            task = GEMM_REDUCE_TASK.format(body=body.replace("y", "F.linear(x, self.w, self.b)", 1), dtype=dtype)
            path = write_task(tmp, f"gemm_reduce_task_{i}.py", task)
            jobs[f"gemm_reduce-{i}"] = [_job(path, "gemm_reduce", params, policy)]
        for name, schedules in GEMM_REDUCE_CASES:
            jobs["gemm_reduce-" + name] = [_job(SMALL / name, "gemm_reduce", p) for p in schedules]
            jobs["gemm_reduce-noncontiguous-" + name] = [_job(SMALL / name, "gemm_reduce", {}, noncontiguous=True)]
        for i, body in enumerate(REDUCE_BODIES):
            path = write_task(tmp, f"reduce_task_{i}.py", REDUCE_TASK.format(body=body))
            jobs[f"reduce-{i}"] = [_job(path, "reduce", {})]
        for key, (rel, sizes, template, schedules) in RESIDENT_CASES.items():
            (tmp / key).mkdir()
            jobs[key] = [_job(shrunk(tmp / key, rel, sizes), template, p) for p in schedules]
        for key, (rel, sizes, template, schedules) in {**PIPE_CASES, **STREAM_CASES}.items():
            (tmp / key).mkdir()
            jobs[key] = [_job(shrunk(tmp / key, rel, sizes), template, p) for p in schedules]
        path = write_task(tmp, "bcast.py", BCAST_TASK)
        jobs["bcast"] = [_job(path, "pointwise", {"BLOCK": 512})]
        for name, policy, schedules in GEMM_CASES:
            jobs["gemm-" + name] = [_job(SMALL / name, "gemm", p, policy) for p in schedules]
            jobs["gemm-noncontiguous-" + name] = [_job(SMALL / name, "gemm", {}, policy, noncontiguous=True)]
        path = write_task(tmp, "reserved.py", BCAST_TASK.replace("x, y", "out, h").replace("(x", "(out").replace(
            "x *", "out *").replace("+ y", "+ h").replace("(y)", "(h)"))  # inputs named like the forward's locals
        jobs["reserved"] = [_job(path, "pointwise", {"BLOCK": 512})]
        path = write_task(tmp, "shared_a.py", TRANSPOSED_TASK.replace("x @ self.w.t()", "torch.matmul(self.w, x)").replace(
            "torch.randn(3, 5, 40, dtype=torch.bfloat16).transpose(0, 1)", "torch.randn(3, 40, 17, dtype=torch.bfloat16)"))
        jobs["gemm-shared-a"] = [_job(path, "gemm", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16})]  # batch stride 0 for w
        path = write_task(tmp, "transposed.py", TRANSPOSED_TASK)  # gemm reads w.t() in place; pointwise's cuBLAS does too
        jobs["transposed"] = [_job(path, "gemm", {}), _job(path, "pointwise", {})]
        path = write_task(tmp, "flinear.py", FLINEAR_TASK)  # F.linear on a rank-3 input, a broadcast second input
        jobs["gemm-flinear"] = [_job(path, "gemm", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16})]
        # fp32 operands under tf32 (TF32 dot inputs on the GPU; the interpreter's dot is fp32)
        (tmp / "tf32").mkdir()  # other sizes than CASES' copy of the same task
        path = shrunk(tmp / "tf32", "level2/07_gemm_swish_scale_fp32.py", {"batch": 5, "in_features": 24, "out_features": 33})
        jobs["gemm-tf32"] = [_job(path, "gemm", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, "tf32")]
        # the same under strict: split products on the GPU (bf16x6), a plain product in the interpreter
        jobs["gemm-fp32-strict"] = [_job(path, "gemm", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, "strict"),
                                    _job(path, "gemm", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_AT": "host"},
                                         "strict", noncontiguous=True)]
        # planted bugs: a normalization off by 1%, a max pool that skips the last window column, a GEMM that skips
        # the K tail (the last 8 of 40), a 3-D max pool that skips the last depth of its window, a causal attention
        # whose mask lets each query see one key past the diagonal
        norm = jobs["01_layernorm_three_dims_fp32"][0]
        pool = jobs["02_maxpool2d_k4_s1_p1_fp32"][0]
        gemm = jobs["gemm-01_linear_gelu_scale_residual_fp16.py"][1]
        pool3 = jobs["poolnd-05_maxpool3d_tanh_fp16.py"][0]
        attn = jobs["attn-06_sdpa_causal_tanh_fp16.py"][1]
        red = jobs["gemm_reduce-08_linear_sigmoid_logsumexp_fp16.py"][1]  # 10 column tiles of 16: skip the last 5
        good = [norm, pool, gemm, pool3, attn, red]
        bad = [norm["source"].replace("rstd = 1.0 / tl.sqrt_rn(", "rstd = 1.01 / tl.sqrt_rn("),
               pool["source"].replace("tl.static_range(4)", "tl.static_range(3)", 2),
               gemm["source"].replace("for kk in range(0, 40, BLOCK_K):", "for kk in range(0, 32, BLOCK_K):"),
               pool3["source"].replace("for kd in tl.static_range(2):", "for kd in tl.static_range(1):"),
               attn["source"].replace("(rn[None, :] <= rm[:, None])", "(rn[None, :] <= rm[:, None] + 1)"),
               red["source"].replace("for nt in range(split, 10, SPLIT):", "for nt in range(split, 5, SPLIT):")]
        assert all(b != g["source"] for b, g in zip(bad, good, strict=True))
        jobs["planted"] = [{"task": g["task"], "source": b} for b, g in zip(bad, good, strict=True)]
        flat = [{**j, "record": True} for js in jobs.values() for j in js]
        results = iter(run_jobs(flat, keep_sources=True))
        (tmp / "results.json").write_text(json.dumps({k: [next(results) for _ in js] for k, js in jobs.items()}))

    results: dict[str, list[dict[str, Any]]] = json.loads(
        (computed_once(tmp_path_factory, "templates-interpreted", make) / "results.json").read_text())
    return results


def _assert_all_pass(results: list[dict[str, Any]]) -> None:
    assert results
    for r in results:
        assert r["ok"], r


@pytest.mark.slow
@pytest.mark.parametrize("name", [Path(c[0]).stem for c in CASES])
def test_rendered_model_new_matches_the_model_under_the_interpreter(interpreted: dict[str, Any], name: str) -> None:
    _assert_all_pass(interpreted[name])


@pytest.mark.slow
@pytest.mark.parametrize("key", list(RESIDENT_CASES))
def test_a_resident_schedule_computes_the_model_where_no_team_can_run(interpreted: dict[str, Any], key: str) -> None:
    results = interpreted[key]
    _assert_all_pass(results)
    for r in results:  # the persistent kernel is in the source, and only the two-kernel path ran here
        assert "_resident_kernel(" in r["candidate_source"] and "if h.is_cuda:" in r["candidate_source"]
        assert all("_resident_kernel" not in x["kernel"] for x in r["launches"]), r["launches"]


@pytest.mark.slow
@pytest.mark.parametrize("key", list(STREAM_CASES))
def test_a_stream_schedule_computes_the_model_where_no_team_can_run(interpreted: dict[str, Any], key: str) -> None:
    results = interpreted[key]
    _assert_all_pass(results)
    for r in results:  # the persistent kernel is in the source; here the two kernels ran, a pair per launch
        assert "def _norm_stream_kernel(" in r["candidate_source"] and "if h.is_cuda:" in r["candidate_source"]
        kernels = [x["kernel"] for x in r["launches"]]
        assert kernels and all(k.endswith(("_norm_stats_kernel", "_norm_apply_kernel")) for k in kernels), kernels


@pytest.mark.slow
@pytest.mark.parametrize("key", list(PIPE_CASES))
def test_a_pipelined_schedule_computes_the_model(interpreted: dict[str, Any], key: str) -> None:
    results = interpreted[key]
    _assert_all_pass(results)
    for r in results:  # the first group's partials, then a launch a group
        kernels = [x["kernel"] for x in r["launches"]]
        assert kernels[0].endswith("_norm_stats_kernel") and all(k.endswith("_norm_pipe_kernel") for k in kernels[1:])
        assert len(kernels) > 1, r["launches"]


@pytest.mark.slow
@pytest.mark.parametrize("rel", NONCONTIGUOUS)
def test_non_contiguous_inputs_are_read_by_value(interpreted: dict[str, Any], rel: str) -> None:
    _assert_all_pass(interpreted["noncontiguous-" + Path(rel).stem])


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(POOL_VARIANTS)), ids=[f"{o}({a})" for o, a in POOL_VARIANTS])
def test_pooling_variants_with_prologue_and_epilogue(interpreted: dict[str, Any], tmp_path: Path, i: int) -> None:
    op, args = POOL_VARIANTS[i]
    [m] = match(load_task(write_task(tmp_path, "pool_task.py", POOL_TASK.format(op=op, args=args))))
    assert m.template == "pool2d"
    assert describe(m.chain.prologue) == "mul(relu(x), scale)" and "sigmoid" in describe(m.chain.epilogue)
    _assert_all_pass(interpreted[f"pool-{i}"])


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(POOLND_VARIANTS)), ids=[f"{v[0]}({v[1]}){v[2]}" for v in POOLND_VARIANTS])
def test_1d_and_3d_pooling_variants(interpreted: dict[str, Any], tmp_path: Path, i: int) -> None:
    op, args, shape, rows = POOLND_VARIANTS[i]
    [m] = match(load_task(write_task(tmp_path, "poolnd_task.py", POOLND_TASK.format(op=op, args=args, shape=shape))))
    assert m.template == "pool" + op[-2:] and describe(m.chain.prologue) == "mul(relu(x), scale)"
    assert m.schedule_space()["strategy"] == (("direct", "rows") if rows else ("direct",))
    _assert_all_pass(interpreted[f"poolnd-{i}"])


@pytest.mark.slow
@pytest.mark.parametrize("name", [c[0] for c in POOLND_CASES])
def test_1d_and_3d_pooling_tasks_on_tails_and_strided_inputs(interpreted: dict[str, Any], name: str) -> None:
    _assert_all_pass(interpreted["poolnd-" + name])
    _assert_all_pass(interpreted["poolnd-noncontiguous-" + name])


def _ahead(result: dict[str, Any]) -> int:
    """The `AHEAD` of the schedule a result's source was rendered for (its header; 0 where it has none)."""
    found = re.search(r"^# schedule: (.*)$", result["candidate_source"], re.M)
    assert found, "no schedule line in the source"
    return int(json.loads(found.group(1)).get("AHEAD", 0))


@pytest.mark.slow
def test_pool_rows_prefetch_matches_the_model_under_the_interpreter(interpreted: dict[str, Any]) -> None:
    """`rows` with input rows loaded 1 and 2 iterations ahead: max and average (padding counted or not), with
    the prologue and epilogue, 2-D and 3-D, fp32 and fp16, on masked tails (output rows and columns that are not
    multiples of the blocks, strips that end past the input)."""
    ahead = [r for k, rs in interpreted.items() if k.startswith(("pool-", "poolnd-", "02_maxpool")) for r in rs
             if "_rows_kernel" in r["candidate_source"] and _ahead(r) > 0]
    _assert_all_pass(ahead)
    heads = [r["candidate_source"].splitlines()[0] for r in ahead]  # "# kstrata template `pool3d`: max_pool3d ..."
    assert {("max_pool" in h, "pool3d" in h) for h in heads} == {(True, False), (False, False), (True, True), (False, True)}
    assert {_ahead(r) for r in ahead} == {1, 2} and len(ahead) >= 10
    [src] = [r["candidate_source"] for r in interpreted["poolnd-05_maxpool3d_tanh_fp16.py"] if _ahead(r) == 2]
    assert "xn_5 = tl.load(" in src and "x = x0_5.to(tl.float32)" in src  # fp16 carried raw, converted when reduced


@pytest.mark.slow
def test_pool_rows_unrolled_matches_the_model_under_the_interpreter(interpreted: dict[str, Any]) -> None:
    """`rows` unrolled (1, 2 and 4 output rows an iteration): max pooling with its taps clamped into the input
    where the dilation is 1 and masked where it is not (3-D, dilation 2 along depth and width), average with
    masks (padding counted or not), 2-D and 3-D, fp32 and fp16, on masked tails."""
    def unroll(r: dict[str, Any]) -> int:
        found = re.search(r"^# schedule: (.*)$", r["candidate_source"], re.M)
        assert found
        return int(json.loads(found.group(1)).get("UNROLL", 1))

    rolled = [r for k, rs in interpreted.items() if k.startswith(("pool-", "poolnd-", "02_maxpool")) for r in rs
              if "_rows_kernel" in r["candidate_source"] and _ahead(r) == 0]
    _assert_all_pass(rolled)
    assert all("for r0 in range(0, BLOCK_H, " in r["candidate_source"] for r in rolled)
    assert {unroll(r) for r in rolled} == {1, 2, 4} and len(rolled) >= 12
    heads = [r["candidate_source"].splitlines()[0] for r in rolled]
    assert {("max_pool" in h, "pool3d" in h) for h in heads} == {(True, False), (False, False), (True, True), (False, True)}
    clamped = [r for r in rolled if "= tl.minimum(tl.maximum(ow * " in r["candidate_source"]]
    masked = [r for r in rolled if "max_pool3d" in r["candidate_source"].splitlines()[0]
              and "dilation (2, 1, 2)" in r["candidate_source"].splitlines()[0]]
    assert clamped and masked and all("cm0 = owm & (iw0 >= 0)" in r["candidate_source"] for r in masked)


#: the child that runs `rows` on inputs with NaNs under the interpreter: argv task, candidates (JSON); prints, per
#: candidate, None when its output has NaNs where the model's has and equals it elsewhere, else why not
NAN_SCRIPT = """
import json, sys
import torch
from kstrata.agents.tasks import import_task_module
task = import_task_module(sys.argv[1])
torch.manual_seed(0)
x = task.get_inputs()[0]
for at in ((0, 0, 0, 3), (0, 1, 4, 0), (0, 1, 5, 6), (-1, -1, -1, -1)):  # first row, rows at a strip's edge, corner
    x[(slice(None),) * (x.dim() - 4) + at] = float("nan")
with torch.no_grad():
    torch.manual_seed(1)
    ref = task.Model(*task.get_init_inputs())(x)
    why = []
    for path in json.loads(sys.argv[2]):
        torch.manual_seed(1)
        out = import_task_module(path).ModelNew(*task.get_init_inputs())(x)
        nan = torch.isnan(ref)
        if not bool(nan.any()) or not torch.equal(nan, torch.isnan(out)):
            why.append(f"NaNs at {torch.isnan(out).sum()} outputs, the model's at {nan.sum()}")
        elif not torch.allclose(out[~nan].float(), ref[~nan].float(), rtol=1e-3, atol=1e-5):
            why.append("differs where the model's output is a number")
        else:
            why.append(None)
print(json.dumps(why))
"""


@pytest.mark.slow
def test_pool_rows_prefetch_propagates_nan_like_pytorch(tmp_path: Path) -> None:
    """A NaN in a window makes its max or average NaN (PyTorch's pooling), whichever iteration loaded it: the
    unrolled loop (1, 2 and 4 rows an iteration; a max's taps clamped into the input: a NaN on the edge is read
    again by the clamped taps, never lost or spread past its windows), rows loaded 1 and 2 ahead and the direct
    strategy (its max taps clamped too), 2-D max and average with a prologue, 3-D max in fp16."""
    import os
    import subprocess
    import sys

    rows = {"strategy": "rows", "BLOCK_W": 32}
    tasks = [shrunk(tmp_path, "gaps/02_maxpool2d_k4_s1_p1_fp32.py", {"batch": 1, "channels": 2, "height": 11, "width": 19}),
             write_task(tmp_path, "avg.py", POOL_TASK.format(op="avg_pool2d", args=POOL_VARIANTS[1][1])),
             write_task(tmp_path, "max.py", POOL_TASK.format(op="max_pool2d", args=POOL_VARIANTS[3][1])),
             SMALL / "05_maxpool3d_tanh_fp16.py"]
    for task in tasks:
        m = next(x for x in match(load_task(task)) if x.template.startswith("pool"))
        cands = []
        direct = {"strategy": "direct", "BLOCK_H": 4, "BLOCK_W": 16, "AHEAD": 0, "UNROLL": 1}
        for i, r in enumerate([*({**rows, **r} for r in ROWS_SCHEDULES), direct]):
            cand = tmp_path / f"{task.stem}_rows{i}.py"
            cand.write_text(m.render(r))
            cands.append(str(cand))
        proc = subprocess.run([sys.executable, "-c", NAN_SCRIPT, str(task), json.dumps(cands)], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout.strip().splitlines()[-1]) == [None] * (len(ROWS_SCHEDULES) + 1), task.name


def test_pool_rows_prefetch_is_a_rows_schedule_the_tuner_tries_early(tmp_path: Path) -> None:
    """AHEAD and UNROLL are in the space for `rows` only (a direct schedule keeps 0 and 1: no duplicates), the
    full-size gap task's default is the unrolled loop and its hints try the prefetch (the H100's fastest), then
    two outputs a thread;
    the unrolled loop reduces the window's first rows before it, clamps a max pooling's taps into the input
    (no masks), and the carried loads are bounded per thread."""
    m = one(GAPS / "02_maxpool2d_k4_s1_p1_fp32.py", "pool2d")
    d = m.default_params()
    assert m.schedule_space()["AHEAD"] == ROWS_AHEAD and m.schedule_space()["UNROLL"] == (1, 2, 4)
    assert d == {"strategy": "rows", "BLOCK_H": 32, "BLOCK_W": 128, "num_warps": 4, "AHEAD": 0, "UNROLL": 4}
    # the tuner times the default, then the hints in order (tune.autotune)
    assert m.hint_params() == [{**d, "AHEAD": 1, "UNROLL": 1, "BLOCK_W": 256}, {**d, "BLOCK_W": 256},
                               {**d, "UNROLL": 1, "BLOCK_W": 256}, {**d, "UNROLL": 2, "BLOCK_W": 256},
                               {**d, "AHEAD": 1, "UNROLL": 1}, {**d, "BLOCK_W": 256, "BLOCK_H": 64},
                               {**d, "num_warps": 2}, {**d, "AHEAD": 2, "UNROLL": 1},
                               {**d, "num_warps": 2, "AHEAD": 1, "UNROLL": 1}]
    configs = m.configs()
    assert all(c["AHEAD"] == 0 and c["UNROLL"] == 1 for c in configs if c["strategy"] == "direct")
    assert {c["AHEAD"] for c in configs if c["strategy"] == "rows"} == set(ROWS_AHEAD)
    assert all(c["UNROLL"] == 1 for c in configs if c["AHEAD"])
    for bad in ({"strategy": "direct", "BLOCK_H": 8, "BLOCK_W": 64, "AHEAD": 1, "UNROLL": 1},
                {"strategy": "direct", "BLOCK_H": 8, "BLOCK_W": 64, "UNROLL": 2}, {"AHEAD": 1, "UNROLL": 4}):
        with pytest.raises(ValueError, match="not valid"):
            m.render(bad)
    plain = m.render()
    assert "    " + textwrap.dedent("""
            iw0 = tl.minimum(tl.maximum(ow * 1 + (-1), 0), 383)
            iw1 = tl.minimum(tl.maximum(ow * 1 + (0), 0), 383)
            iw2 = tl.minimum(tl.maximum(ow * 1 + (1), 0), 383)
            iw3 = tl.minimum(tl.maximum(ow * 1 + (2), 0), 383)
            h0 = tl.full([BLOCK_W], float('-inf'), tl.float32)
            h1 = tl.full([BLOCK_W], float('-inf'), tl.float32)
            h2 = tl.full([BLOCK_W], float('-inf'), tl.float32)
            for u in tl.static_range(3):
                ih = oh0 + u - 1
                ih = tl.minimum(tl.maximum(ih, 0), 383)
                hm = tl.full([BLOCK_W], float('-inf'), tl.float32)
                rb = in_base + ih * 384
                rp = h_ptr + rb
                idx = rb + iw0
                x = tl.load(rp + iw0).to(tl.float32)
            """)[1:].replace("\n", "\n    ") in plain
    assert "    for r0 in range(0, BLOCK_H, 4):\n        for u in tl.static_range(4):\n            ih = oh0 + r0 + u + 2\n" in plain
    assert "om = owm & (ohr < 383)" in plain and "mask=" not in plain.split("tl.store(")[0].split("def _pool2d")[1]
    assert "xn_" not in plain and "ihn" not in plain
    # an average counts its pads: masked taps, nothing clamped
    avg = one(write_task(tmp_path, "avg.py", POOL_TASK.format(op="avg_pool2d", args=POOL_VARIANTS[1][1])), "pool2d")
    avg_src = avg.render({"strategy": "rows", "BLOCK_H": 8, "BLOCK_W": 32, "UNROLL": 2})
    assert "cm0 = owm & (iw0 >= 0) & (iw0 < " in avg_src and "tl.minimum(tl.maximum(" not in avg_src
    assert "rowm = (ih >= 0) & (ih < " in avg_src and "m = cm0 & rowm" in avg_src
    # AHEAD 2: rows 0 and 1 loaded before the loop, row r + 2 at the top of iteration r (none past the strip's
    # last row), the carried rows shifted at its end; the taps unrolled (a carried value a tap)
    two = m.render({"AHEAD": 2, "UNROLL": 1})
    assert "x1_3 = tl.load(h_ptr + (idxp), mask=mp, other=float('-inf'))\n    for r in range(0, BLOCK_H + 3):" in two
    assert "rowmn = (ihn >= 0) & (ihn < 384) & (r + 2 < BLOCK_H + 3)" in two
    assert two.index("xn_3 = tl.load(") < two.index("x = x0_0.to(tl.float32)") < two.index("tl.store(")
    shift = "".join(f"        x0_{t} = x1_{t}\n" for t in range(4)) + "".join(f"        x1_{t} = xn_{t}\n" for t in range(4))
    assert two.index("tl.store(") < two.index(shift)
    assert "tl.static_range" not in two.split("def _pool2d_rows_kernel(")[1].split("class ModelNew")[0]
    # a thread carries at most 64 prefetched values: 2 rows of 27 taps at 4 columns a thread is past it
    path = write_task(tmp_path, "big.py", POOLND_TASK.format(op="max_pool3d", args="3, stride=1, padding=1",
                                                             shape=(1, 2, 4, 5, 6)))
    big = one(path, "pool3d")
    wide = {"strategy": "rows", "BLOCK_H": 4, "BLOCK_W": 256, "num_warps": 2}
    assert big._valid({**wide, "AHEAD": 1}) and not big._valid({**wide, "AHEAD": 2})
    assert big.hint_params() == []  # no pool3d hints: the tuner reaches AHEAD one parameter at a time


@pytest.mark.slow
def test_full_size_pool_rows_prefetch_schedules_compile_for_the_gpu() -> None:
    """The gap task's default and its hinted schedules at full size (the unrolled loop at 1 and 2 outputs a thread,
    the prefetching loop) compile for cuda:90."""
    m = one(GAPS / "02_maxpool2d_k4_s1_p1_fp32.py", "pool2d")
    recorded = []
    for params in (m.default_params(), *m.hint_params()):
        recorded.append({"candidate_source": m.render(params), "launches": [{
            "kernel": "_pool2d_rows_kernel", "num_warps": params["num_warps"],
            "signature": {"h_ptr": "*fp32", "out_ptr": "*fp32", "BLOCK_H": "constexpr", "BLOCK_W": "constexpr"},
            "constexprs": {"BLOCK_H": params["BLOCK_H"], "BLOCK_W": params["BLOCK_W"]}, "divisible": ["h_ptr", "out_ptr"]}]})
    assert [_ahead(r) for r in recorded] == [0, 1, 0, 0, 0, 1, 0, 0, 2, 1]
    failures = compile_recorded(recorded, "cuda:90")
    assert failures == [[] for _ in recorded], [f for f in failures if f]


@pytest.mark.slow
def test_the_max_pool_loop_is_short_on_the_gpu(tmp_path: Path) -> None:
    """The gap task's max pool (4x4, stride 1) measured 550-654 us on the H200 (2026-12-04) against 296 us for its
    bytes at the copy bandwidth, at 75% issue: its loop had 46 SASS instructions an output (2 outputs a thread,
    cuda:90), most of them a tap's address, mask and pad. Compiled for cuda:90, the window's maxima are single
    `max.NaN.f32`, no NaN compare or mask is left in the unrolled loop (the taps are clamped into the input), and
    it is at most 36 SASS instructions an output (32 when measured)."""
    import subprocess

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kstrata.agents.tasks import import_task_module

    m = one(GAPS / "02_maxpool2d_k4_s1_p1_fp32.py", "pool2d")
    path = tmp_path / "pool.py"
    path.write_text(m.render({"strategy": "rows", "BLOCK_H": 32, "BLOCK_W": 256, "num_warps": 4, "UNROLL": 4}))
    fn = import_task_module(path)._pool2d_rows_kernel
    src = ASTSource(fn, {"h_ptr": "*fp32", "out_ptr": "*fp32", "BLOCK_H": "constexpr", "BLOCK_W": "constexpr"},
                    {"BLOCK_H": 32, "BLOCK_W": 256}, {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    ptx = str(k.asm["ptx"])
    loop = ptx.split("// =>This Inner Loop Header")[1].split("bra")[0]
    assert "max.NaN.f32" in loop and "setp.nan" not in loop and "selp" not in loop, loop
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(k.asm["cubin"])
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    sass = subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4})\*/\s+([^;]*);", sass)]
    back = [(int(t.split("BRA ")[1].split()[0], 16), a) for a, t in ins if "BRA 0x" in t
            and int(t.split("BRA ")[1].split()[0], 16) < a]
    assert len(back) == 1, back
    start, end = back[0]
    body = [t for a, t in ins if start <= a <= end]
    loads = sum(1 for t in body if "LDG" in t)
    assert loads == 4 * 4 * 2  # 4 rows an iteration, 4 taps a row, 2 outputs a thread
    assert len(body) / (4 * 2) <= 36, len(body)


@pytest.mark.slow
def test_the_norm_statistics_loop_divides_once_a_step(tmp_path: Path) -> None:
    """The `split` statistics kernel of the LayerNorm gap task measured 96.7 us at 86% issue, math-pipe throttled
    (H200, 2026-12-04), for 268 MB that stream in about 65 us: its Welford loop divided every value by the lane's
    count (about 9 SASS instructions a division). An unmasked lane's count is the step's number, so the loop
    takes one reciprocal a step: compiled for cuda:90, at most one division in the loop for 4 values a thread."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kstrata.agents.tasks import import_task_module

    m = one(GAPS / "01_layernorm_three_dims_fp32.py", "norm")
    path = tmp_path / "norm.py"
    path.write_text(m.render({"strategy": "split", "BLOCK_M": 1, "BLOCK": 2048, "SPLIT": 128, "GROUP_ROWS": 0,
                              "num_warps": 16}))
    fn = import_task_module(path)._norm_stats_kernel
    sig = {a: "constexpr" if a == "BLOCK" else ("*fp32" if a.endswith("_ptr") else "i32") for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a.endswith("_ptr")}
    ptx = str(triton.compile(ASTSource(fn, sig, {"BLOCK": 2048}, attrs), target=GPUTarget("cuda", 90, 32),
                             options={"num_warps": 16}).asm["ptx"])
    loop = ptx.split("// =>This Inner Loop Header")[1].split("bra")[0]
    assert loop.count("ld.global.v4") == 1 and loop.count("div.") == 1, loop


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(ATTN_VARIANTS)), ids=[f"{v[0]} {v[1]}x{v[2]} {v[4]}" for v in ATTN_VARIANTS])
def test_attention_variants(interpreted: dict[str, Any], i: int) -> None:
    _assert_all_pass(interpreted[f"attn-{i}"])
    if ATTN_VARIANTS[i][5] == "tf32":
        assert 'input_precision="tf32"' in interpreted[f"attn-{i}"][0]["candidate_source"]


@pytest.mark.slow
@pytest.mark.parametrize("name", [c[0] for c in ATTN_CASES])
def test_attention_tasks_on_tails_and_strided_inputs(interpreted: dict[str, Any], name: str) -> None:
    _assert_all_pass(interpreted["attn-" + name])
    _assert_all_pass(interpreted["attn-noncontiguous-" + name])


def test_attention_reads_its_options_and_rejections_say_why(tmp_path: Path) -> None:
    m = one(SMALL / "06_sdpa_causal_tanh_fp16.py", "attention")
    assert m.description.startswith("causal attention over 6 batch x heads, 37 queries x 37 keys, head dims 40/40")
    src = m.render()
    assert "q = q_in.reshape(2, 3, 37, 40)" in src  # inputs named like the forward's locals are renamed and "(rn[None, :] <= rm[:, None])" in src
    assert "tl.minimum(37, (pid_m + 1) * BLOCK_M)" in src  # a causal block stops at its diagonal
    assert "rd = tl.arange(0, 64)" in src  # head dim 40 padded to 64, masked
    cross = one(SMALL / "07_sdpa_cross_scaled_bf16.py", "attention")
    assert "scale 0.3," in cross.description and "UPCAST=q.device.type == 'cpu'" in cross.render()
    assert "(rn[None, :] <= rm[:, None])" not in cross.render()
    full = one(TASKS_DIR / "level1" / "31_sdpa_causal_fp16.py", "attention")
    assert full.default_params() == {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    assert "kt = tl.load(k_base + rn[None, :] * skn + rd[:, None] * skd)\n" in full.render()  # no tail: no mask

    def reason(args: str, dtype: str = "float16", policy: str = "strict", k: tuple[int, ...] = (2, 8, 16)) -> str:
        path = write_task(tmp_path, "attn.py", ATTN_TASK.format(args=args, q=(2, 8, 16), k=k, v=(2, 8, 16), dtype=dtype))
        return {r.template: r.reason for r in analyse(load_task(path), policy).rejected}["attention"]

    assert "only under --precision tf32" in reason("is_causal=True", "float32")
    assert reason("dropout_p=0.1").endswith("attention with dropout (random in eval mode too)")
    assert reason("", k=(1, 8, 16)) == "attention with batch dims (2,), (1,), (2,) that broadcast"
    masked = write_task(tmp_path, "masked.py", ATTN_TASK.format(args="self.mask", q=(2, 8, 16), k=(2, 8, 16),
                                                               v=(2, 8, 16), dtype="float16").replace(
        "    class Model(nn.Module):\n", "    class Model(nn.Module):\n        def __init__(self):\n            super().__init__()\n"
        "            self.register_buffer('mask', torch.ones(8, 8, dtype=torch.bool).tril())\n\n"))
    # a mask (a bool buffer here) is read by the template; test_attention_template.py has the mask and GQA cases
    assert "boolean attn_mask" in one(masked, "attention").description


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(GEMM_REDUCE_VARIANTS)), ids=[v[0] for v in GEMM_REDUCE_VARIANTS])
def test_gemm_reduce_variants(interpreted: dict[str, Any], i: int) -> None:
    [r] = interpreted[f"gemm_reduce-{i}"]
    assert r["ok"], r
    split = GEMM_REDUCE_VARIANTS[i][3]["SPLIT"]
    assert ("def _gemm_reduce_combine(" in r["candidate_source"]) == (split > 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", [c[0] for c in GEMM_REDUCE_CASES])
def test_gemm_reduce_task_on_tails_and_strided_inputs(interpreted: dict[str, Any], name: str) -> None:
    _assert_all_pass(interpreted["gemm_reduce-" + name])
    _assert_all_pass(interpreted["gemm_reduce-noncontiguous-" + name])


def test_gemm_reduce_schedules_and_rejections(tmp_path: Path) -> None:
    big = one(TASKS_DIR / "level2" / "09_gemm_logsumexp_bf16.py", "gemm_reduce")
    d = big.default_params()  # 32 row blocks of 128: the smallest SPLIT for at least 264 programs is 16
    assert (d["BLOCK_M"], d["BLOCK_N"], d["SPLIT"]) == (128, 128, 16) and "GROUP_M" not in d
    assert "logsumexp over its 8192 columns" in big.description
    assert not big._valid({**d, "BLOCK_N": 256, "SPLIT": 64})  # 32 column tiles cannot feed 64 splits
    small = one(SMALL / "08_linear_sigmoid_logsumexp_fp16.py", "gemm_reduce")
    assert small.default_params()["SPLIT"] == 2  # one row block: split its 2 column tiles

    def reason(body: str, dtype: str = "float16", policy: str = "strict") -> str:
        task = GEMM_REDUCE_TASK.format(body=body.replace("y", "F.linear(x, self.w, self.b)", 1), dtype=dtype)
        path = write_task(tmp_path, "gr.py", task)
        return {r.template: r.reason for r in analyse(load_task(path), policy).rejected}["gemm_reduce"]

    assert reason("torch.sum(y, dim=0)") == "sum over dims (0,) of the product, not its last dim alone"
    assert reason("torch.sum(y)") == "sum over dims None of the product, not its last dim alone"
    fp32 = write_task(tmp_path, "gr32.py", GEMM_REDUCE_TASK.format(body="torch.sum(F.linear(x, self.w, self.b), dim=1)",
                                                                  dtype="float32"))
    assert 'input_precision="bf16x6")' in one(fp32, "gemm_reduce").render()  # fp32 under strict: split products
    assert reason("torch.relu(y)") == "the graph has no sum/mean/amax/logsumexp after the product"


def test_pooling_rejections_say_why(tmp_path: Path) -> None:
    a = analyse(load_task(SMALL / "05_maxpool3d_tanh_fp16.py"))
    why = {r.template: r.reason for r in a.rejected}
    assert why["pool1d"] == "the graph has no 1-D pooling" and why["pool2d"] == "the graph has no 2-D pooling"
    path = write_task(tmp_path, "ceil.py", POOLND_TASK.format(op="max_pool1d", args="3, ceil_mode=True", shape=(2, 3, 9)))
    a = analyse(load_task(path))
    assert not a.matches and all("max_pool1d with ceil_mode or return_indices" in r.reason for r in a.rejected)


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(REDUCE_BODIES)), ids=REDUCE_BODIES)
def test_reductions_over_dim_runs(interpreted: dict[str, Any], i: int) -> None:
    _assert_all_pass(interpreted[f"reduce-{i}"])


@pytest.mark.slow
def test_pointwise_broadcasts_parameters_and_second_inputs(interpreted: dict[str, Any]) -> None:
    _assert_all_pass(interpreted["bcast"])


@pytest.mark.slow
@pytest.mark.parametrize("name", [c[0] for c in GEMM_CASES])
def test_gemm_with_epilogue_matches_the_model_on_tails_and_strided_inputs(interpreted: dict[str, Any], name: str) -> None:
    _assert_all_pass(interpreted["gemm-" + name])
    _assert_all_pass(interpreted["gemm-noncontiguous-" + name])


@pytest.mark.slow
def test_gemm_on_fp32_operands_under_tf32(interpreted: dict[str, Any]) -> None:
    [r] = interpreted["gemm-tf32"]
    assert r["ok"], r
    assert 'input_precision="tf32"' in r["candidate_source"] and "allow_tf32 = True" in r["candidate_source"]


@pytest.mark.slow
def test_gemm_on_fp32_operands_under_strict(interpreted: dict[str, Any]) -> None:
    kernel, host = interpreted["gemm-fp32-strict"]
    assert kernel["ok"] and host["ok"], (kernel, host)
    assert 'input_precision="bf16x6"' in kernel["candidate_source"] and "allow_tf32 = True" not in kernel["candidate_source"]
    assert "b = _split_bf16x3(b)" in host["candidate_source"]
    assert {x["kernel"] for x in host["launches"]} == {"_split_bf16x3_kernel", "_gemm_kernel"}


def test_gemm_reads_the_product_and_its_epilogue() -> None:
    """Which operand layouts the kernel is given (a weight read transposed, batch dims flattened or shared)."""
    linear = one(SMALL / "01_linear_gelu_scale_residual_fp16.py", "gemm")
    assert linear.description.startswith("linear 37x72x40 (BxMxNxK) float16 in Triton (fp32 accumulation) + bias")
    src = linear.render()
    assert "b = self.linear.weight.t()" in src and "self.linear.bias" in src and "UPCAST=False" in src
    shared = one(SMALL / "03_matmul_shared_weight_relu_fp16.py", "gemm")
    src = shared.render()
    assert "a = x.reshape(120, 48)" in src and "0, b.stride(0), b.stride(1)" in src  # (2, 3, 20) rows, one weight
    assert shared.description.startswith("matmul 120x36x48 (BxMxNxK)")
    bmm = one(SMALL / "02_bmm_tanh_scale_bf16.py", "gemm")
    assert "UPCAST=a.device.type == 'cpu'" in bmm.render()  # the interpreter's bf16 dot (module docstring)


@pytest.mark.slow
def test_inputs_named_like_the_forwards_locals_are_renamed(interpreted: dict[str, Any]) -> None:
    """A task whose inputs are `out` and `h` (the forward's output buffer and head): renamed `out_in`, `h_in`,
    they are read, not the buffers (before, `out = torch.empty(...)` replaced the input the kernel then read)."""
    [r] = interpreted["reserved"]
    assert r["ok"], r
    assert "def forward(self, out_in, h_in):" in r["candidate_source"]


@pytest.mark.slow
def test_transposed_operands_are_read_as_views(interpreted: dict[str, Any], tmp_path: Path) -> None:
    """`w.t()`, `A.T`, `x.mT`, `x.transpose(-2, -1)` of an input or parameter are library-op operands (strided
    views, not copies); a transpose of other dims is not."""
    _assert_all_pass(interpreted["transposed"])
    gemm_src, pointwise_src = (r["candidate_source"] for r in interpreted["transposed"])
    assert "b = self.w.transpose(-1, -2)" in gemm_src and "torch.matmul(x, self.w.transpose(-1, -2))" in pointwise_src
    assert "a = a_in.transpose(-1, -2)" in one(TASKS_DIR / "level1" / "05_gemm_transposed_a_fp16.py", "gemm").render()
    for view, ok in (("x.mT", True), ("x.transpose(-2, -1)", True), ("torch.transpose(x, 2, 1)", True),
                     ("x.transpose(0, 1)", False)):
        path = write_task(tmp_path, "t.py", TRANSPOSED_TASK.replace("x @ self.w.t()", f"torch.bmm({view}, y)").replace(
            "def forward(self, x):", "def forward(self, x, y):").replace(
            "torch.randn(3, 5, 40, dtype=torch.bfloat16).transpose(0, 1)]",
            "torch.randn(4, 4, 4, dtype=torch.bfloat16), torch.randn(4, 4, 8, dtype=torch.bfloat16)]"))
        a = analyse(load_task(path))
        if ok:
            assert one(path, "gemm").render().count(".transpose(-1, -2)") == 1
        else:
            assert not a.matches and "transpose() has no template" in a.rejected[0].reason


@pytest.mark.slow
def test_gemm_with_a_first_operand_shared_by_the_batch(interpreted: dict[str, Any]) -> None:
    [r] = interpreted["gemm-shared-a"]
    assert r["ok"], r
    assert "_gemm_kernel[(4, 3)](a, b, out, 0, a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2)" in \
        r["candidate_source"]


@pytest.mark.slow
def test_gemm_of_functional_linear_on_a_rank3_input(interpreted: dict[str, Any]) -> None:
    [r] = interpreted["gemm-flinear"]
    assert r["ok"], r
    src = r["candidate_source"]
    assert "a = x.reshape(21, 40)" in src and "b = self.w.t()" in src and "self.b" in src


def test_gemm_schedule_space_rules_out_what_cannot_run() -> None:
    m = one(TASKS_DIR / "level2" / "01_gemm_bias_relu_fp16.py", "gemm")
    space = m.schedule_space()
    assert set(space) == {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "SPLIT_AT"}
    assert m.default_params() == {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4,
                                  "num_stages": 4, "SPLIT_AT": "kernel"}
    base = m.default_params()
    assert not m._valid({**base, "SPLIT_AT": "host"})  # fp16 operands: nothing to split
    fp32 = one(TASKS_DIR / "level2" / "07_gemm_swish_scale_fp32.py", "gemm")
    host = {**fp32.default_params(), "SPLIT_AT": "host", "BLOCK_K": 32, "num_warps": 8}
    assert fp32._valid({**host, "num_stages": 4}) and not fp32._valid({**host, "BLOCK_K": 64, "num_stages": 3})  # 288 KiB
    assert not fp32._valid({**host, "num_warps": 4})  # the step tile beside the accumulator: 256 fp32 a thread
    src = fp32.render(host)
    assert "a = _split_bf16x3(a)" in src and "b = _split_bf16x3(b)" in src and "SPLIT_AT" not in src.split("class ModelNew")[1]
    assert "input_precision" not in src.split("def _gemm_kernel")[1]  # six products of bf16 tiles
    assert not m._valid({**base, "BLOCK_M": 256, "BLOCK_N": 256, "num_warps": 8})  # 256 fp32 accumulators a thread
    assert m._valid({**base, "BLOCK_N": 256, "num_warps": 8, "num_stages": 3})
    assert not m._valid({**base, "BLOCK_N": 256, "BLOCK_K": 128, "num_warps": 8, "num_stages": 3})  # 288 KiB smem
    assert len(m.hint_params()) == 4 and all(m._valid(h) for h in m.hint_params())
    small = one(SMALL / "01_linear_gelu_scale_residual_fp16.py", "gemm")
    d = small.default_params()  # 37x72x40: blocks cut to the dims' powers of two, one tile row (GROUP_M 1)
    assert (d["BLOCK_M"], d["BLOCK_N"], d["BLOCK_K"], d["GROUP_M"]) == (64, 128, 64, 1) and small._valid(d)
    bmm = one(TASKS_DIR / "level1" / "03_batched_gemm_bf16.py", "gemm").default_params()  # M = 512: 4 tile rows
    assert (bmm["BLOCK_M"], bmm["BLOCK_N"], bmm["GROUP_M"]) == (128, 128, 4)
    assert not small._valid({**d, "BLOCK_M": 16, "GROUP_M": 8})  # 3 tile rows: GROUP_M 4 already takes them all
    assert small._valid({**d, "BLOCK_M": 16, "GROUP_M": 4})
    configs = small.configs()
    assert len(configs) == len({str(sorted(c.items())) for c in configs}) > 100


def test_gemm_rejections_say_why(tmp_path: Path) -> None:
    def reason(path: Path, policy: str = "strict") -> str:
        return {r.template: r.reason for r in analyse(load_task(path), policy).rejected}["gemm"]

    fp32 = TASKS_DIR / "level2" / "07_gemm_swish_scale_fp32.py"
    # fp32 operands: split into bf16 parts under strict, TF32 under tf32 (labelled in the description)
    strict, tf32 = one(fp32, "gemm"), one(fp32, "gemm", "tf32")
    assert 'input_precision="bf16x6")' in strict.render() and 'input_precision="tf32")' not in strict.render()
    assert 'input_precision="tf32")' in tf32.render() and "TF32 inputs" in tf32.description
    assert "UPCAST=a.device.type == 'cpu'" in strict.render() and "UPCAST=False" in tf32.render()
    assert reason(TASKS_DIR / "level1" / "06_conv2d_3x3_fp32.py") == "the graph's library op is a conv, not a linear or matmul"
    assert reason(TASKS_DIR / "level2" / "09_gemm_logsumexp_bf16.py").startswith("the graph has a logsumexp after the product")
    assert reason(TASKS_DIR / "level1" / "17_softmax_fp32.py") == "the graph has no linear or matmul"
    path = write_task(tmp_path, "bcast_bmm.py", """
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def forward(self, a, b):
                return torch.matmul(a, b) * 2.0


        def get_inputs():
            return [torch.randn(2, 1, 8, 16, dtype=torch.float16), torch.randn(1, 3, 16, 8, dtype=torch.float16)]


        def get_init_inputs():
            return []
    """)
    assert reason(path) == "matmul with batch dims (2, 1) and (1, 3) that broadcast"
    vec = write_task(tmp_path, "matvec.py", path.read_text().replace("torch.randn(1, 3, 16, 8,", "torch.randn(16,"))
    assert "a vector operand (matrix-vector product)" in reason(vec)


@pytest.mark.slow
def test_every_interpreted_launch_compiles_for_the_gpu(interpreted: dict[str, Any]) -> None:
    """The kernels the cases above launched, compiled for cuda:90 with the signatures they were launched with
    (no GPU needed): the interpreter forgives what the GPU compiler refuses (a loop-carried variable that
    changes shape, for one)."""
    # the gap tasks' schedules and the pooling variants: every kernel shape the templates emit, at the cost of
    # a compile each (the other suite tasks render the same kernels with other shapes and dtypes)
    gap_names = {Path(c[0]).stem for c in CASES if c[0].startswith("gaps/")}
    recorded = [r for k, rs in interpreted.items() if k in gap_names or k.startswith(("pool-", "poolnd-", "reduce-", "pipe-"))
                for r in rs]
    assert len(recorded) >= 12 and all(r.get("launches") for r in recorded)
    assert {_ahead(r) for r in recorded if "_rows_kernel" in r["candidate_source"]} == {0, 1, 2}
    # the GEMM's launches, with the GPU's UPCAST=False (on the CPU its bf16 tiles are converted: module docstring)
    for k in ("gemm-01_linear_gelu_scale_residual_fp16.py", "gemm-02_bmm_tanh_scale_bf16.py", "gemm-tf32", "gemm-fp32-strict",
              "attn-06_sdpa_causal_tanh_fp16.py", "attn-07_sdpa_cross_scaled_bf16.py", "attn-2", "gemm_reduce-0",
              "gemm_reduce-1", "gemm_reduce-08_linear_sigmoid_logsumexp_fp16.py"):
        for r in interpreted[k]:
            launches = [{**x, "constexprs": {**x["constexprs"], "UPCAST": False}} if "UPCAST" in x["constexprs"] else x
                        for x in r["launches"]]
            assert launches and all(x["kernel"] in ("_gemm_kernel", "_attention_kernel", "_gemm_reduce_kernel",
                                                    "_gemm_reduce_combine", "_split_bf16x3_kernel") for x in launches)
            recorded.append({**r, "launches": launches})
    # the team kernel is never launched on the CPU: compile it with the signature its GPU launch has
    team = dict(interpreted["03_softmax_wide_rows_fp32"][2])
    assert "def _softmax_team_kernel(" in team["candidate_source"]
    team["launches"] = [{"kernel": "_softmax_team_kernel", "constexprs": {"BLOCK": 1024}, "num_warps": 8,
                         "signature": {"h_ptr": "*fp32", "out_ptr": "*fp32", "part_ptr": "*fp32", "cnt_ptr": "*i32",
                                       "teams": "i32", "BLOCK": "constexpr"}}]
    recorded.append(team)
    # the resident kernels (GPU only) at the gap tasks' full sizes, every hinted schedule
    for name, kernel in (("01_layernorm_three_dims_fp32.py", "_norm_resident_kernel"),
                         ("03_softmax_wide_rows_fp32.py", "_softmax_resident_kernel"),
                         ("01_layernorm_three_dims_fp32.py", "_norm_stream_kernel")):
        m = match(load_task(GAPS / name))[0]
        hinted = [p for p in m.hint_params() if p["strategy"] == kernel.split("_")[-2]]
        assert len(hinted) >= 3, m.hint_params()
        if kernel == "_norm_resident_kernel":  # and with L2 eviction priorities (loads and the store)
            hinted += [{**p, "EVICT": 1} for p in hinted if not p.get("EVICT") and {**p, "EVICT": 1} not in hinted][:1]
            hinted += [{**hinted[0], "PREFETCH": 1}, {**hinted[0], "PREFETCH": 2}]  # and L2 prefetches
        for params in hinted:
            src = m.render(params)
            found = re.search(rf"def {kernel}\((.*?)\):", src, re.S)
            assert found, kernel
            names = [a.split(":")[0].strip() for a in found.group(1).split(",")]
            sig = {n: ("constexpr" if n == "BLOCK" else "i32" if n == "teams" else "*i32" if n == "cnt_ptr" else "*fp32")
                   for n in names}
            recorded.append({"candidate_source": src, "launches": [{
                "kernel": kernel, "signature": sig, "constexprs": {"BLOCK": params["BLOCK"]},
                "divisible": [n for n in names if n.endswith("_ptr")], "num_warps": params["num_warps"]}]})
    failures = compile_recorded(recorded, "cuda:90")
    assert failures == [[] for _ in recorded], [f for f in failures if f]


def _launch_of(source: str, kernel: str, pointers: str, params: dict[str, Any], ones: tuple[str, ...]) -> dict[str, Any]:
    """A launch record of `kernel` as its GPU launch on the task's contiguous inputs would have it: pointers of
    type `pointers`, the integer parameters `ones` specialized to 1 (unit strides), the others i32 multiples of
    16 like the pointers, the schedule's constexprs (UPCAST False, as on the GPU)."""
    found = re.search(rf"def {kernel}\((.*?)\):", source, re.S)
    assert found, kernel
    signature, constexprs, divisible = {}, {"UPCAST": False}, []
    for param in (p.strip() for p in found.group(1).split(",") if p.strip()):
        name = param.split(":")[0].strip()
        if "constexpr" in param or name in ones:
            signature[name] = "constexpr"
            constexprs[name] = 1 if name in ones else params.get(name, False)
        else:
            signature[name] = pointers if name.endswith("_ptr") else "i32"
            divisible.append(name)
    constexprs["UPCAST"] = False
    return {"kernel": kernel, "signature": signature, "constexprs": constexprs, "divisible": divisible,
            "num_warps": params["num_warps"], "num_stages": params["num_stages"]}


#: CUDA's grid limits: axis 0 takes 2**31 - 1 programs, axes 1 and 2 65535
GRID_LIMITS = (2**31 - 1, 65535, 65535)


def _launch_grids(source: str) -> list[tuple[str, tuple[int, ...]]]:
    """(kernel, literal grid) of every launch the rendered forward makes (`kernel[(a, b)](...)`), in order."""
    found = [(k, ast.literal_eval(g)) for k, g in re.findall(r"(_\w+)\[(\([0-9, ]*\))\]\(", source)]
    assert found, "no literal launch grid in the source"
    return found


def _grids(source: str) -> dict[str, tuple[int, ...]]:
    """The literal launch grid of each kernel the rendered forward launches (its last launch's)."""
    return dict(_launch_grids(source))


def _assert_legal_grids(source: str) -> None:
    for kernel, grid in _launch_grids(source):  # every launch, a kernel's repeats too
        assert all(1 <= g <= lim for g, lim in zip(grid, GRID_LIMITS, strict=False)), (kernel, grid)


def _ttir_of(source: str, launch: dict[str, Any], tmp_path: Path) -> str:
    """The TTIR of one launch record's kernel compiled for cuda:90 (`_launch_of`'s record; i64 where a real
    launch passes an integer above 2**31 - 1)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kstrata.agents.tasks import import_task_module

    path = tmp_path / f"ttir_{launch['kernel']}.py"
    path.write_text(source)
    fn = getattr(import_task_module(path), launch["kernel"])
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in launch["divisible"]}
    src = ASTSource(fn, launch["signature"], launch["constexprs"], attrs)
    opts = {"num_warps": launch["num_warps"], "num_stages": launch["num_stages"]}
    return str(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ttir"])


def _i32_products(ttir: str, operands: tuple[str, ...]) -> list[str]:
    """The TTIR products in 32 bits of any of `operands` (SSA names: the kernel's stride arguments)."""
    pat = re.compile(r"arith\.muli .*%(" + "|".join(operands) + r")\b.*: (tensor<[0-9x]*xi32>|i32)\b")
    return [line.strip() for line in ttir.splitlines() if pat.search(line)]


@pytest.mark.slow
def test_full_size_tensor_core_schedules_compile_for_the_gpu() -> None:
    """The default and the first hinted schedule of the GEMM and attention templates on the suite's full-size
    tasks (128x128 and 128x256 tiles, 8 warps, pipelines 3-4 deep) compile for cuda:90 through ptxas: the
    shared memory and register limits `valid` assumes hold for what the GPU compiler makes of them."""
    cases = [(TASKS_DIR / "level2" / "01_gemm_bias_relu_fp16.py", "gemm", "_gemm_kernel", "*fp16",
              ("stride_ak", "stride_bk")),  # x @ W.T: the weight read transposed (unit stride along K)
             (TASKS_DIR / "level1" / "03_batched_gemm_bf16.py", "gemm", "_gemm_kernel", "*bf16", ("stride_ak", "stride_bn")),
             (TASKS_DIR / "level1" / "31_sdpa_causal_fp16.py", "attention", "_attention_kernel", "*fp16",
              ("sqd", "skd", "svd")),
             (TASKS_DIR / "level2" / "09_gemm_logsumexp_bf16.py", "gemm_reduce", "_gemm_reduce_kernel", "*bf16",
              ("stride_ak", "stride_bk"))]
    recorded = []
    for path, template, kernel, pointers, ones in cases:
        m = one(path, template)
        for params in (m.default_params(), m.hint_params()[0]):
            src = m.render(params)
            recorded.append({"candidate_source": src, "launches": [_launch_of(src, kernel, pointers, params, ones)]})
    # a schedule `valid` refuses (128x128 tiles 128 deep in 5 stages: 320 KiB) fails the check
    m = one(TASKS_DIR / "level2" / "01_gemm_bias_relu_fp16.py", "gemm")
    big = {**m.default_params(), "BLOCK_K": 128, "num_stages": 5}
    assert not m._valid(big)
    src = m.render()
    recorded.append({"candidate_source": src,
                     "launches": [_launch_of(src, "_gemm_kernel", "*fp16", big, ("stride_ak", "stride_bk"))]})
    failures = compile_recorded(recorded, "cuda:90")
    assert failures[:-1] == [[] for _ in recorded[:-1]], [f for f in failures if f]
    assert len(failures[-1]) == 1 and "bytes of shared memory, a block on cuda:90 gets 232448" in failures[-1][0]


@pytest.mark.slow
def test_the_check_rejects_a_wrong_kernel(interpreted: dict[str, Any]) -> None:
    """The execution check can fail: a normalization off by 1%, a max pool that skips the last window column,
    a GEMM that drops its K tail, a 3-D max pool that drops a depth, a causal attention that sees one key
    too many and a GEMM + logsumexp that skips its last 70 columns are rejected (run in the same child as the
    cases above)."""
    assert [r["ok"] for r in interpreted["planted"]] == [False] * 6, interpreted["planted"]


# ---------------------------------------------------------------------------------------------------
# What does not apply says why
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("rel", "words"), [
    ("level1/26_argmax_fp32.py", "argmax has no template"),
    ("models/01_mlp_block_bf16.py", "2 library ops (linear, linear)"),
    ("level1/21_batchnorm2d_fp32.py", "BatchNorm2d has no template"),
])
def test_templates_that_do_not_apply_say_why(rel: str, words: str) -> None:
    a = analyse(load_task(TASKS_DIR / rel))
    assert not a.matches
    assert len(a.rejected) == len(TEMPLATES) and all(words in r.reason for r in a.rejected)


def test_plain_library_op_is_left_alone() -> None:
    """Nothing to fuse after a plain fp32 GEMM: only `gemm`, which computes the product itself (split into bf16
    parts under strict: `tensorcore.SPLIT_FP32`), covers it."""
    a = analyse(load_task(TASKS_DIR / "level1" / "01_square_gemm_fp32.py"))
    assert [m.template for m in a.matches] == ["gemm"] and "split into bf16 parts (bf16x6)" in a.matches[0].description
    assert dict((r.template, r.reason) for r in a.rejected)["pointwise"] == "nothing to fuse after the library op"


def test_task_importing_other_modules_is_rejected(tmp_path: Path) -> None:
    path = write_task(tmp_path, "np_task.py", """
        import numpy as np
        import torch
        import torch.nn as nn


        class Model(nn.Module):
            def forward(self, x):
                return torch.relu(x) * float(np.float32(2.0))


        def get_inputs():
            return [torch.randn(4, 4)]


        def get_init_inputs():
            return []
    """)
    a = analyse(load_task(path))
    assert not a.matches and "imports numpy" in a.rejected[-1].reason


# ---------------------------------------------------------------------------------------------------
# The proposer adapter (i13's interface) and `kstrata eval --device cpu`
# ---------------------------------------------------------------------------------------------------
class _FakeState:
    def __init__(self, path: Path, policy: str = "strict", parent: Any = None) -> None:
        from types import SimpleNamespace

        self.task = SimpleNamespace(path=path, name=path.stem)
        self.policy, self.device, self.parent = policy, "cpu", parent
        self.tried: frozenset[str] = frozenset()
        self.notes: dict[str, str] = {}

    def note(self, proposer: str, why: str) -> None:
        self.notes[proposer] = why


def test_proposer_offers_schedules_and_refines_its_own_nodes(tmp_path: Path) -> None:
    pytest.importorskip("kstrata.agents.optimize.candidate", reason="the optimizer (branch i13) is not merged here")
    from types import SimpleNamespace

    from kstrata.agents.templates.proposer import TemplateProposer

    p = TemplateProposer(width=3)
    assert (p.name, p.space) == ("templates", "triton")
    cands = p.propose(_FakeState(GAPS / "03_softmax_wide_rows_fp32.py"))
    assert len(cands) == 3 and len({c.key for c in cands}) == 3
    assert all(c.space == "triton" and c.policy == "strict" and "class ModelNew" in c.source for c in cands)
    assert cands[0].params["schedule"] == match(load_task(GAPS / "03_softmax_wide_rows_fp32.py"))[0].default_params()
    parent = SimpleNamespace(candidate=cands[0], key=cands[0].key)
    refined = p.propose(_FakeState(GAPS / "03_softmax_wide_rows_fp32.py", parent=parent))
    base = cands[0].params["schedule"]
    assert refined and all(sum(c.params["schedule"][k] != base[k] for k in base) == 1 for c in refined)
    assert all(c.parent == cands[0].key for c in refined)
    none = _FakeState(TASKS_DIR / "level1" / "26_argmax_fp32.py")
    assert p.propose(none) == [] and "argmax has no template" in none.notes["templates"]


def test_proposer_offers_the_gemm_template_beside_pointwise() -> None:
    pytest.importorskip("kstrata.agents.optimize.candidate", reason="the optimizer (branch i13) is not merged here")
    from kstrata.agents.templates.proposer import TemplateProposer

    cands = TemplateProposer(width=2).propose(_FakeState(SMALL / "01_linear_gelu_scale_residual_fp16.py"))
    assert [c.params["template"] for c in cands] == ["gemm", "gemm", "pointwise", "pointwise"]
    assert all("def _gemm_kernel(" in c.source for c in cands[:2])
    fp32 = TASKS_DIR / "level2" / "07_gemm_swish_scale_fp32.py"
    strict = TemplateProposer(width=1).propose(_FakeState(fp32))
    assert {c.params["template"] for c in strict} == {"gemm", "pointwise"}
    assert all('input_precision="bf16x6"' in c.source for c in strict if c.params["template"] == "gemm")
    tf32 = TemplateProposer(width=1).propose(_FakeState(fp32, policy="tf32"))
    assert {c.params["template"] for c in tf32} == {"gemm", "pointwise"} and all(c.policy == "tf32" for c in tf32)


@pytest.mark.slow
def test_kstrata_eval_on_cpu_accepts_a_rendered_model_new(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kstrata.agents.evaluate import evaluate

    # i13 makes `eval --device cpu` set this for its workers; setting it here covers a tree without it
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    task_path = shrunk(tmp_path, "gaps/04_conv_add_scale_sigmoid_groupnorm_fp32.py", {"batch": 1, "height": 12, "width": 10})
    m = match(load_task(task_path))[0]
    cand = tmp_path / "model_new.py"
    cand.write_text(m.render({"strategy": "split", "BLOCK": 1024, "SPLIT": 1, "BLOCK_M": 1}))
    v = evaluate(task_path, cand, device="cpu", timeout_s=300)
    assert v.accepted and v.correct_strict, v.reason
    assert all(t.passes("strict") for t in v.trials) and len(v.trials) >= 5


#: one rendered source per template the tiny tasks cover, for `kstrata eval`
EVAL_CLI_CASES = [
    ("01_linear_gelu_scale_residual_fp16.py", "gemm", {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4}),
    ("04_avgpool1d_relu_scale_fp32.py", "pool1d", {"strategy": "direct", "BLOCK_H": 4, "BLOCK_W": 16}),
    ("05_maxpool3d_tanh_fp16.py", "pool3d", {"strategy": "direct", "BLOCK_H": 8, "BLOCK_W": 16}),
    ("06_sdpa_causal_tanh_fp16.py", "attention", {"BLOCK_M": 16, "BLOCK_N": 16}),
    ("08_linear_sigmoid_logsumexp_fp16.py", "gemm_reduce", {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT": 4}),
]


@pytest.mark.slow
def test_kstrata_eval_cli_on_cpu_accepts_each_tiny_tasks_model_new(tmp_path: Path) -> None:
    """The hardened evaluation (`--device cpu`, no timing, 5 trials) accepts a rendered source of each tiny
    task's template: the first through the `kstrata eval` CLI (its process, exit code and output), the others
    through the same evaluation from this process (the CLI is the same for every template; a CLI process per
    case cost about 12 s of CPU each, mostly importing torch)."""
    import subprocess
    import sys

    from kstrata.agents.evaluate import evaluate

    cands = []
    for i, (name, template, params) in enumerate(EVAL_CLI_CASES):
        cand = tmp_path / f"model_new_{i}.py"
        cand.write_text(one(SMALL / name, template).render(params))
        cands.append(cand)
    (name, template, _), first = EVAL_CLI_CASES[0], cands[0]
    proc = subprocess.run([sys.executable, "-m", "kstrata.tools.cli", "eval", str(SMALL / name), str(first),
                           "--device", "cpu", "--no-timing", "--trials", "5"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "ACCEPTED" in proc.stdout and "strict=True" in proc.stdout, (
        name, template, proc.stdout + proc.stderr)
    for (name, template, _), cand in zip(EVAL_CLI_CASES[1:], cands[1:], strict=True):
        v = evaluate(SMALL / name, cand, device="cpu", timing=False, trials=5, timeout_s=300)
        assert v.accepted and v.correct_strict, (name, template, v.reason)


# ---------------------------------------------------------------------------------------------------
# GPU twins
# ---------------------------------------------------------------------------------------------------
def test_screen_judges_against_float64_within_eagers_own_error() -> None:
    """The autotuner's screen is `kstrata eval`'s strict bound against float64: an output as far from the truth
    as eager is (so 1.41e-5 from eager, above a fixed 1e-5) passes; one 100x further, a wrong shape, fail."""
    import torch

    from kstrata.agents.templates.tune import errors, screen

    g = torch.Generator().manual_seed(0)
    truth = torch.randn(20000, generator=g, dtype=torch.float64)
    ref = (truth + 1e-5 * torch.randn(20000, generator=g, dtype=torch.float64)).float()  # eager: 1e-5 off
    ok = (truth + 1e-5 * torch.randn(20000, generator=g, dtype=torch.float64)).float()  # as good as eager
    assert errors(ok, ref)[1] > 1.3e-5  # what the old fixed 1e-5 screen against eager refused
    assert screen(ref, ok, truth) is None
    assert screen(ref, truth.float(), truth) is None
    bad = (truth + 1e-3 * torch.randn(20000, generator=g, dtype=torch.float64)).float()
    why = screen(ref, bad, truth)
    assert why is not None and "error against float64" in why
    assert screen(ref, ok[:100], truth) == "output is (100,) torch.float32, expected (20000,) torch.float32"


def test_screen_on_a_task_built_on_the_cpu(tmp_path: Path) -> None:
    """TaskOnDevice's float64 truth and screen on a small real task: eager itself passes, a planted error fails."""
    from kstrata.agents.templates.tune import TaskOnDevice

    task_path = shrunk(tmp_path, "gaps/01_layernorm_three_dims_fp32.py", {"batch": 4, "features": 4, "dim1": 8, "dim2": 8})
    env = TaskOnDevice(match(load_task(task_path))[0], device="cpu")
    assert env.truth().dtype.is_floating_point and str(env.truth().dtype) == "torch.float64"
    assert next(env.model.parameters()).dtype == env.ref.dtype  # the float64 copy left the model alone
    assert env.screen(env.ref.clone()) is None
    planted = env.ref.clone()
    planted.view(-1)[7] += 1e-3
    assert env.screen(planted) is not None
    # judge: the same verdict with the figures behind it (what template_probe reports)
    why, c = env.judge(planted)
    assert why == env.screen(planted) and not c.strict_ok and c.candidate_max_abs > c.strict_bound_max_abs
    assert env.judge(env.ref[:1])[1] is None  # a wrong shape fails before any comparison


def test_defaults_the_shapes_rule_out_are_replaced_by_the_nearest_valid_schedule(tmp_path: Path) -> None:
    """A small layernorm row (64K elements) cannot take the default 256-way split of 2048-element chunks: the
    match starts from the closest valid schedule instead of refusing its own default."""
    from kstrata.agents.templates.base import nearest_valid

    task_path = shrunk(tmp_path, "gaps/01_layernorm_three_dims_fp32.py", {"batch": 4, "features": 16, "dim1": 64, "dim2": 64})
    m = match(load_task(task_path))[0]
    d = m.default_params()
    assert m._valid(d) and d["SPLIT"] == 32 and d["BLOCK"] == 2048
    assert m.check(d) == d and "def " in m.render()
    assert all(m._valid(p) for p in m.hint_params())
    space = (("A", (1, 2, 4)), ("B", (1, 2)))
    assert nearest_valid(space, {"A": 4, "B": 2}, lambda p: p["A"] * p["B"] <= 4) in ({"A": 2, "B": 2}, {"A": 4, "B": 1})
    assert nearest_valid(space, {"A": 4, "B": 2}, lambda p: False) is None


def test_the_search_descends_again_from_another_strategys_best_while_time_is_left() -> None:
    """Two strategies whose good schedules share no parameters: `a` valid with X 1 only, `b` with X >= 2. The
    fastest start is a's; descent from it cannot reach b's optimum (a's parameters are invalid for b). With time
    left the search descends again from b's fastest schedule scored so far and finds b's optimum; each schedule
    is scored once, and a failing one is skipped. Out of time after the starts, the fastest start stands."""
    from kstrata.agents.templates.tune import search

    space = {"strategy": ("a", "b"), "X": (1, 2, 4, 8), "Y": (1, 2, 3)}

    def valid(p: dict[str, Any]) -> bool:
        return (p["X"] == 1) if p["strategy"] == "a" else p["X"] >= 2

    def cost(p: dict[str, Any]) -> float | None:
        if p == {"strategy": "b", "X": 4, "Y": 1}:
            return None  # fails to compile, say
        if p["strategy"] == "a":
            return 50.0 + abs(p["Y"] - 2)  # a's best: Y 2 (50 us)
        return 40.0 + 4 * {2: 2, 4: 1, 8: 0}[p["X"]] + 2 * abs(p["Y"] - 3)  # b's best: X 8, Y 3 (40 us)

    calls: list[str] = []
    memo: dict[str, float | None] = {}

    def score(p: dict[str, Any]) -> float | None:
        k = json.dumps(p, sort_keys=True)
        if k not in memo:
            calls.append(k)
            memo[k] = cost(p)
        return memo[k]

    starts = [{"strategy": "a", "X": 1, "Y": 1}, {"strategy": "b", "X": 2, "Y": 1}]  # 51 and 52 us
    best, us = search(starts, space, valid, score, lambda: False)
    assert (best, us) == ({"strategy": "b", "X": 8, "Y": 3}, 40.0)
    a_best = calls.index(json.dumps({"X": 1, "Y": 2, "strategy": "a"}, sort_keys=True))
    first_b = min(i for i, c in enumerate(calls) if '"b"' in c and i > 1)
    assert a_best < first_b  # a's descent ended before b's began
    assert memo[json.dumps({"X": 4, "Y": 1, "strategy": "b"}, sort_keys=True)] is None
    calls.clear()
    memo.clear()
    assert search(starts, space, valid, score, lambda: len(calls) >= 2) == (starts[0], 51.0)


def test_autotune_times_only_valid_schedules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner's search (default, hints, one parameter at a time) never renders a schedule the template
    refuses: every trial is valid, none failed, and the best is one of them (a fake device and timer)."""
    import torch

    from kstrata.agents.templates import tune

    task_path = shrunk(tmp_path, "gaps/01_layernorm_three_dims_fp32.py", {"batch": 4, "features": 16, "dim1": 64, "dim2": 64})
    m = match(load_task(task_path))[0]

    class FakeEnv:
        inputs: tuple[Any, ...] = ()

        def build(self, source: str, tag: str) -> Any:
            assert "def " in source
            return lambda: torch.zeros(1)

        def screen(self, out: Any) -> str | None:
            return None

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    seen: list[int] = []

    def timer(fn: Any, runs: int) -> float:
        seen.append(1)
        return 100.0 - len(seen) * 0.01  # later is faster: the search keeps moving

    r = tune.autotune(m, budget_s=30, runs=1, measure=timer, use_cache=False, prepared=FakeEnv())  # type: ignore[arg-type]
    assert len(r.trials) > 5 and all(t.error is None and m._valid(t.params) for t in r.trials)
    assert m._valid(r.params) and r.params in [t.params for t in r.trials]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(("rel", "sizes", "template", "schedules"), CASES, ids=[Path(c[0]).stem for c in CASES])
def test_rendered_model_new_matches_the_model_on_gpu(tmp_path: Path, rel: str, sizes: dict[str, int], template: str,
                                                     schedules: list[dict[str, Any]]) -> None:
    task_path = shrunk(tmp_path, rel, sizes)
    [m] = [x for x in match(load_task(task_path)) if x.template == template]
    for i, params in enumerate([*schedules, *m.configs()[1:4]]):
        cand = tmp_path / f"model_new_{i}.py"
        cand.write_text(m.render(params))
        r = compare(task_path, cand, device="cuda")
        assert r["ok"], (params, r)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("key", list(RESIDENT_CASES))
def test_resident_teams_run_and_match_the_model_on_gpu(tmp_path: Path, key: str) -> None:
    """The persistent kernels on the GPU: every team member resident (the launcher read the compiled kernel's
    occupancy, `_KSTRATA_RESIDENT`), the result equal to the model's (a sibling that never arrived would leave
    the spin limit's wrong statistics, which this catches)."""
    _assert_teams_resident(tmp_path, RESIDENT_CASES[key], f"resident_{key}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("key", list(STREAM_CASES))
def test_stream_teams_run_and_match_the_model_on_gpu(tmp_path: Path, key: str) -> None:
    """The streaming norm on the GPU: every team member resident (the launcher's occupancy), the partials
    exchanged within each team, the chunks read again; equal to the model's (a sibling that never arrived would
    leave the spin limit's wrong statistics, which this catches)."""
    _assert_teams_resident(tmp_path, STREAM_CASES[key], f"stream_{key}")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("key", list(PIPE_CASES))
def test_pipelined_schedules_match_the_model_on_gpu(tmp_path: Path, key: str) -> None:
    """The pipelined norm on the GPU: a launch's normalizing programs run beside the next group's statistics,
    reading partials the launch before wrote."""
    assert len(_matches_the_model_on_gpu(tmp_path, PIPE_CASES[key])) == len(PIPE_CASES[key][3])


#: the child that runs a graphed norm's launches through `_KstrataGraphs` under CUDA-graph semantics on the CPU
#: (a fake torch.cuda as in test_cuda_graph_config: a replay recomputes the captured call from the captured
#: tensors into the captured outputs); argv: the rendered source, the task. Prints a JSON list of what failed.
GRAPHED_SCRIPT = """
import contextlib, json, sys
import torch
from kstrata.agents.tasks import import_task_module
mod, task = import_task_module(sys.argv[1]), import_task_module(sys.argv[2])
graphs = []
class G:
    def replay(self):
        self.fn()
class S:
    def wait_stream(self, other):
        pass
def new_graph():
    graphs.append(G())
    return graphs[-1]
torch.cuda.CUDAGraph, torch.cuda.Stream, torch.cuda.current_stream = new_graph, S, lambda: S()
torch.cuda.stream = torch.cuda.graph = lambda *a: contextlib.nullcontext()
capture = mod._KstrataGraphs._capture
def recording(self, inputs, copy_in, shape):
    graph, static, out, uses = capture(self, inputs, copy_in, shape)
    read = static if static is not None else list(inputs)
    def fn():
        for o, n in zip(self._tensors(out), self._tensors(self.call(*read))):
            o.copy_(n)
    graph.fn = fn
    return graph, static, out, uses
mod._KstrataGraphs._capture = recording
torch.manual_seed(0)
ref = task.Model(*task.get_init_inputs())
torch.manual_seed(0)
new = mod.ModelNew(*task.get_init_inputs())
wrapped = mod._KstrataGraphs(new._launches, new)
x = task.get_inputs()[0]
bad = []
with torch.no_grad():
    first = wrapped(x)
    bad += [] if torch.allclose(first, ref(x), atol=1e-4, rtol=1e-4) else ["first call"]
    kept = first.clone()
    x.mul_(3.0).add_(1.0)
    second = wrapped(x)
    bad += [] if torch.allclose(second, ref(x), atol=1e-4, rtol=1e-4) else ["new values in place"]
    bad += [] if torch.equal(first, kept) and len(graphs) == 2 else ["a held output overwritten"]
    ptr = first.data_ptr()
    del first
    third = wrapped(x)
    bad += [] if third.data_ptr() == ptr and len(graphs) == 2 else ["a free graph not replayed"]
print(json.dumps(bad))
"""


@pytest.mark.slow
def test_a_graphed_norm_replays_its_launches_under_graph_semantics(tmp_path: Path) -> None:
    """A `GRAPH` schedule's launches (`_launches`, its Triton kernels under the interpreter) through the graph
    helper with CUDA-graph semantics faked on the CPU: captured once, replayed on new values written in place,
    a held output kept, a freed graph replayed (the GPU twin below runs the real graphs)."""
    import os
    import subprocess
    import sys

    task_path = shrunk(tmp_path, "gaps/01_layernorm_three_dims_fp32.py", {"batch": 3, "features": 2, "dim1": 97, "dim2": 89})
    cand = tmp_path / "graphed.py"
    cand.write_text(one(task_path, "norm").render({**PIPE, "GROUP_ROWS": 1, "GRAPH": 1}))
    proc = subprocess.run([sys.executable, "-c", GRAPHED_SCRIPT, str(cand), str(task_path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


@pytest.mark.gpu
@gpu
def test_a_graphed_norm_reads_new_values_and_keeps_held_outputs_on_gpu(tmp_path: Path) -> None:
    """A `GRAPH` schedule on the GPU: its launches replayed from a CUDA graph read the input where it lies (new
    values written in place are normalized), and an output the caller still holds is not overwritten by the
    next call (that call replays another graph)."""

    import torch

    task_path = shrunk(tmp_path, "gaps/01_layernorm_three_dims_fp32.py", {"batch": 3, "features": 2, "dim1": 97, "dim2": 89})
    m = one(task_path, "norm")
    cand = tmp_path / "graphed.py"
    cand.write_text(m.render({**PIPE, "GROUP_ROWS": 1, "GRAPH": 1}))
    mod = _import_source(cand, "graphed_norm")
    task = load_task(task_path)
    torch.manual_seed(0)
    ref = task.model_class(*task.get_init_inputs()).cuda()
    torch.manual_seed(0)
    new = mod.ModelNew(*task.get_init_inputs()).cuda()
    x = task.get_inputs()[0].cuda()
    first = new(x)
    torch.testing.assert_close(first, ref(x), rtol=1e-4, atol=1e-4)
    kept = first.clone()
    x.mul_(3.0).add_(1.0)  # new values at the same address
    second = new(x)
    torch.testing.assert_close(second, ref(x), rtol=1e-4, atol=1e-4)
    assert torch.equal(first, kept) and second.data_ptr() != first.data_ptr()
    graphs = new.__dict__["_kstrata_graphs"]
    assert sum(len(e) for e in graphs.graphs.values()) == 2  # one graph a held output
    del first
    third = new(x)  # the first graph's output is free again: replayed, no third capture
    torch.testing.assert_close(third, ref(x), rtol=1e-4, atol=1e-4)
    assert sum(len(e) for e in graphs.graphs.values()) == 2


def _import_source(path: Path, name: str) -> Any:
    """The rendered source at `path`, imported as module `name`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _assert_teams_resident(tmp_path: Path, case: tuple[str, dict[str, int], str, list[dict[str, Any]]],
                           label: str) -> None:
    """Each schedule of `case` equal to the model's on the GPU, and its persistent kernel's team fitting the
    slots its launcher counted (`_KSTRATA_RESIDENT`, from the compiled kernel's occupancy)."""

    import torch

    for i, (task_path, cand) in enumerate(_matches_the_model_on_gpu(tmp_path, case)):
        mod = _import_source(cand, f"{label}_{i}")
        task = load_task(task_path)
        torch.manual_seed(0)
        model = mod.ModelNew(*task.get_init_inputs()).cuda()
        model(*[x.cuda() if isinstance(x, torch.Tensor) else x for x in task.get_inputs()])
        split = int(re.search(r"c = pid % (\d+)", cand.read_text()).group(1))  # type: ignore[union-attr]
        assert mod._KSTRATA_RESIDENT and min(mod._KSTRATA_RESIDENT.values()) >= split, (mod._KSTRATA_RESIDENT, split)


def _matches_the_model_on_gpu(tmp_path: Path, case: tuple[str, dict[str, int], str, list[dict[str, Any]]]
                              ) -> list[tuple[Path, Path]]:
    """Each schedule of `case` rendered and compared with the task's model on the GPU (asserted): (task, source)."""
    rel, sizes, template, schedules = case
    task_path = shrunk(tmp_path, rel, sizes)
    m = one(task_path, template)
    out = []
    for i, params in enumerate(schedules):
        cand = tmp_path / f"model_new_{i}.py"
        cand.write_text(m.render(params))
        r = compare(task_path, cand, device="cuda")
        assert r["ok"], (params, r)
        out.append((task_path, cand))
    return out


#: every tiny task's case: (task, template, policy, schedules)
SMALL_CASES = [*((n, "gemm", p, s) for n, p, s in GEMM_CASES), *((n, t, "strict", s) for n, t, s in POOLND_CASES),
               *((n, "attention", "strict", s) for n, s in ATTN_CASES),
               *((n, "gemm_reduce", "strict", s) for n, s in GEMM_REDUCE_CASES)]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(("name", "template", "policy", "schedules"), SMALL_CASES, ids=[c[0] for c in SMALL_CASES])
def test_tiny_tasks_match_the_model_on_gpu(tmp_path: Path, name: str, template: str, policy: str,
                                           schedules: list[dict[str, Any]]) -> None:
    """The tiny tasks' schedules, hints and a sample of the space on the GPU, contiguous and strided inputs."""
    assert_schedules_match(SMALL / name, one(SMALL / name, template, policy), tmp_path, schedules, policy=policy)


@pytest.mark.gpu
@gpu
def test_gemm_fp32_split_products_within_strict_on_gpu(tmp_path: Path) -> None:
    """fp32 GEMMs under strict with their products split into bf16 parts (`tensorcore.SPLIT_FP32`): a K of 1024
    and one with a tail, the default, the hints and a sample of the space, within strict's bound against float64."""
    for sizes in ({"batch": 300, "in_features": 1024, "out_features": 520}, {"batch": 77, "in_features": 1000, "out_features": 96}):
        path = shrunk(tmp_path, "level2/07_gemm_swish_scale_fp32.py", sizes)
        m = one(path, "gemm")
        assert 'input_precision="bf16x6"' in m.render()
        assert_schedules_match(path, m, tmp_path, [m.default_params()], sample=3)


@pytest.mark.gpu
@gpu
def test_autotune_finds_a_correct_schedule_and_caches_it(tmp_path: Path) -> None:
    from kstrata.agents.templates.tune import autotune

    task_path = shrunk(tmp_path, "gaps/01_layernorm_three_dims_fp32.py", {"batch": 4, "features": 16, "dim1": 64, "dim2": 64})
    m = match(load_task(task_path))[0]
    r = autotune(m, budget_s=20, cache_dir=tmp_path / "cache", runs=5)
    assert r.median_us > 0 and not r.cached and any(t.median_us for t in r.trials)
    again = autotune(m, budget_s=20, cache_dir=tmp_path / "cache")
    assert again.cached and again.params == r.params
    cand = tmp_path / "model_new.py"
    cand.write_text(m.render(r.params))
    assert compare(task_path, cand, device="cuda")["ok"]



def test_bench_script_says_it_needs_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    if has_cuda():
        pytest.skip("this machine has a GPU: the benchmark would run")
    from kstrata.tools.bench_templates import main

    assert main([]) == 2
    assert capsys.readouterr().err.strip() == "bench_templates: needs a CUDA GPU"


def test_bench_picks_the_preferred_template_where_several_match() -> None:
    from kstrata.tools.bench_templates import pick

    matches = match(load_task(TASKS_DIR / "level2" / "09_gemm_logsumexp_bf16.py"))
    assert [m.template for m in matches] == ["reduce", "gemm_reduce"]
    assert pick(matches, []).template == "reduce"
    assert pick(matches, ["attention", "gemm_reduce"]).template == "gemm_reduce"


def test_bench_markdown_reports_speedups_and_labels_tf32() -> None:
    from kstrata.tools.bench_templates import markdown

    point = {"median_us": 100.0, "sol_fraction": 0.5, "flags": []}
    results = {"device": "H200", "date": "2026-12-01", "versions": {"torch": "2.11", "triton": "3.6.0", "cuda": "13.0"},
               "ceilings": {"copy_bytes_per_s": 4.0e12}, "tasks": [
                   {"task": "01_x", "template": "norm", "strict": {
                       "eager": point, "compile": point, "compile-max-autotune": {**point, "median_us": 80.0},
                       "template": {**point, "median_us": 50.0, "sol_fraction": 1.0, "speedup_vs_best_baseline": 2.0,
                                    "correct_strict": True, "params": {"SPLIT": 4}}},
                    "tf32": {"note": "no convolution or GEMM: TF32 changes nothing, same as strict"}},
                   {"task": "02_y", "error": "no template: ..."},
                   {"task": "03_z", "template": "pointwise", "strict": {"eager": point, "compile": point, "template": {
                       **point, "median_us": 125.0, "speedup_vs_best_baseline": 0.8, "correct_strict": True, "params": {}}},
                    "tf32": {}}]}
    md = markdown(results)
    assert "| 01_x | norm | 100 (50%) | 100 (50%) | 80 (50%) | 50 (100%) | 2.00x | True |" in md
    assert "| 03_z | pointwise | 100 (50%) | 100 (50%) | not run (before this column) | 125 (50%) |" in md
    assert "Geomean speedup over the best baseline (eager, compile, max-autotune where it ran): 1.265x" in md
    assert "| 0.80x (slower than the baseline) | True |" in md
    assert "## tf32 (labelled" in md and "TF32 changes nothing" in md and "| 02_y | — |" in md
    # the targets: 01 wins (2.00x, 100% of SOL), 03's template is slower so its output is the baseline (1.00x, 50%)
    assert "- geomean of the outputs over the best baseline 1.414x, target 1.3x: met" in md
    assert "- 01_x (compile below 60% of SOL): 2.00x, target 1.8x: met" in md
    assert "- 03_z (compile below 60% of SOL): 1.00x, target 1.8x: **not met**" in md
    assert "- median fraction of SOL of the outputs 75%, target 80%: **not met**" in md
    assert "max-autotune not among the baselines of 03_z" in md and "no baseline measured, left out: 02_y" in md


def test_bench_targets_on_the_measured_run_of_2026_12_03() -> None:
    """The eleventh session's run: geomean 1.295x (its 04 row was slower, so its output is the baseline and the
    geomean of the outputs is higher than the table's); none of the low-SOL tasks but 02 at 1.8x."""
    from kstrata.tools.bench_templates import targets

    results = json.loads((Path(__file__).resolve().parents[1] / "results" / "templates-bench-2026-12-03.json").read_text())
    t = targets(results)
    assert [o["output"] for o in t["outputs"]] == ["template", "template", "template", "baseline", "template", "template"]
    assert t["geomean"] == pytest.approx((1.34 * 2.10 * 1.25 * 1.0 * 1.44 * 1.01) ** (1 / 6), rel=0.01)
    assert [(x["task"][:2], x["met"]) for x in t["low_sol"]] == [("01", False), ("02", True), ("04", False),
                                                                 ("05", False)]
    assert not t["median_sol_met"]
