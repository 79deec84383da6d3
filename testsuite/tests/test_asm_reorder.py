"""Instruction reordering inside basic blocks (`ptx-reorder`, `amdgcn-reorder`) and redundant conversion
removal (`redundant-cvt`): the dependency rules on hand-made code, the dependency graph's sufficiency by
executing random straight-line programs in every order it allows, real Triton kernels checked pair by
pair against an independent conflict test and re-assembled (ptxas; llvm-mc), and each conversion rule
proven bit for bit with numpy."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kstrata.backends.ptx import Blank, Brace, Comment, Directive, Instruction, parse_line, parse_ptx, render
from kstrata.passes.base import PassContext
from kstrata.passes.ptx_sched import READ_ONLY, ptx_effects, reorder_ptx
from kstrata.passes.schedule import ANY_SPACE, Effects, dependency_graph, list_schedule, order_violations

from .conftest import has_cuda

HEAD = """\
.version 8.7
.target sm_90a
.address_size 64

.visible .entry k(
\t.param .u64 .ptr .global .align 1 k_param_0
)
.reqntid 128
{
\t.reg .pred \t%p<4>;
\t.reg .b32 \t%r<40>;
\t.reg .b64 \t%rd<20>;
"""


def _kernel(body: str) -> str:
    return HEAD + "".join(f"\t{ln.strip()}\n" for ln in body.strip().splitlines()) + "\tret;\n}\n"


def _instructions(text: str) -> list[str]:
    module = parse_ptx(text)
    return [" ".join(str(x) for x in (ins.predicate or "", ins.opcode, ", ".join(ins.operands))).strip()
            for _, ins in module.instructions()]


def _reordered(body: str, strategy: str = "hoist-loads") -> list[str]:
    return _instructions(reorder_ptx(_kernel(body), strategy).text)


LOAD = "ld.global.b32 %r4, [%rd1]"


@pytest.mark.parametrize(("between", "passes"), [
    ("st.shared.b32 [%r9], %r3;", True),  # another state space: the load may pass it
    ("st.local.b32 [%rd5], %r3;", True),
    ("ld.shared.b32 %r7, [%r9];", True),  # loads pass loads
    ("st.global.b32 [%rd2], %r3;", False),  # the same space, address unknown: may alias
    ("st.b32 [%rd2], %r3;", False),  # a generic address aliases every space
    ("bar.sync 0;", False),
    ("membar.gl;", False),
    ("fence.acq_rel.gpu;", False),
    ("atom.shared.add.u32 %r7, [%r9], 1;", False),  # atomics of any space are barriers
    ("red.global.add.u32 [%rd2], 1;", False),
    ("cp.async.wait_group 0;", False),
    ("mbarrier.try_wait.parity.shared::cta.b64 %p3, [%r9], %r3;", False),
    ("wgmma.fence.sync.aligned;", False),
    ("ld.volatile.global.b32 %r7, [%rd2];", False),
    ("mov.u32 %r7, %clock;", False),
    ("frobnicate.b32 %r7, %r3;", False),  # not understood: a full barrier
])
def test_a_load_moves_only_across_what_cannot_alias_or_order_it(between: str, passes: bool) -> None:
    body = f"add.s32 %r1, %r2, 3;\nmul.lo.s32 %r3, %r1, %r1;\n{between}\n{LOAD};"
    out = _reordered(body)
    marker = next(i for i, s in enumerate(out) if s.startswith(between.split()[0].split(";")[0]))
    load = out.index(LOAD)
    assert (load < marker) == passes, out
    assert Counter(out) == Counter(_instructions(_kernel(body)))  # nothing lost or duplicated


def test_register_dependencies_keep_their_order() -> None:
    body = """
    add.s32 %r8, %r4, 1;
    setp.lt.s32 %p1, %r2, %r3;
    mov.u32 %r5, 0x0;
    @%p1 ld.global.b32 { %r5 }, [ %rd1 + 0 ];
    ld.global.v2.b32 { %r6, %r7 }, [ %rd2 + 0 ];
    add.s32 %r9, %r7, %r5;
    ld.global.b32 %r4, [%rd3];
    """
    out = _reordered(body)
    guarded = next(i for i, t in enumerate(out) if t.startswith("@%p1"))
    late_load = out.index("ld.global.b32 %r4, [%rd3]")
    assert out.index("add.s32 %r8, %r4, 1") < late_load  # write after read: the old %r4 is read first
    assert out.index("setp.lt.s32 %p1, %r2, %r3") < guarded  # the guard is read
    assert out.index("mov.u32 %r5, 0x0") < guarded  # a guarded load keeps the old %r5 when %p1 is false
    assert out.index("ld.global.v2.b32 { %r6, %r7 }, [ %rd2 + 0 ]") < out.index("add.s32 %r9, %r7, %r5")
    assert late_load < out.index("add.s32 %r9, %r7, %r5")  # it did move up, past what it does not depend on


def test_nothing_crosses_a_label_or_a_branch() -> None:
    text = _kernel("add.s32 %r1, %r2, 3;\n$L__BB0_1:\nld.global.b32 %r4, [%rd1];").replace("\t$L__BB0_1:", "$L__BB0_1:")
    assert reorder_ptx(text, "hoist-loads").moved == 0
    text = _kernel("add.s32 %r1, %r2, 3;\n@%p1 bra $L__BB0_1;\nld.global.b32 %r4, [%rd1];\n$L__BB0_1:")
    assert reorder_ptx(text, "hoist-loads").moved == 0


# ---------------------------------------------------------------------------------------------------
# The graph is sufficient: random straight-line programs give the same state in every order it allows
# ---------------------------------------------------------------------------------------------------
def _step(ins: Instruction, regs: dict[str, int], memory: dict[tuple[str, int], int]) -> None:
    """One instruction of the small straight-line subset the random programs use, on `regs` and `memory`."""
    if ins.predicate and not regs[ins.predicate.lstrip("@!")] ^ ins.predicate.startswith("@!"):
        return
    ops = [o.strip() for o in ins.operands]
    mods = ins.modifiers

    def val(o: str) -> int:
        return regs[o] if o.startswith("%") else int(o, 0)

    if ins.base_opcode in ("ld", "st"):
        space = {"global": "global", "shared": "shared"}.get(mods[0], "global")  # generic maps onto global
        addr_op = ops[1] if ins.base_opcode == "ld" else ops[0]
        addr = regs[addr_op.strip("[]")]
        if ins.base_opcode == "ld":
            regs[ops[0]] = memory.get((space, addr), 0)
        else:
            memory[(space, addr)] = val(ops[1])
    elif ins.base_opcode == "setp":
        regs[ops[0]] = int(val(ops[1]) < val(ops[2]))
    else:
        a, b = val(ops[1]), val(ops[2])
        regs[ops[0]] = {"add": a + b, "mul": a * b, "xor": a ^ b}[ins.base_opcode] & 0xFFFFFFFF


def _run(lines: list[Instruction], regs: dict[str, int], memory: dict[tuple[str, int], int]) -> tuple[object, ...]:
    regs, memory = dict(regs), dict(memory)
    for ins in lines:
        _step(ins, regs, memory)
    return tuple(sorted(regs.items())), tuple(sorted(memory.items()))


def _run_cfg(text: str, regs: dict[str, int], memory: dict[tuple[str, int], int]) -> tuple[object, ...]:
    """The same, following (forward) branches to labels."""
    from kstrata.backends.ptx import Label

    regs, memory = dict(regs), dict(memory)
    module = parse_ptx(text)
    entry = module.entry()
    body = module.lines[entry.body_start + 1:entry.body_end]
    labels = {ln.name: k for k, ln in enumerate(body) if isinstance(ln, Label)}
    pc = 0
    while pc < len(body):
        ins = body[pc]
        pc += 1
        if not isinstance(ins, Instruction) or ins.base_opcode == "ret":
            continue
        if ins.base_opcode == "bra":
            taken = not ins.predicate or bool(regs[ins.predicate.lstrip("@!")] ^ ins.predicate.startswith("@!"))
            pc = labels[ins.operands[0].strip()] if taken else pc
            continue
        _step(ins, regs, memory)
    return tuple(sorted(regs.items())), tuple(sorted(memory.items()))


def _random_program(rng: random.Random) -> list[Instruction]:
    r = [f"%r{i}" for i in range(1, 6)]
    shapes = [
        lambda: f"add.s32 {rng.choice(r)}, {rng.choice(r)}, {rng.choice(r)};",
        lambda: f"mul.lo.s32 {rng.choice(r)}, {rng.choice(r)}, {rng.randint(2, 9)};",
        lambda: f"xor.b32 {rng.choice(r)}, {rng.choice(r)}, {rng.choice(r)};",
        lambda: f"setp.lt.s32 %p1, {rng.choice(r)}, {rng.choice(r)};",
        lambda: f"@%p1 add.s32 {rng.choice(r)}, {rng.choice(r)}, 1;",
        lambda: f"@!%p1 xor.b32 {rng.choice(r)}, {rng.choice(r)}, 5;",
        lambda: f"ld.global.b32 {rng.choice(r)}, [{rng.choice(['%rd1', '%rd2'])}];",
        lambda: f"st.global.b32 [{rng.choice(['%rd1', '%rd2'])}], {rng.choice(r)};",
        lambda: f"ld.shared.b32 {rng.choice(r)}, [{rng.choice(['%rd1', '%rd3'])}];",
        lambda: f"st.shared.b32 [{rng.choice(['%rd1', '%rd3'])}], {rng.choice(r)};",
        lambda: f"ld.b32 {rng.choice(r)}, [%rd2];",
        lambda: f"st.b32 [%rd1], {rng.choice(r)};",
    ]
    out = []
    for n in range(rng.randint(6, 14)):
        line = parse_line("\t" + rng.choice(shapes)(), n)
        assert isinstance(line, Instruction)
        out.append(line)
    return out


def test_every_order_the_dependency_graph_allows_computes_the_same_state() -> None:
    rng = random.Random(14)
    regs0 = {**{f"%r{i}": 11 * i + 3 for i in range(1, 6)}, "%p1": 0, "%rd1": 64, "%rd2": 64, "%rd3": 128}
    memory0 = {("global", 64): 1000, ("shared", 64): 2000, ("shared", 128): 3000}
    reordered = 0
    for _ in range(300):
        program = _random_program(rng)
        effects = [ptx_effects(ins) for ins in program]
        assert all(e is not None for e in effects)
        preds = dependency_graph([e for e in effects if e is not None], read_only=READ_ONLY)
        want = _run(program, regs0, memory0)
        for _ in range(6):
            ranks = {i: (rng.random(),) for i in range(len(program))}
            order = list_schedule(preds, lambda i, ranks=ranks: ranks[i])  # type: ignore[misc]
            assert not order_violations(preds, order)
            reordered += order != list(range(len(program)))
            assert _run([program[i] for i in order], regs0, memory0) == want, [str(program[i].opcode) for i in order]
    assert reordered > 1000  # the graph is not a chain: most random orders did move something


def test_if_conversion_computes_what_the_branches_did() -> None:
    """Random programs of short forward branches over random blocks (loads, stores, predicated and
    predicate-writing instructions among them), run with every value of the predicates: the if-converted
    program leaves the same registers and memory."""
    from kstrata.passes.ptx_predicate import if_convert

    rng = random.Random(41)
    converted = refused = 0
    for n in range(150):
        body, label = [], 0
        for _ in range(rng.randint(1, 4)):
            body += [i.opcode + " " + ", ".join(i.operands) + ";" if not i.predicate else
                     f"{i.predicate} {i.opcode} {', '.join(i.operands)};" for i in _random_program(rng)[:rng.randint(0, 3)]]
            label += 1
            guard = rng.choice(["@%p1", "@!%p1", "@%p2"])
            block = [f"{i.predicate + ' ' if i.predicate else ''}{i.opcode} {', '.join(i.operands)};"
                     for i in _random_program(rng)[:rng.randint(1, 5)]]
            body += [f"{guard} bra $L__BB{n}_{label};", *block, f"$L__BB{n}_{label}:"]
        text = _kernel("\n".join(body))
        result = if_convert(text, 8)
        converted += len(result.converted)
        refused += len(result.refused)
        for p1 in (0, 1):
            for p2 in (0, 1):
                regs0 = {**{f"%r{i}": 7 * i + 1 for i in range(1, 6)}, "%p1": p1, "%p2": p2, "%rd1": 64, "%rd2": 64,
                         "%rd3": 128}
                memory0 = {("global", 64): 5, ("shared", 128): 9}
                assert _run_cfg(result.text, regs0, memory0) == _run_cfg(text, regs0, memory0), text
    assert converted > 150 and refused > 20  # both kinds occur: predicated or predicate-writing blocks are refused


def test_order_violations_names_a_backward_edge() -> None:
    e = Effects(frozenset({"%r1"}), frozenset())
    u = Effects(frozenset({"%r2"}), frozenset({"%r1"}))
    preds = dependency_graph([e, u])
    assert preds == [set(), {0}] and order_violations(preds, [1, 0]) == [(0, 1)]
    st = Effects(writes=frozenset({ANY_SPACE}))
    ld = Effects(frozenset({"%r3"}), reads=frozenset({"param"}))
    assert dependency_graph([st, ld], read_only=READ_ONLY) == [set(), set()]  # nothing writes .param


# ---------------------------------------------------------------------------------------------------
# Real Triton kernels
# ---------------------------------------------------------------------------------------------------
def _movable(line: object) -> Effects | None:
    return ptx_effects(line) if isinstance(line, Instruction) else None


def _segments(text: str) -> tuple[list[str], list[list[tuple[str, Effects]]]]:
    """The lines that must stay in place (labels, barriers, unknown instructions, …) and, between each
    two of them, the movable instructions in order."""
    module = parse_ptx(text)
    fixed: list[str] = []
    segments: list[list[tuple[str, Effects]]] = [[]]
    depth = 0
    for entry in module.entries:
        for line in module.lines[entry.body_start + 1:entry.body_end]:
            if isinstance(line, (Blank, Comment)) or (isinstance(line, Directive) and line.name == ".loc"):
                continue
            if isinstance(line, Brace):
                depth += 1 if line.brace == "{" else -1
            eff = _movable(line) if depth == 0 else None
            if eff is None:
                fixed.append(render(line).strip())
                segments.append([])
            else:
                assert isinstance(line, Instruction)
                segments[-1].append((line.opcode + " " + " ".join(line.operands) + str(line.predicate), eff))
    return fixed, segments


def _conflict(a: Effects, b: Effects) -> bool:
    """Whether two instructions may not swap: written independently of `dependency_graph`."""
    if a.defs & (b.uses | b.defs) or a.uses & b.defs:
        return True
    def alias(x: str, y: str) -> bool:
        return x not in READ_ONLY and y not in READ_ONLY and (x == y or ANY_SPACE in (x, y))
    return any(alias(x, y) for x in a.writes for y in b.reads | b.writes) or \
        any(alias(x, y) for x in a.reads for y in b.writes)


def _positions(before: list[str], after: list[str]) -> list[int]:
    """Where each instruction of `before` went in `after` (the k-th copy of a line to the k-th copy: two
    identical instructions conflict with each other, so they keep their order)."""
    seen: Counter[str] = Counter()
    where: dict[tuple[str, int], int] = {}
    for k, t in enumerate(after):
        where[(t, seen[t])] = k
        seen[t] += 1
    seen.clear()
    out = []
    for t in before:
        out.append(where[(t, seen[t])])
        seen[t] += 1
    return out


def check_reordering(original: str, result: str, segments: Any = None) -> int:
    """Assert that `result` only permutes movable instructions between fixed lines and keeps every
    conflicting pair in order; returns how many instructions changed place. `segments` splits a text into
    its fixed lines and movable segments (PTX's by default)."""
    split = segments or _segments
    fixed_a, seg_a = split(original)
    fixed_b, seg_b = split(result)
    assert fixed_a == fixed_b and len(seg_a) == len(seg_b)
    moved = 0
    for sa, sb in zip(seg_a, seg_b, strict=True):
        assert Counter(t for t, _ in sa) == Counter(t for t, _ in sb)
        position = _positions([t for t, _ in sa], [t for t, _ in sb])
        moved += sum(1 for k, p in enumerate(position) if k != p)
        for i in range(len(sa)):
            for j in range(i + 1, len(sa)):
                if _conflict(sa[i][1], sa[j][1]):
                    assert position[i] < position[j], (sa[i][0], sa[j][0])
    return moved


REAL = ("vector_add", "layernorm_fwd", "bmm_fp16_bt", "dropout_philox")


def _suite_ptx(suite_cache: Path, name: str) -> tuple[str, object]:
    from kstrata.ir.triton_layout import load_cache_entry, read_index

    index = read_index(suite_cache)
    key = next(k for k, r in index.items() if r.get("suite_kernel") == name and r.get("target") == "cuda:90")
    bundle = load_cache_entry(suite_cache / key)
    return bundle.text("ptx"), bundle


@pytest.mark.parametrize("name", REAL)
def test_real_kernels_keep_every_dependency_and_reassemble_with_ptxas(suite_cache: Path, name: str) -> None:
    from kstrata.backends.nvidia import PtxasOptions, assemble_ptx
    from kstrata.passes.ptx_sched import hot_lines

    ptx, bundle = _suite_ptx(suite_cache, name)
    moved_any = 0
    for strategy in ("hoist-loads", "sink-stores"):
        result = reorder_ptx(ptx, strategy, *hot_lines(ptx))
        if not result.moved:
            continue
        assert check_reordering(ptx, result.text) == result.moved
        moved_any += result.moved
        built = assemble_ptx(result.text, PtxasOptions.from_bundle(bundle))  # type: ignore[arg-type]
        assert built.cubin[:4] == b"\x7fELF"
    assert moved_any, f"{name}: nothing moved"


@pytest.mark.parametrize(("name", "branches"), [("row_clip_norm_if", 1), ("matmul_fp16_bias_gelu_residual", 64)])
def test_real_branches_if_convert_and_reassemble(suite_cache: Path, name: str, branches: int) -> None:
    """The suite's short branches (row_clip_norm's `if`, GELU's erf pieces): each converted one disappears,
    its block gains the negated guard and nothing else changes; ptxas accepts the result."""
    from kstrata.backends.nvidia import PtxasOptions, assemble_ptx
    from kstrata.passes.ptx_predicate import if_convert

    ptx, bundle = _suite_ptx(suite_cache, name)
    result = if_convert(ptx, 8)
    assert len(result.converted) == branches
    before, after = _instructions(ptx), _instructions(result.text)
    assert len(before) - len(after) == branches
    guarded = sum(n for _, n in result.converted)
    assert sum(1 for t in after if t.startswith("@")) - sum(1 for t in before if t.startswith("@")) == guarded - branches
    def strip(texts: list[str]) -> Counter[str]:
        return Counter(re.sub(r"^@!?%\w+ ", "", t) for t in texts)

    removed = strip(before) - strip(after)
    assert sum(removed.values()) == branches and all(t.startswith("bra ") for t in removed)  # only the branches went
    assert not strip(after) - strip(before)  # and nothing new came
    assert assemble_ptx(result.text, PtxasOptions.from_bundle(bundle)).cubin[:4] == b"\x7fELF"  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------
# redundant-cvt: each rule proven on the bits, then the pass executed on hand-made PTX
# ---------------------------------------------------------------------------------------------------
def _samples(bits: int, n: int = 1 << 18) -> np.ndarray:
    """Every value of a 16-bit type; for wider ones random bit patterns plus edges (0, ±1, extremes,
    each single bit)."""
    kind = {16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]
    if bits == 16:
        return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    rng = np.random.default_rng(bits)
    edges = [0, 1, (1 << bits) - 1, 1 << (bits - 1), (1 << (bits - 1)) - 1] + [1 << k for k in range(bits)]
    return np.concatenate([rng.integers(0, 1 << bits, n, dtype=np.uint64, endpoint=False).astype(kind)
                           if bits < 64 else rng.integers(0, np.iinfo(np.uint64).max, n, dtype=np.uint64),
                           np.array(edges, dtype=kind)])


_NP_INT = {"u16": np.uint16, "s16": np.int16, "u32": np.uint32, "s32": np.int32, "u64": np.uint64, "s64": np.int64}


@pytest.mark.parametrize("bits", [16, 32, 64])
def test_rule_same_width_integer_conversions_copy_the_bits(bits: int) -> None:
    x = _samples(bits)
    for src in (f"u{bits}", f"s{bits}"):
        for dst in (f"u{bits}", f"s{bits}"):
            value = x.view(_NP_INT[src])
            converted = value.astype(_NP_INT[dst])  # PTX cvt without .sat: the value modulo 2^bits
            assert np.array_equal(converted.view(x.dtype), x), (src, dst)


@pytest.mark.parametrize(("narrow", "wide"), [(16, 32), (16, 64), (32, 64)])
def test_rule_narrowing_a_widening_gives_back_the_source(narrow: int, wide: int) -> None:
    x = _samples(narrow)
    for src in (f"u{narrow}", f"s{narrow}"):
        for mid in (f"u{wide}", f"s{wide}"):
            widened = x.view(_NP_INT[src]).astype(_NP_INT[mid])  # sign- or zero-extension by the source type
            assert widened.dtype.itemsize * 8 == wide
            for dst in (f"u{narrow}", f"s{narrow}"):
                back = widened.astype(_NP_INT[dst])  # truncation
                assert np.array_equal(back.view(x.dtype), x), (src, mid, dst)


def test_rule_float_round_trips_are_exact_and_keep_nans_nan() -> None:
    import torch

    h = _samples(16).view(np.float16)
    wide = h.astype(np.float32)
    back = wide.astype(np.float16)
    nan = np.isnan(h)
    assert np.array_equal(back.view(np.uint16)[~nan], h.view(np.uint16)[~nan])  # every f16 value, ±0, inf, subnormals
    assert np.isnan(back[nan]).all() and nan.sum() == 2046
    assert np.array_equal(wide.astype(np.float16).astype(np.float32)[~nan], wide[~nan])  # a fixed point: any rounding mode
    b = torch.from_numpy(_samples(16).view(np.int16).copy()).view(torch.bfloat16)
    bw = b.to(torch.float32)
    assert torch.equal(bw.view(torch.int32) >> 16 & 0xFFFF, b.view(torch.int16).to(torch.int32) & 0xFFFF)  # exact widening
    bb = bw.to(torch.bfloat16)
    bnan = torch.isnan(b)
    assert torch.equal(bb.view(torch.int16)[~bnan], b.view(torch.int16)[~bnan]) and torch.isnan(bb[bnan]).all()
    f = _samples(32).view(np.float32)
    fnan = np.isnan(f)
    with np.errstate(invalid="ignore"):  # numpy warns on casting NaNs; their NaN-ness is what is checked
        ff = f.astype(np.float64).astype(np.float32)
    assert np.array_equal(ff.view(np.uint32)[~fnan], f.view(np.uint32)[~fnan]) and np.isnan(ff[fnan]).all()


def _width_of(reg: str) -> int:
    return 16 if reg.startswith("%rs") else 64 if reg.startswith("%rd") else 1 if reg.startswith("%p") else 32


def _signed(v: np.ndarray, bits: int) -> np.ndarray:
    v = v.astype(np.uint64) & np.uint64((1 << bits) - 1 if bits < 64 else ~0 & 0xFFFFFFFFFFFFFFFF)
    return v.astype(np.int64) - ((v >> np.uint64(bits - 1)) & np.uint64(1)).astype(np.int64) * (1 << bits) \
        if bits < 64 else v.view(np.int64)


def _evaluate(text: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A numpy model of the straight-line PTX the conversion tests use: every register as an array of
    uint64 bit patterns (one lane per sample), cvt by its PTX definition."""
    import torch

    regs = dict(inputs)
    for _, ins in parse_ptx(text).instructions():
        ops = [o.strip() for o in ins.operands]
        mods, base = ins.modifiers, ins.base_opcode
        if base in ("ld", "st", "ret"):
            continue
        dest = ops[0]
        dw = _width_of(dest)
        if base == "setp":
            new = (_signed(regs[ops[1]], 32) < _signed(regs[ops[2]], 32)).astype(np.uint64)
        elif base == "add":
            new = (regs[ops[1]] + np.uint64(int(ops[2]))) & np.uint64(0xFFFFFFFF)
        elif base == "mov":
            new = regs[ops[1]].copy()
        else:
            assert base == "cvt"
            types = [m for m in mods if re.fullmatch(r"[usfb]f?\d+", m)]
            dst, src = types
            s = regs[ops[1]]
            if dst in _NP_INT and src in _NP_INT:
                sb, db = _INT_BITS[src], _INT_BITS[dst]
                value = _signed(s, sb) if src[0] == "s" else (s & np.uint64((1 << sb) - 1 if sb < 64 else 0xFFFFFFFFFFFFFFFF)).astype(np.int64 if sb < 64 else np.uint64)
                if "sat" in mods:
                    lo, hi = (0, (1 << db) - 1) if dst[0] == "u" else (-(1 << (db - 1)), (1 << (db - 1)) - 1)
                    value = np.clip(value.astype(np.float64), lo, hi).astype(np.int64)
                bits = value.astype(np.uint64) & np.uint64((1 << db) - 1 if db < 64 else 0xFFFFFFFFFFFFFFFF)
                new = (_signed(bits, db).astype(np.uint64) if dst[0] == "s" else bits) & \
                    np.uint64((1 << dw) - 1 if dw < 64 else 0xFFFFFFFFFFFFFFFF)
            else:
                fl = {"f16": np.float16, "f32": np.float32, "f64": np.float64}
                ui = {16: np.uint16, 32: np.uint32, 64: np.uint64}
                if src == "bf16":
                    value32 = ((s & np.uint64(0xFFFF)) << np.uint64(16)).astype(np.uint32).view(np.float32)
                    srcv: np.ndarray = value32
                else:
                    srcv = s.astype(ui[_FLT_BITS[src]]).view(fl[src])
                if dst == "bf16":
                    t = torch.from_numpy(srcv.astype(np.float32)).to(torch.bfloat16).view(torch.int16).numpy()
                    new = t.view(np.uint16).astype(np.uint64)
                else:
                    out = srcv.astype(fl[dst])
                    if "ftz" in mods and dst == "f32":
                        out = np.where(np.abs(out) < np.finfo(np.float32).tiny, np.copysign(0, out), out).astype(np.float32)
                    new = out.view(ui[_FLT_BITS[dst]]).astype(np.uint64)
        if ins.predicate:
            guard = regs[ins.predicate.lstrip("@!")].astype(bool) ^ ins.predicate.startswith("@!")
            new = np.where(guard, new, regs.get(dest, np.zeros_like(new)))
        regs[dest] = new
    return regs


_INT_BITS = {"u16": 16, "s16": 16, "u32": 32, "s32": 32, "u64": 64, "s64": 64}
_FLT_BITS = {"f16": 16, "bf16": 16, "f32": 32, "f64": 64}
CONVERSIONS = Path(__file__).resolve().parents[1] / "filecheck" / "ptx" / "inputs" / "conversions.ptx"


def test_redundant_cvt_computes_the_same_registers_and_reassembles() -> None:
    """Executed: the original and the rewritten kernel on 2^18 random and edge inputs per parameter (NaN
    bit patterns included) give the same bits in every register the rewritten one still defines (NaNs
    may differ only in payload, and only in the float round trips)."""
    from kstrata.backends.nvidia import PtxasOptions, assemble_ptx
    from kstrata.passes.ptx_cvt import remove_redundant_conversions

    text = CONVERSIONS.read_text()
    result = remove_redundant_conversions(text)
    assert len(result.rewritten) == 8 and len(result.deleted) == 5
    x = _samples(32)
    y = np.random.default_rng(2).permutation(x)
    inputs = {"%r1": x.astype(np.uint64), "%r20": y.astype(np.uint64), "%rd1": np.zeros(len(x), np.uint64)}
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and out-of-range casts are what the model computes
        before, after = _evaluate(text, inputs), _evaluate(result.text, inputs)
    floats = {"%rs3": np.float16, "%rs6": np.float16, "%r9": np.float32, "%r14": np.float32}
    def bf16_nan(v: np.ndarray) -> np.ndarray:
        return ((v & np.uint64(0x7F80)) == np.uint64(0x7F80)) & ((v & np.uint64(0x7F)) != np.uint64(0))

    for reg, value in after.items():
        same = before[reg] == value
        if reg == "%rs5":  # the bf16 round trip
            same |= bf16_nan(before[reg]) & bf16_nan(value)
        elif reg in floats:
            kind = floats[reg]
            width = {np.float16: np.uint16, np.float32: np.uint32}[kind]
            same |= np.isnan(before[reg].astype(width).view(kind)) & np.isnan(value.astype(width).view(kind))
        assert same.all(), reg
    assert set(before) - set(after) == {"%rd2", "%r6", "%r8", "%rd3", "%r11"}  # the deleted producers
    for ptx in (text, result.text):
        opts = PtxasOptions(arch="sm_90a")
        assert assemble_ptx(ptx, opts).cubin[:4] == b"\x7fELF"


# ---------------------------------------------------------------------------------------------------
# amdgcn-reorder
# ---------------------------------------------------------------------------------------------------
AMD_DEMO = Path(__file__).resolve().parents[1] / "filecheck" / "amdgcn" / "inputs" / "reorder.amdgcn"


def _amd_function(body: str) -> str:
    head = ('\t.amdgcn_target "amdgcn-amd-amdhsa--gfx942"\n\t.text\n\t.globl\tk\n\t.p2align\t8\n'
            "\t.type\tk,@function\nk:\n")
    return head + "".join(f"\t{ln.strip()}\n" for ln in body.strip().splitlines()) + \
        "\ts_endpgm\n.Lfunc_end0:\n\t.size\tk, .Lfunc_end0-k\n"


def _amd_instructions(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.startswith("\t") and ln.strip()[:1].isalpha()
            and not ln.strip().startswith(".")]


@pytest.mark.parametrize(("between", "passes"), [
    ("v_mul_f32_e32 v7, v6, v6", True),
    ("ds_write_b32 v6, v7", True),  # LDS is another space and another counter
    ("s_waitcnt vmcnt(0)", False),
    ("s_waitcnt lgkmcnt(0)", False),
    ("s_barrier", False),
    ("s_setprio 1", False),
    ("s_dcache_wb", False),
    ("buffer_wbl2 sc1", False),
    ("buffer_inv sc1", False),
    ("s_nop 0", False),
    ("global_store_dword v6, v7, s[4:5]", False),  # same space, and vector memory ops keep their order
    ("global_load_dword v9, v6, s[4:5]", False),  # loads keep their order too (vmcnt counts in order)
    ("global_atomic_add v6, v7, s[4:5]", False),
    ("v_readfirstlane_b32 s9, v7", False),
    ("v_mov_b32_dpp v7, v6 row_shr:1 row_mask:0xf bank_mask:0xf", False),
    ("s_mov_b64 exec, s[10:11]", False),
    ("v_mfma_f32_4x4x1f32 v[10:13], v6, v7, v[10:13]", False),
])
def test_an_amd_load_moves_only_across_what_cannot_order_it(between: str, passes: bool) -> None:
    from kstrata.passes.amdgcn_sched import reorder_amdgcn

    body = f"v_add_f32_e32 v1, v2, v3\nv_mul_f32_e32 v4, v1, v1\nv_add_f32_e32 v5, v4, v1\n{between}\n" \
           "global_load_dword v8, v0, s[2:3]"
    out = _amd_instructions(reorder_amdgcn(_amd_function(body), "hoist-loads").text)
    assert Counter(out) == Counter(_amd_instructions(_amd_function(body)))
    load = out.index("global_load_dword v8, v0, s[2:3]")
    assert (load < out.index(between)) == passes, out


def test_amd_reordering_keeps_wait_state_distances() -> None:
    """A VALU write of an SGPR read by a vector memory op needs 5 wait states: the load moves up, but not
    closer than that to the v_cmp that writes its address register."""
    from kstrata.passes.amdgcn_sched import reorder_amdgcn

    body = "v_cmp_gt_i32_e64 s[4:5], v1, v2\n" + "".join(f"v_add_f32_e32 v{10 + k}, v{10 + k}, v3\n" for k in range(7)) \
        + "global_load_dword v9, v3, s[4:5]\nv_add_f32_e32 v20, v21, v22"
    out = _amd_instructions(reorder_amdgcn(_amd_function(body), "hoist-loads").text)
    load, cmp = out.index("global_load_dword v9, v3, s[4:5]"), out.index("v_cmp_gt_i32_e64 s[4:5], v1, v2")
    assert load - cmp == 5, out  # moved up from 8, and no closer than 5
    plain = body.replace("v_cmp_gt_i32_e64 s[4:5], v1, v2", "s_mov_b64 s[4:5], s[6:7]")
    out = _amd_instructions(reorder_amdgcn(_amd_function(plain), "hoist-loads").text)
    assert out.index("global_load_dword v9, v3, s[4:5]") - out.index("s_mov_b64 s[4:5], s[6:7]") == 1  # SALU: no hazard


def _amd_segments(text: str) -> tuple[list[str], list[list[tuple[str, Effects]]]]:
    from kstrata.passes.amdgcn_sched import amdgcn_effects, loaded_registers

    loaded = loaded_registers(text)

    fixed: list[str] = []
    segments: list[list[tuple[str, Effects]]] = [[]]
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith(";") or s.startswith(".loc"):
            continue
        m = re.match(r"^\s+([a-z][a-z0-9_]*)\b([^;]*)", line)
        eff = amdgcn_effects(m.group(1), m.group(2), loaded) if m and not s.startswith(".") else None
        if eff is None:
            fixed.append(s)
            segments.append([])
        else:
            segments[-1].append((s.split(";")[0].strip(), eff))
    return fixed, segments


def _check_amd(original: str, result: str) -> int:
    return check_reordering(original, result, segments=_amd_segments)


def _encodings(text: str) -> list[tuple[str, str]]:
    import subprocess

    from kstrata.backends.amd import find_amd_tool

    mc = find_amd_tool("llvm-mc")
    out = subprocess.run([str(mc.path), "-triple=amdgcn-amd-amdhsa", "-mcpu=gfx942", "-show-encoding"], input=text,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [(m.group(1).strip(), m.group(2)) for m in re.finditer(r"^\s+([a-z][^;\n]*?)\s*; encoding: (\[[^\]]*\])", out, re.M)]


def test_amd_demo_reassembles_to_the_same_encodings_permuted() -> None:
    from kstrata.backends.amd_hazards import new_waitcnt_hazards
    from kstrata.backends.tools import ToolNotFound
    from kstrata.passes.amdgcn_sched import reorder_amdgcn

    text = AMD_DEMO.read_text()
    for strategy, moved in (("hoist-loads", 6), ("sink-stores", 3)):
        result = reorder_amdgcn(text, strategy)
        assert result.moved == moved and _check_amd(text, result.text) == moved
        assert not new_waitcnt_hazards(text, result.text)
        try:
            before, after = _encodings(text), _encodings(result.text)
        except ToolNotFound as exc:
            pytest.skip(f"llvm-mc is not installed ({exc}); make setup installs llvm-22")
        assert Counter(before) == Counter(after) and before != after  # each instruction encodes as before


def test_amd_waits_sink_past_independent_work_only() -> None:
    """`sink-waits`: an s_waitcnt moves down past instructions that touch no register a load may write; a
    use of a loaded register, a write to one and every memory op stay on their side, and the s_waitcnt
    hazard check finds nothing new."""
    from kstrata.backends.amd_hazards import new_waitcnt_hazards
    from kstrata.passes.amdgcn_sched import reorder_amdgcn

    body = """
    global_load_dword v1, v0, s[2:3]
    global_load_dword v5, v0, s[2:3] offset:64
    v_mul_f32_e32 v9, v8, v8
    s_waitcnt vmcnt(1)
    v_add_f32_e32 v2, v1, v1
    v_mul_f32_e32 v3, v7, v7
    v_mov_b32_e32 v5, 0
    v_add_f32_e32 v4, v3, v6
    global_store_dword v0, v4, s[4:5]
    v_fma_f32 v10, v9, v9, v6
    """
    text = _amd_function(body)
    result = reorder_amdgcn(text, "sink-waits")
    out = _amd_instructions(result.text)
    wait = out.index("s_waitcnt vmcnt(1)")
    assert out.index("v_mul_f32_e32 v3, v7, v7") < wait and out.index("v_add_f32_e32 v4, v3, v6") < wait  # independent
    assert out.index("v_fma_f32 v10, v9, v9, v6") < wait
    assert wait < out.index("v_add_f32_e32 v2, v1, v1")  # reads the loaded v1
    assert wait < out.index("v_mov_b32_e32 v5, 0")  # writes v5, which the second load may still write
    assert wait < out.index("global_store_dword v0, v4, s[4:5]")  # a memory op: the count must not change
    assert not new_waitcnt_hazards(text, result.text) and _check_amd(text, result.text) == result.moved > 0


@pytest.mark.parametrize(("name", "strategy"), [("layernorm_bwd_dx", "hoist-loads"), ("rmsnorm_bwd", "sink-waits")])
def test_a_real_gfx942_kernel_reorders_and_relinks_consistently(suite_cache: Path, name: str, strategy: str) -> None:
    """Real gfx942 kernels (hot window: the whole kernel): the reordered text keeps every
    dependency, adds no s_waitcnt hazard, and reassembles and links to an hsaco whose non-debug sections
    are byte-identical to a re-assembly of the unmodified text and whose .text holds the same instruction
    words, permuted inside the blocks (branches at the same addresses)."""
    from kstrata.backends.amd import disassemble_hsaco, reassemble_amdgcn
    from kstrata.backends.amd_hazards import new_waitcnt_hazards
    from kstrata.backends.elf import read_elf
    from kstrata.backends.tools import ToolNotFound
    from kstrata.ir.triton_layout import load_cache_entry, read_index
    from kstrata.passes.amdgcn_sched import hot_lines, reorder_amdgcn

    index = read_index(suite_cache)
    key = next(k for k, r in index.items() if r.get("suite_kernel") == name and r.get("target") == "hip:gfx942")
    text = load_cache_entry(suite_cache / key).text("amdgcn")
    result = reorder_amdgcn(text, strategy, *hot_lines(text))
    assert result.moved > 0 and _check_amd(text, result.text) == result.moved
    assert not new_waitcnt_hazards(text, result.text)
    try:
        a, b = reassemble_amdgcn(text, "gfx942"), reassemble_amdgcn(result.text, "gfx942")
    except ToolNotFound as exc:
        pytest.skip(f"llvm-mc/ld.lld are not installed ({exc}); make setup installs llvm-22")
    ea, eb = read_elf(a), read_elf(b)
    names = [s.name for s in ea.sections]
    assert names == [s.name for s in eb.sections]
    for name in names:
        if name and name != ".text" and not name.startswith(".debug"):  # line info moved with the instructions
            assert ea.section(name).data == eb.section(name).data, name
    ia, ib = disassemble_hsaco(a, "gfx942"), disassemble_hsaco(b, "gfx942")
    assert Counter(i.words for i in ia) == Counter(i.words for i in ib) and ia != ib
    branches = [(i.address, i.words) for i in ia if i.mnemonic.startswith(("s_branch", "s_cbranch"))]
    assert branches == [(i.address, i.words) for i in ib if i.mnemonic.startswith(("s_branch", "s_cbranch"))]


# ---------------------------------------------------------------------------------------------------
# On an NVIDIA GPU: the differential run decides (skipped here)
# ---------------------------------------------------------------------------------------------------
GPU_CASES = [("vector_add", "ptx(ptx-reorder)"), ("layernorm_fwd", "ptx(ptx-reorder)"),
             ("layernorm_fwd", "ptx(ptx-reorder{strategy=sink-stores})"), ("dropout_philox", "ptx(ptx-reorder)"),
             ("rmsnorm_bwd", "ptx(redundant-cvt)"), ("col_sum_i32", "ptx(redundant-cvt)"),
             ("row_clip_norm_if", "ptx(ptx-predicate)"), ("matmul_fp16_bias_gelu_residual", "ptx(ptx-predicate)")]


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize(("name", "pipeline"), GPU_CASES)
def test_on_a_gpu_the_rewrites_are_equivalent_by_the_differential_run(name: str, pipeline: str) -> None:
    from kstrata.backends.verify import Verdict, verify
    from kstrata.ir.target import Target
    from kstrata.passes.pipeline import parse_pipeline, run_pipeline
    from kstrata.tools.suite import load_suite

    suite = load_suite()
    original = suite.bundle_for(suite.get_kernel(name), Target.parse("cuda:90"))
    outcome = run_pipeline(original, parse_pipeline(pipeline))
    assert outcome.changed, outcome.records[0].reason
    report = verify(original, outcome.bundle, device="cuda", seeds=2, sanitizer="none")
    assert report.verdict is Verdict.EQUIVALENT, [(c.name, c.verdict, c.detail) for c in report.checks]


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda(), reason="needs an NVIDIA GPU")
def test_on_a_gpu_a_store_moved_above_its_value_is_caught() -> None:
    """The planted counterpart: the first global store of vector_add moved up, above the add that computes
    the value it stores (an order the dependency graph forbids), must be `different`."""
    from kstrata.backends.rebuild import rebuild_from
    from kstrata.backends.verify import Verdict, verify
    from kstrata.ir.target import Target
    from kstrata.tools.suite import load_suite

    suite = load_suite()
    original = suite.bundle_for(suite.get_kernel("vector_add"), Target.parse("cuda:90"))
    wrong = rebuild_from(original, "ptx", _store_above_its_value(original.text("ptx")))
    report = verify(original, wrong, device="cuda", seeds=1, sanitizer="none")
    assert report.verdict is Verdict.DIFFERENT


def _store_above_its_value(ptx: str) -> str:
    lines = ptx.split("\n")
    store = next(i for i, ln in enumerate(lines) if "st.global" in ln)
    first_add = next(i for i, ln in enumerate(lines) if ln.strip().startswith("add.f32"))
    return "\n".join(lines[:first_add] + [lines[store]] + [ln for i, ln in enumerate(lines) if i >= first_add and i != store])


def test_the_planted_reordering_breaks_a_dependency(suite_cache: Path) -> None:
    """On the CPU: the independent pairwise check rejects the planted order the GPU test runs."""
    ptx, _ = _suite_ptx(suite_cache, "vector_add")
    with pytest.raises(AssertionError):
        check_reordering(ptx, _store_above_its_value(ptx))


@pytest.mark.parametrize(("name", "limit"), [("flash_attention_fwd", 4), ("row_clip_norm_if", 8),
                                             ("matmul_fp16_bias_gelu_residual", 8)])
def test_the_predication_space_offers_a_larger_limit_only_when_it_converts_more(suite_cache: Path, name: str,
                                                                                  limit: int) -> None:
    from kstrata.passes.ptx_predicate import PtxPredicate

    _, bundle = _suite_ptx(suite_cache, name)
    assert PtxPredicate.schedule_space(bundle).spellings() == [f"ptx-predicate{{max_instructions={limit} scope=all}}"]  # type: ignore[arg-type]
    assert PtxPredicate(max_instructions=16).precondition(PassContext(bundle, "ptx")) is None  # type: ignore[arg-type]


def test_the_survey_reports_each_pass_on_each_kernel(suite_cache: Path, tmp_path: Path) -> None:
    from kstrata.tools.asm_pass_survey import AMD_PIPELINES, PTX_PIPELINES, command

    from .conftest import copy_suite_subset

    cache = copy_suite_subset(suite_cache, tmp_path / "cache", ("vector_add",))
    assert command(cache, tmp_path / "results", None) == 0
    payload = json.loads(next((tmp_path / "results").glob("asm-pass-survey-*.json")).read_text())
    by = {(r["target"], r["pass"]): r for r in payload["rows"]}
    assert set(by) == {("cuda:90", p) for p in PTX_PIPELINES} | {("hip:gfx942", p) for p in AMD_PIPELINES}
    hoist = by[("cuda:90", "ptx-reorder{strategy=hoist-loads scope=hot}")]
    assert hoist["status"] == "changed" and isinstance(hoist["machine_code_differs"], bool)
    assert by[("cuda:90", "redundant-cvt")]["status"] == "skipped"
    assert "| `cuda:90 ptx-reorder{strategy=hoist-loads scope=hot}` | 1 | 1 |" in \
        next((tmp_path / "results").glob("asm-pass-survey-*.md")).read_text()
