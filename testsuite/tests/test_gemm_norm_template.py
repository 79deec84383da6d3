"""The GEMM + GroupNorm / LayerNorm template (`agents/templates/gemm_norm.py`): matching and rejections, the
interpreted kernels against the model (tails, strided inputs, affine or not, fp16/bf16/fp32, strict and tf32),
planted bugs caught, every launch compiled for cuda:90, and the GPU twins."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kstrata.agents.tasks import load_task
from kstrata.agents.templates import analyse
from kstrata.agents.templates.cpucheck import compile_recorded, run_jobs
from kstrata.testsuite.tasks import TASKS_DIR

from .conftest import assert_schedules_match, computed_once, has_cuda
from .test_templates import shrunk

GAPS = TASKS_DIR / "gaps"
gpu = pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")

TASK = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F


    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear({k}, {n}, dtype=torch.{dtype})
            self.norm = {norm}
            self.s = nn.Parameter(torch.randn({n}, dtype=torch.{dtype}) * 0.1)

        def forward(self, x):
            return {body}


    def get_inputs():
        return [torch.randn({m}, {k}, dtype=torch.{dtype})]


    def get_init_inputs():
        return []
"""
#: (name, fields, policy, schedules): groups of 16 with two a tile and an M tail (37 rows in tiles of 16/32) and a
#: K tail (40 in steps of 16/32), an fp32 product split under strict; the same under tf32; fp16 without affine,
#: groups of 64; a bf16 LayerNorm over 64 features; GroupNorm of one group of 128 (the whole row)
VARIANTS: list[tuple[str, dict[str, Any], str, list[dict[str, Any]]]] = [
    ("gn16-fp32", dict(m=37, k=40, n=128, dtype="float32", norm="nn.GroupNorm(8, 128)",
                       body="self.norm(F.silu(self.lin(x)) + self.s) * 2.0"), "strict",
     [{"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1}, {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 1},
      {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1, "SPLIT_AT": "host"}]),
    ("gn16-fp32-tf32", dict(m=37, k=40, n=128, dtype="float32", norm="nn.GroupNorm(8, 128)",
                            body="self.norm(F.silu(self.lin(x)) + self.s) * 2.0"), "tf32",
     [{"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1}]),
    ("gn64-fp16-noaffine", dict(m=20, k=24, n=128, dtype="float16", norm="nn.GroupNorm(2, 128, affine=False, dtype=torch.float16)",
                                body="torch.relu(self.norm(self.lin(x)))"), "strict",
     [{"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 1}, {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 16, "GROUP_M": 1}]),
    ("ln64-bf16", dict(m=19, k=24, n=64, dtype="bfloat16", norm="nn.LayerNorm(64, dtype=torch.bfloat16)",
                       body="self.norm(torch.tanh(self.lin(x))) - 0.5"), "strict",
     [{"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 1}]),
    ("gn128-one-group", dict(m=9, k=16, n=128, dtype="float32", norm="nn.GroupNorm(1, 128)",
                             body="self.norm(self.lin(x) * self.s)"), "strict",
     [{"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 16, "GROUP_M": 1}]),
]
#: gap task 06 (Linear, Swish, + bias, GroupNorm) with fewer rows and input features and groups of 64
GAP_SIZES = {"batch": 33, "in_features": 40, "out_features": 256, "num_groups": 4}


def _task(tmp: Path, name: str, fields: dict[str, Any]) -> Path:
    path = tmp / f"gemm_norm_{name.replace('-', '_')}.py"
    path.write_text(textwrap.dedent(TASK.format(**fields)).lstrip())
    return path


def _gap(tmp: Path, sizes: dict[str, int]) -> Path:
    return shrunk(tmp, "gaps/06_gemm_swish_sum_groupnorm_fp32.py", sizes)


def _match(path: Path, policy: str = "strict") -> Any:
    a = analyse(load_task(path), policy)
    found = [m for m in a.matches if m.template == "gemm_norm"]
    assert found, {r.template: r.reason for r in a.rejected}
    return found[0]


def _job(path: Path, params: dict[str, Any], policy: str = "strict", **kw: Any) -> dict[str, Any]:
    return {"task": str(path), "source": _match(path, policy).render(params, policy=policy), "policy": policy, **kw}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    def make(tmp: Path) -> None:
        jobs: dict[str, list[dict[str, Any]]] = {}
        for name, fields, policy, schedules in VARIANTS:
            path = _task(tmp, name, fields)
            jobs[name] = [_job(path, p, policy) for p in schedules]
        gap = _gap(tmp, GAP_SIZES)
        jobs["gap06"] = [_job(gap, {}), _job(gap, {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 16, "GROUP_M": 4}),
                         _job(gap, {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4, "SPLIT_AT": "host"})]
        jobs["gap06-noncontiguous"] = [_job(gap, {}, noncontiguous=True),
                                       _job(gap, {"BLOCK_K": 16, "SPLIT_AT": "host"}, noncontiguous=True)]
        # planted bugs: the variance over one feature fewer, the group's mean left out of the centering
        good = jobs["gap06"][1]
        bad = [good["source"].replace("var = tl.sum(dv * dv, axis=2) / 64", "var = tl.sum(dv * dv, axis=2) / 63"),
               good["source"].replace("dv = v - mean[:, :, None]", "dv = v - 0.999 * mean[:, :, None]")]
        assert all(b != good["source"] for b in bad)
        jobs["planted"] = [{"task": good["task"], "source": b} for b in bad]
        flat = [{**j, "record": True} for js in jobs.values() for j in js]
        results = iter(run_jobs(flat, keep_sources=True))
        (tmp / "results.json").write_text(json.dumps({k: [next(results) for _ in js] for k, js in jobs.items()}))

    return json.loads((computed_once(tmp_path_factory, "gemm-norm-interpreted", make) / "results.json").read_text())


def test_gap_task_06_matches_beside_norm() -> None:
    a = analyse(load_task(GAPS / "06_gemm_swish_sum_groupnorm_fp32.py"))
    assert {"gemm_norm", "norm"} <= {m.template for m in a.matches}
    m = _match(GAPS / "06_gemm_swish_sum_groupnorm_fp32.py")
    assert "group_norm (64 groups of 64)" in m.description and "bf16x6" in m.description
    assert m.default_params()["BLOCK_N"] >= 64 and all(h["BLOCK_N"] % 64 == 0 for h in m.hint_params())
    assert not m._valid({**m.default_params(), "BLOCK_N": 32})  # a tile holds whole groups
    src = m.render()
    assert src.count("tl.store(") == 1 and 'input_precision="bf16x6"' in src  # the product is never stored


def test_rejections_say_why(tmp_path: Path) -> None:
    def reason(norm: str, body: str, n: int = 96) -> str:
        path = _task(tmp_path, "r", dict(m=8, k=16, n=n, dtype="float32", norm=norm, body=body))
        return {r.template: r.reason for r in analyse(load_task(path)).rejected}["gemm_norm"]

    assert reason("nn.GroupNorm(2, 96)", "self.norm(self.lin(x))") == \
        "groups of 48 features: the template takes a power of two up to 256"
    assert reason("nn.LayerNorm(512)", "self.norm(self.lin(x))", n=512) == \
        "groups of 512 features: the template takes a power of two up to 256"
    assert reason("nn.GroupNorm(2, 96)", "torch.relu(self.lin(x))") == \
        "the graph has no GroupNorm or LayerNorm after the product"


@pytest.mark.slow
@pytest.mark.parametrize("name", [v[0] for v in VARIANTS] + ["gap06", "gap06-noncontiguous"])
def test_interpreted_kernels_match_the_model(interpreted: dict[str, Any], name: str) -> None:
    assert interpreted[name]
    for r in interpreted[name]:
        assert r["ok"], r


@pytest.mark.slow
def test_planted_bugs_are_caught(interpreted: dict[str, Any]) -> None:
    assert [r["ok"] for r in interpreted["planted"]] == [False, False], interpreted["planted"]


@pytest.mark.slow
def test_every_launch_and_the_gap_task_compile_for_the_gpu(interpreted: dict[str, Any]) -> None:
    """The interpreted launches with the GPU's UPCAST=False (split products for fp32 under strict), and gap task
    06's default and hinted schedules at its published size."""
    recorded = []
    for k, rs in interpreted.items():
        if k == "planted":
            continue
        for r in rs:
            launches = [{**x, "constexprs": {**x["constexprs"], "UPCAST": False}} if "UPCAST" in x["constexprs"] else x
                        for x in r["launches"]]
            assert launches and {x["kernel"] for x in launches} <= {"_gemm_norm_kernel", "_split_bf16x3_kernel"}
            assert ("_split_bf16x3_kernel" in {x["kernel"] for x in launches}) == ("_split_bf16x3(a)" in r["candidate_source"])
            recorded.append({**r, "launches": launches})
    failures = compile_recorded(recorded, "cuda:90")
    assert failures == [[] for _ in recorded], [f for f in failures if f]


@pytest.mark.gpu
@gpu
def test_gap_task_06_at_a_smaller_batch_on_gpu(tmp_path: Path) -> None:
    """Gap task 06 with 2048 rows (all its features and groups): the default, the hints and a sample of the space,
    within strict's bound against float64 (fp32 products split into bf16 parts)."""
    path = _gap(tmp_path, {"batch": 2048})
    m = _match(path)
    assert_schedules_match(path, m, tmp_path, [m.default_params()], sample=4)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", [v[0] for v in VARIANTS])
def test_variants_match_the_model_on_gpu(tmp_path: Path, name: str) -> None:
    _, fields, policy, schedules = {v[0]: v for v in VARIANTS}[name]
    path = _task(tmp_path, name, fields)
    assert_schedules_match(path, _match(path, policy), tmp_path, schedules, policy=policy)
