"""The attention template on grouped-query attention and attention masks (kstrata.agents.templates.attention):
`enable_gqa=True` and the explicit `repeat_interleave` / `expand`+`reshape` widenings of K/V (read un-repeated,
in place), boolean and additive `attn_mask`s of every broadcast shape read through their strides, masked tails,
fully-masked rows (PyTorch's CPU SDPA gives 0 there, checked below), custom scales, non-contiguous operands, run
under Triton's interpreter against the task's Model (float64-anchored, `cpucheck.compare`); planted bugs that must
fail; the recorded launches compiled for cuda:90; rejections with reasons (causal + mask among them: PyTorch refuses
the pair on the meta device the graph is traced on); GPU twins at the end."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kstrata.agents.tasks import load_task
from kstrata.agents.templates import analyse
from kstrata.agents.templates.cpucheck import compare, compile_recorded, run_jobs
from kstrata.testsuite.tasks import TASKS_DIR

from .conftest import assert_schedules_match, computed_once, has_cuda
from .test_templates import _launch_of

gpu = pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
TEMPLATE_TASKS = TASKS_DIR.parent / "template_tasks"

TASK = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, {args}):
        return {body}


def get_inputs():
{inputs}


def get_init_inputs():
    return []
"""


def qkv(q: tuple[int, ...], k: tuple[Any, ...], dtype: str) -> list[str]:
    """Random q, k, v (v shaped as k, or `k` is a pair: the key's and the value's shapes)."""
    kv = k if isinstance(k[0], tuple) else (k, k)
    return [f"torch.randn({s}, dtype=torch.{dtype})" for s in (q, *kv)]


def bool_mask(shape: tuple[int, ...], masked_row: int | None = None) -> str:
    """A random boolean mask (True keeps, about 60%), with row `masked_row` of the query axis fully masked."""
    lines = [f"m = torch.rand({shape}) > 0.4"]
    if masked_row is not None:
        lines.append(f"m[..., {masked_row}, :] = False")
    return "\n".join(lines)


def additive_mask(shape: tuple[int, ...], dtype: str, masked_row: int | None = None) -> str:
    """Random scores to add, about 30% of them -inf, with row `masked_row` all -inf."""
    lines = [f"m = torch.where(torch.rand({shape}) > 0.3, torch.randn({shape}), float('-inf')).to(torch.{dtype})"]
    if masked_row is not None:
        lines.append(f"m[..., {masked_row}, :] = float('-inf')")
    return "\n".join(lines)


def task_source(body: str, tensors: list[str], mask: str = "", init: str = "") -> str:
    names = ["q", "k", "v"] + (["m"] if mask else [])
    prep = (mask + "\n") if mask else ""
    inputs = textwrap.indent(f"{prep}return [{', '.join(tensors + (['m'] if mask else []))}]", "    ")
    return TASK.format(init=textwrap.indent(init or "pass", "        "), args=", ".join(names), body=body, inputs=inputs)


B16 = {"BLOCK_M": 16, "BLOCK_N": 16}
#: (id, forward's expression, q shape, k shape (or k and v shapes), dtype, mask code or "", schedules, also
#: non-contiguous)
#: 19 queries x 45 keys leave tails in both axes at 16 x 16 blocks; the default schedules take one block.
CASES: list[tuple[str, str, tuple[int, ...], tuple[Any, ...], str, str, list[dict[str, Any]], bool]] = [
    ("gqa2-enable_gqa", "F.scaled_dot_product_attention(q, k, v, enable_gqa=True)",
     (2, 4, 19, 24), (2, 2, 45, 24), "float16", "", [B16, {}], True),
    ("gqa4-enable_gqa-causal-bf16", "F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)",
     (1, 8, 37, 16), (1, 2, 37, 16), "bfloat16", "", [B16], True),
    ("gqa2-repeat_interleave", "F.scaled_dot_product_attention(q, k.repeat_interleave(2, dim=1), "
     "torch.repeat_interleave(v, 2, dim=-3))", (2, 4, 21, 32), (2, 2, 21, 32), "float16", "", [B16], True),
    ("gqa4-index-expand-reshape-bf16", "F.scaled_dot_product_attention(q, k[:, :, None, :, :].expand(1, 2, 4, 33, 16)"
     ".reshape(1, 8, 33, 16), v[:, :, None].expand(1, 2, 4, 33, 16).reshape(1, 8, 33, 16), is_causal=True)",
     (1, 8, 33, 16), (1, 2, 33, 16), "bfloat16", "", [B16], True),
    ("gqa2-unsqueeze-expand-flatten", "F.scaled_dot_product_attention(q, k.unsqueeze(2).expand(-1, -1, 2, -1, -1)"
     ".flatten(1, 2), torch.reshape(v.unsqueeze(-3).expand(2, 3, 2, 45, 16), (2, 6, 45, 16)))",
     (2, 6, 19, 16), (2, 3, 45, 16), "float16", "", [B16], False),
    ("bool-LS", "F.scaled_dot_product_attention(q, k, v, m)", (2, 3, 19, 16), (2, 3, 45, 16), "float16",
     bool_mask((19, 45)), [B16, {}], True),
    ("bool-B1LS", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", (2, 3, 19, 16), (2, 3, 45, 16), "float16",
     bool_mask((2, 1, 19, 45)), [B16], True),
    ("bool-BHLS-bf16", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", (2, 3, 19, 16), (2, 3, 45, 16),
     "bfloat16", bool_mask((2, 3, 19, 45)), [B16], True),
    ("bool-B11S-key-padding", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", (2, 3, 19, 16), (2, 3, 45, 16),
     "float16", bool_mask((2, 1, 1, 45)), [B16], True),
    ("additive-LS", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", (2, 3, 19, 16), (2, 3, 45, 16),
     "float16", additive_mask((19, 45), "float16"), [B16, {}], True),
    ("additive-B1LS", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", (2, 3, 19, 16), (2, 3, 45, 16),
     "float16", additive_mask((2, 1, 19, 45), "float16"), [B16], True),
    ("additive-HLS-bf16", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", (2, 3, 19, 16), (2, 3, 45, 16),
     "bfloat16", additive_mask((3, 19, 45), "bfloat16"), [B16], True),
    ("additive-BHLS", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", (2, 3, 19, 16), (2, 3, 45, 16),
     "float16", additive_mask((2, 3, 19, 45), "float16"), [B16], True),
    ("additive-scale", "F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)",
     (2, 2, 37, 16), (2, 2, 37, 16), "float16", additive_mask((2, 1, 37, 37), "float16"), [B16], False),
    ("fully-masked-row-bool", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", (2, 2, 19, 16),
     (2, 2, 45, 16), "float16", bool_mask((2, 2, 19, 45), masked_row=5), [B16, {}], True),
    ("fully-masked-row-additive", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)", (2, 2, 19, 16),
     (2, 2, 45, 16), "float16", additive_mask((19, 45), "float16", masked_row=17), [B16], False),
    # every key of the first block masked for rows 0-2: their running max stays -inf over a whole block
    ("masked-first-block", "F.scaled_dot_product_attention(q, k, v, attn_mask=m)",
     (1, 2, 37, 16), (1, 2, 37, 16), "float16", bool_mask((37, 37)) + "\nm[:3, :16] = False", [B16], False),
    ("gqa-mask-scale-bf16", "F.scaled_dot_product_attention(q, k.repeat_interleave(4, dim=1), "
     "v.repeat_interleave(4, dim=1), attn_mask=m, scale=0.2)", (2, 8, 29, 32), (2, 2, 29, 32),
     "bfloat16", bool_mask((2, 1, 29, 29)), [B16, {"BLOCK_M": 32, "BLOCK_N": 16}], True),
    ("rank3-gqa-bool", "F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)", (4, 19, 16),
     (2, 45, 16), "float16", bool_mask((4, 19, 45)), [B16], True),
    # keys widened 4x in the model, values 2x by enable_gqa: each read with its own group size
    ("gqa-keys-4-values-2", "F.scaled_dot_product_attention(q, k.repeat_interleave(4, dim=1), v, m, enable_gqa=True)",
     (2, 8, 19, 16), ((2, 2, 45, 16), (2, 4, 45, 24)), "float16", bool_mask((19, 45)), [B16], True),
    ("custom-scale-no-mask", "F.scaled_dot_product_attention(q, k, v, scale=1.7)", (2, 2, 19, 16), (2, 2, 45, 16),
     "float16", "", [B16], False),
]
#: a boolean mask buffer of the model (a parameter-like operand), causal by construction
BUFFER_CASE = ("bool-buffer", "F.scaled_dot_product_attention(q, k, v, self.mask) * 2.0", (2, 2, 23, 16),
               (2, 2, 23, 16), "float16", "self.register_buffer('mask', torch.ones(23, 23, dtype=torch.bool).tril())")


def write_case(tmp: Path, case: tuple[Any, ...]) -> Path:
    name, body, q, k, dtype, mask = case[:6]
    tensors = qkv(q, k, dtype)
    src = task_source(body, tensors, mask) if not name.startswith("bool-buffer") else \
        TASK.format(init=textwrap.indent(mask, "        "), args="q, k, v", body=body,
                    inputs=textwrap.indent(f"return [{', '.join(tensors)}]", "    "))
    path = tmp / f"{name.replace('-', '_')}.py"
    path.write_text(src.lstrip())
    return path


def _job(path: Path, params: dict[str, Any], template: str = "attention", **kw: Any) -> dict[str, Any]:
    a = analyse(load_task(path))
    found = [x for x in a.matches if x.template == template]
    assert found, f"{path.name}: {template} does not match: {a.rejected}"
    return {"task": str(path), "source": found[0].render(params), **kw}


GQA_TASK = TEMPLATE_TASKS / "09_sdpa_gqa_causal_bf16.py"


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case, run in one interpreter child (TRITON_INTERPRET=1), once per session; with the sources and
    launches recorded, and the planted bugs below."""
    def make(tmp: Path) -> None:
        jobs: dict[str, list[dict[str, Any]]] = {}
        for case in CASES:
            path = write_case(tmp, case)
            jobs[case[0]] = [_job(path, p) for p in case[6]]
            if case[7]:
                jobs[case[0]].append(_job(path, case[6][0], noncontiguous=True))
        path = write_case(tmp, BUFFER_CASE)
        jobs[BUFFER_CASE[0]] = [_job(path, B16), _job(path, {}, noncontiguous=True)]
        # the head left to PyTorch (the pointwise template after it) widens K/V itself
        widened = (f"{CASES[3][0]}-tanh", f"torch.tanh({CASES[3][1]})", *CASES[3][2:])
        jobs["pointwise-after-gqa"] = [_job(write_case(tmp, widened), {}, "pointwise")]
        # planted bugs, each of which a case above must catch: a query head reading key/value head hh % groups
        # (repeat's order, not repeat_interleave's); a boolean mask ignored; an additive mask not scaled to base 2;
        # the mask's row stride taken for its key stride; no guard for a fully-masked row (0/0)
        unplanted: list[str] = []  # a bug whose anchor is not in the source (the test below fails on it)

        def plant(key: str, i: int, old: str, new: str) -> dict[str, Any]:
            good = jobs[key][i]
            if old not in good["source"]:
                unplanted.append(f"{key}: {old}")
            return {"task": good["task"], "source": good["source"].replace(old, new)}

        jobs["planted"] = [
            plant("gqa2-enable_gqa", 0, "(hh // 2)", "(hh % 2)"),
            plant("gqa4-index-expand-reshape-bf16", 0, "(hh // 4)", "(hh % 4)"),
            plant("bool-B1LS", 0, " & (mt != 0)", ""),
            plant("additive-LS", 0, "mt.to(tl.float32) * 1.4426950408889634", "mt.to(tl.float32)"),
            plant("bool-LS", 0, "rm[:, None] * smm + rn[None, :] * smn", "rm[:, None] * smn + rn[None, :] * smm"),
            plant("fully-masked-row-bool", 0, "m_use = tl.where(m_new == float('-inf'), 0.0, m_new)", "m_use = m_new"),
            plant("fully-masked-row-bool", 0, "tl.where(l_i == 0.0, 1.0, l_i)", "l_i"),
        ]
        flat = [{**j, "record": True} for js in jobs.values() for j in js]
        results = iter(run_jobs(flat, keep_sources=True))
        out = {k: [next(results) for _ in js] for k, js in jobs.items()}
        (tmp / "results.json").write_text(json.dumps({**out, "unplanted": unplanted}))

    out: dict[str, Any] = json.loads((computed_once(tmp_path_factory, "attention-gqa-mask", make) / "results.json")
                                     .read_text())
    return out


def _assert_all_pass(results: list[dict[str, Any]]) -> None:
    assert results
    for r in results:
        assert r["ok"], {k: v for k, v in r.items() if k not in ("candidate_source", "launches")}


@pytest.mark.slow
@pytest.mark.parametrize("name", [c[0] for c in CASES] + [BUFFER_CASE[0], "pointwise-after-gqa"])
def test_attention_matches_the_model_under_the_interpreter(interpreted: dict[str, Any], name: str) -> None:
    _assert_all_pass(interpreted[name])


@pytest.mark.slow
def test_planted_bugs_are_caught(interpreted: dict[str, Any]) -> None:
    assert interpreted["unplanted"] == []
    assert [r["ok"] for r in interpreted["planted"]] == [False] * 7, interpreted["planted"]
    # the missing guards show as NaN in a row PyTorch gives 0 for
    assert all("non-finite" in r["reason"] for r in interpreted["planted"][5:])


@pytest.mark.slow
def test_grouped_keys_and_values_are_read_un_repeated(interpreted: dict[str, Any]) -> None:
    for name, groups, heads in (("gqa2-repeat_interleave", 2, 2), ("gqa4-index-expand-reshape-bf16", 4, 2),
                                ("gqa2-unsqueeze-expand-flatten", 2, 3), ("gqa2-enable_gqa", 2, 2)):
        src = interpreted[name][0]["candidate_source"]
        forward = src[src.index("class ModelNew(Model):"):]
        assert "repeat_interleave" not in forward and "expand" not in forward, name
        assert re.search(rf"\bk = k_in\.reshape\(\d+, {heads}, ", forward), name  # the un-repeated tensor
        assert f"k_base = k_ptr + b * skb + (hh // {groups}) * skh" in src, name
    src = interpreted["gqa-keys-4-values-2"][0]["candidate_source"]
    assert "k_base = k_ptr + b * skb + (hh // 4) * skh" in src and "v_base = v_ptr + b * svb + (hh // 2) * svh" in src
    # the PyTorch path (head left to PyTorch) widens them itself
    src = interpreted["pointwise-after-gqa"][0]["candidate_source"]
    assert "k_in.repeat_interleave(4, dim=-3)" in src and "v_in.repeat_interleave(4, dim=-3)" in src


def test_fully_masked_rows_give_zero_in_pytorch() -> None:
    """What the template matches: PyTorch 2.13's CPU SDPA gives 0 (not NaN) for a query row whose every key is
    masked, boolean or all -inf additive, in every dtype (the math path's `_safe_softmax`)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        q, k, v = (torch.randn(1, 2, 4, 8, dtype=dtype) for _ in range(3))
        keep = torch.ones(4, 4, dtype=torch.bool)
        keep[1] = False
        add = torch.zeros(4, 4, dtype=dtype).masked_fill(~keep, float("-inf"))
        for m in (keep, add):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1])), (dtype, m.dtype)
            assert bool(torch.isfinite(out).all())


@pytest.mark.slow
def test_recorded_launches_compile_for_the_gpu(interpreted: dict[str, Any]) -> None:
    """The launches of every case (bool mask pointers, GQA head indexing, the guards) compile for cuda:90."""
    recorded = []
    for name in [c[0] for c in CASES] + [BUFFER_CASE[0]]:
        r = interpreted[name][0]
        launches = [{**x, "constexprs": {**x["constexprs"], "UPCAST": False}} for x in r["launches"]]
        assert launches and all(x["kernel"] == "_attention_kernel" for x in launches)
        recorded.append({**r, "launches": launches})
    failures = compile_recorded(recorded, "cuda:90")
    assert failures == [[] for _ in recorded], [f for f in failures if f]


@pytest.mark.slow
def test_realistic_gqa_schedules_compile_for_the_gpu() -> None:
    """The GPU-sized GQA task's default and hinted schedules (128-deep heads, 8 warps, 2-4 stages) compile for
    cuda:90 through ptxas within a block's shared memory."""
    [m] = [x for x in analyse(load_task(GQA_TASK)).matches if x.template == "attention"]
    recorded = []
    for params in (m.default_params(), *m.hint_params()):
        src = m.render(params)
        assert "k_base = k_ptr + b * skb + (hh // 4) * skh" in src
        recorded.append({"candidate_source": src,
                         "launches": [_launch_of(src, "_attention_kernel", "*bf16", params, ("sqd", "skd", "svd"))]})
    failures = compile_recorded(recorded, "cuda:90")
    assert failures == [[] for _ in recorded], [f for f in failures if f]


def test_descriptions_and_schedules(tmp_path: Path) -> None:
    path = write_case(tmp_path, CASES[0])
    [m] = [x for x in analyse(load_task(path)).matches if x.template == "attention"]
    assert "8 batch x heads" in m.description and "2 query heads per key/value head read in place" in m.description
    path = write_case(tmp_path, CASES[12])
    [m] = [x for x in analyse(load_task(path)).matches if x.template == "attention"]
    assert "additive attn_mask" in m.description
    src = m.render()
    assert "am = m.expand((2, 3, 19, 45)).reshape(2, 3, 19, 45)" in src
    assert "m_use = tl.where(m_new == float('-inf'), 0.0, m_new)" in src
    # no mask: the kernel keeps its unguarded softmax (no row can lose every key)
    [plain] = [x for x in analyse(load_task(write_case(tmp_path, CASES[1]))).matches if x.template == "attention"]
    assert "m_use" not in plain.render() and "am_ptr" not in plain.render()
    # the realistic GQA task (meta tensors: nothing allocated)
    [full] = [x for x in analyse(load_task(GQA_TASK)).matches if x.template == "attention"]
    assert full.description.startswith("causal attention over 128 batch x heads, 2048 queries x 2048 keys, head dims "
                                       "128/128, bfloat16") and "4 query heads per key/value head" in full.description
    assert full.default_params() == {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}


def _reason(tmp_path: Path, body: str, tensors: list[str], mask: str = "") -> str:
    path = tmp_path / "rejected.py"
    path.write_text(task_source(body, tensors, mask).lstrip())
    return {r.template: r.reason for r in analyse(load_task(path)).rejected}["attention"]


def test_rejections_say_why_in_one_line(tmp_path: Path) -> None:
    sdpa = "F.scaled_dot_product_attention"
    cases = [
        (f"{sdpa}(q, k, v, dropout_p=0.1, enable_gqa=True)", qkv((1, 4, 8, 16), (1, 2, 8, 16), "float16"), "",
         "attention with dropout (random in eval mode too)"),
        (f"{sdpa}(q, k, v)", qkv((1, 4, 8, 16), (1, 1, 8, 16), "float16"), "",
         "attention with batch dims (1, 4), (1, 1), (1, 1) that broadcast"),
        (f"{sdpa}(q, k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2))",
         qkv((1, 2, 16, 16), (1, 2, 8, 16), "float16"), "", "repeat_interleave() has no template"),
        (f"{sdpa}(q, k, v, attn_mask=m)", qkv((1, 1, 2, 8, 16), (1, 1, 2, 8, 16), "float16"), "m = torch.rand(8, 8) > 0.5",
         "attention with an attn_mask over a rank-5 query (the template takes (batch, heads, L, S) masks, at most "
         "two batch dims)"),
        (f"{sdpa}(q, k, v, attn_mask=m.logical_not())", qkv((1, 2, 8, 16), (1, 2, 8, 16), "float16"),
         "m = torch.rand(8, 8) > 0.5", ".logical_not() has no template"),
        # PyTorch's SDPA refuses the pair off the CPU (its CPU kernel takes it): the trace on meta tensors fails
        (f"{sdpa}(q, k, v, attn_mask=m, is_causal=True)", qkv((1, 2, 8, 16), (1, 2, 8, 16), "float16"),
         "m = torch.rand(8, 8) > 0.5", "Explicit attn_mask should not be set when is_causal=True"),
        (f"{sdpa}(q, k, v, attn_mask=m * 2.0)", qkv((1, 2, 8, 16), (1, 2, 8, 16), "float16"),
         "m = torch.randn(8, 8, dtype=torch.float16)", "the library op's operands are computed"),
    ]
    for body, tensors, mask, why in cases:
        try:
            reason = _reason(tmp_path, body, tensors, mask)
        except KeyError:
            raise AssertionError(f"attention applies to {body}") from None
        assert why in reason and "\n" not in reason, (body, reason)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("case", [*CASES, (*BUFFER_CASE, [B16], True)], ids=[c[0] for c in CASES] + [BUFFER_CASE[0]])
def test_attention_matches_the_model_on_gpu(tmp_path: Path, case: tuple[Any, ...]) -> None:
    """Every case, its schedules, hints and a sample of the space, contiguous and strided, on the GPU (against
    PyTorch's CUDA SDPA: its fully-masked rows are checked against what it gives there)."""
    path = write_case(tmp_path, case)
    [m] = [x for x in analyse(load_task(path)).matches if x.template == "attention"]
    assert_schedules_match(path, m, tmp_path, case[6], sample=6)


@pytest.mark.gpu
@gpu
def test_realistic_gqa_task_matches_the_model_on_gpu(tmp_path: Path) -> None:
    [m] = [x for x in analyse(load_task(GQA_TASK)).matches if x.template == "attention"]
    for i, params in enumerate([m.default_params(), *m.hint_params()]):
        cand = tmp_path / f"model_new_{i}.py"
        cand.write_text(m.render(params))
        r = compare(GQA_TASK, cand, device="cuda")
        assert r["ok"], (params, r)


# ---------------------------------------------------------------------------------------------------
# Published and larger sizes: what the interpreter's small shapes cannot show (compiled for cuda:90, grids read)
# ---------------------------------------------------------------------------------------------------
def _masked_gqa_task(tmp_path: Path, dtype: str, batch: int, seq: int) -> Path:
    """The realistic GQA task's heads (32 over 8, head dim 128) with an additive (batch, 1, L, S) mask."""
    path = tmp_path / f"masked_gqa_{dtype}_{batch}_{seq}.py"
    path.write_text(task_source("F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)",
                                qkv((batch, 32, seq, 128), (batch, 8, seq, 128), dtype),
                                f"m = torch.randn({batch}, 1, {seq}, {seq}, dtype=torch.{dtype})").lstrip())
    return path


@pytest.mark.slow
def test_a_masks_pipelined_tile_counts_against_shared_memory(tmp_path: Path) -> None:
    """fp32 operands (tf32) with an fp32 mask: 128x32 tiles 4 stages deep take 196608 bytes for Q, K and V and
    245760 with the mask's pipelined tiles, past a block's 227 KiB: `valid` refuses the schedule (it counted Q,
    K and V only), and the largest schedules it keeps compile within a block's shared memory."""
    [m] = [x for x in analyse(load_task(_masked_gqa_task(tmp_path, "float32", 4, 2048)), "tf32").matches
           if x.template == "attention"]
    refused = {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8, "num_stages": 4}
    kept = [{"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8, "num_stages": 3},
            {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 4},
            {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}]
    assert not m._valid(refused) and all(m._valid(p) for p in kept)
    recorded = []
    for params in (refused, *kept):
        src = m._render(params, "tf32")
        recorded.append({"candidate_source": src, "launches": [
            _launch_of(src, "_attention_kernel", "*fp32", params, ("sqd", "skd", "svd", "smn"))]})
    failures = compile_recorded(recorded, "cuda:90")
    assert len(failures[0]) == 1 and "needs 245760 bytes of shared memory" in failures[0][0], failures[0]
    assert failures[1:] == [[] for _ in kept], failures[1:]


@pytest.mark.slow
def test_offsets_are_64_bit_past_2g_elements(tmp_path: Path) -> None:
    """64 x 32 x 8192 x 128 queries and a 64 x 1 x 8192 x 8192 mask (2.1e9 and 4.3e9 elements): every product
    of an operand's or the mask's strides is formed in 64 bits."""
    from .test_templates import _i32_products, _ttir_of

    [m] = [x for x in analyse(load_task(_masked_gqa_task(tmp_path, "bfloat16", 64, 8192))).matches
           if x.template == "attention"]
    src = m.render()
    launch = _launch_of(src, "_attention_kernel", "*bf16", m.default_params(), ("sqd", "skd", "svd", "smn"))
    launch["signature"]["sqb"] = "i64"  # 32 * 8192 * 128: a real launch passes it as i64
    ttir = _ttir_of(src, launch, tmp_path)
    strides = ("sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn", "smb", "smh", "smm")
    assert "scf.for" in ttir and _i32_products(ttir, strides) == []


def test_launch_grid_fits_cudas_limits_and_a_larger_batch_is_refused(tmp_path: Path) -> None:
    """The realistic GQA task (4 x 32 heads, 2048 queries) launches a legal grid at every schedule; batch x
    heads above grid axis 1's 65535 is refused in one line."""
    from .test_templates import _assert_legal_grids, _grids

    [m] = [x for x in analyse(load_task(GQA_TASK)).matches if x.template == "attention"]
    for params in m.configs():
        _assert_legal_grids(m.render(params))
    assert _grids(m.render())["_attention_kernel"] == (16, 128)
    why = _reason(tmp_path, "F.scaled_dot_product_attention(q, k, v)", qkv((2, 32768, 16, 16), (2, 32768, 16, 16),
                                                                              "float16"))
    assert why == "attention over 65536 batches x heads (a grid axis takes 65535)"
