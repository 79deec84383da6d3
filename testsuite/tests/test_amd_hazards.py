"""The static AMDGCN waitcnt hazard check: the counter model on small hand-written kernels, and real
Triton gfx942 kernels (unmodified: nothing new; an `s_waitcnt` removed: flagged)."""

from __future__ import annotations

import pytest

from kstrata.backends.amd_hazards import check_waitcnt_hazards, new_waitcnt_hazards, waitcnt_hazards
from kstrata.backends.checks import CheckFailed
from kstrata.ir.target import Target
from kstrata.testsuite.kernels import get_kernel
from kstrata.testsuite.kernels.build import bundle_for


def _kernel(body: str) -> str:
    lines = "\n".join(f"\t{ln.strip()}" if ln.strip() and not ln.strip().endswith(":") else ln.strip()
                      for ln in body.strip().splitlines())
    return f"\t.text\n\t.type\tk,@function\nk:\n{lines}\n\ts_endpgm\n.Lfunc_end0:\n"


def _uses(body: str) -> list[tuple[str, str]]:
    return [(h.instruction.split()[0], h.register) for h in waitcnt_hazards(_kernel(body))]


def test_vmcnt_is_in_order() -> None:
    two_loads = """
        global_load_dword v1, v[4:5], off
        global_load_dwordx2 v[2:3], v[4:5], off offset:4
        s_waitcnt vmcnt(1)
        v_add_f32_e32 v6, v1, v1
        v_add_f32_e32 v7, v2, v1
    """
    # after vmcnt(1) the older load is done, the younger (v[2:3]) may not be
    assert _uses(two_loads) == [("v_add_f32_e32", "v[2:3]")]
    assert _uses(two_loads.replace("vmcnt(1)", "vmcnt(0)")) == []
    # a store issued after a load counts in vmcnt too: vmcnt(1) then covers the load
    assert _uses("""
        global_load_dword v1, v[4:5], off
        global_store_dword v[4:5], v9, off
        s_waitcnt vmcnt(1)
        v_mov_b32_e32 v2, v1
    """) == []


def test_lgkmcnt_scalar_loads_are_out_of_order() -> None:
    body = """
        s_load_dwordx2 s[2:3], s[0:1], 0x0
        ds_read_b32 v1, v0
        s_waitcnt lgkmcnt(1)
        v_mov_b32_e32 v2, s2
    """
    # one lgkm op may still be outstanding, and it may be the scalar load
    assert _uses(body) == [("v_mov_b32_e32", "s[2:3]")]
    assert _uses(body.replace("lgkmcnt(1)", "lgkmcnt(0)")) == []
    # LDS ops complete in order among themselves
    assert _uses("""
        ds_read_b32 v1, v0
        ds_read_b32 v2, v0 offset:4
        s_waitcnt lgkmcnt(1)
        v_mov_b32_e32 v3, v1
    """) == []


def test_numeric_waitcnt_and_overwrite_are_handled() -> None:
    assert _uses("global_load_dword v1, v[4:5], off\n s_waitcnt 0\n v_mov_b32_e32 v2, v1") == []
    # gfx9 encoding 0x0f71: vmcnt 1, expcnt 7, lgkmcnt 15
    assert _uses("global_load_dword v1, v[4:5], off\n s_waitcnt 0xf71\n v_mov_b32_e32 v2, v1") == \
        [("v_mov_b32_e32", "v1")]
    # writing the destination of an outstanding load is a hazard too (the load may land afterwards)
    assert _uses("global_load_dword v1, v[4:5], off\n v_mov_b32_e32 v1, 0") == [("v_mov_b32_e32", "v1")]


def test_control_flow_is_followed_conservatively() -> None:
    # the load happens on one path only; the use after the join is still unguarded
    assert _uses("""
        s_cbranch_execz .LBB0_2
        global_load_dword v1, v[4:5], off
        .LBB0_2:
        v_mov_b32_e32 v2, v1
    """) == [("v_mov_b32_e32", "v1")]
    # a load at the bottom of a loop reaches the top of the next iteration
    loop = """
        .LBB0_1:
        v_add_f32_e32 v2, v1, v2
        global_load_dword v1, v[4:5], off
        s_cbranch_scc1 .LBB0_1
        s_waitcnt vmcnt(0)
    """
    assert _uses(loop) == [("v_add_f32_e32", "v1")]
    assert _uses(loop.replace("v_add_f32_e32 v2, v1, v2", "s_waitcnt vmcnt(0)\n v_add_f32_e32 v2, v1, v2")) == []


def test_a_barrier_with_an_outstanding_lds_write_is_flagged() -> None:
    body = "ds_write_b32 v1, v2\n s_waitcnt lgkmcnt(0)\n s_barrier\n ds_read_b32 v3, v1\n s_waitcnt lgkmcnt(0)"
    assert _uses(body) == []
    assert _uses(body.replace(" s_waitcnt lgkmcnt(0)\n s_barrier", " s_barrier", 1)) == [("s_barrier", "LDS")]


@pytest.fixture(scope="module")
def row_max_amdgcn() -> str:
    return bundle_for(get_kernel("row_max"), Target.parse("hip:gfx942")).text("amdgcn")


def test_triton_kernel_compared_with_itself_has_no_new_hazards(row_max_amdgcn: str) -> None:
    assert new_waitcnt_hazards(row_max_amdgcn, row_max_amdgcn) == []
    assert "no new uses" in check_waitcnt_hazards(row_max_amdgcn, row_max_amdgcn)


def test_triton_kernel_with_a_waitcnt_removed_is_flagged(row_max_amdgcn: str) -> None:
    anchor = "\ts_waitcnt vmcnt(1)\n\tv_cndmask_b32_e32 v3, v1, v3, vcc\n"
    assert row_max_amdgcn.count(anchor) == 1
    candidate = row_max_amdgcn.replace(anchor, "\tv_cndmask_b32_e32 v3, v1, v3, vcc\n")
    new = new_waitcnt_hazards(row_max_amdgcn, candidate)
    assert [(h.instruction, h.register, h.counter) for h in new] == \
        [("v_cndmask_b32_e32 v3, v1, v3, vcc", "v3", "vmcnt")]
    assert new[0].load.startswith("buffer_load_dword v3")
    with pytest.raises(CheckFailed, match="1 new use"):
        check_waitcnt_hazards(row_max_amdgcn, candidate)


def test_every_waitcnt_of_a_triton_kernel_guards_something(row_max_amdgcn: str) -> None:
    # each s_waitcnt of this kernel protects a register or an LDS access before a barrier, except the
    # one after the kernel-argument loads of the fallback prologue, whose registers are reloaded
    lines = row_max_amdgcn.splitlines()
    waits = [i for i, ln in enumerate(lines) if ln.strip().startswith("s_waitcnt")]
    flagged = [i for i in waits if waitcnt_hazards("\n".join(lines[:i] + lines[i + 1:]))]
    assert len(waits) >= 6 and len(flagged) >= len(waits) - 2
