"""Instruction reordering inside basic blocks (`ptx-reorder`, `amdgcn-reorder`) and redundant conversion
removal (`redundant-cvt`): the dependency rules on hand-made code, the dependency graph's sufficiency by
executing random straight-line programs in every order it allows, real Triton kernels checked pair by
pair against an independent conflict test and re-assembled (ptxas; llvm-mc), and each conversion rule
proven bit for bit with numpy."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from kstrata.backends.ptx import Blank, Brace, Comment, Directive, Instruction, parse_line, parse_ptx, render
from kstrata.passes.ptx_sched import READ_ONLY, ptx_effects, reorder_ptx
from kstrata.passes.schedule import ANY_SPACE, Effects, dependency_graph, list_schedule, order_violations

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
def _run(lines: list[Instruction], regs: dict[str, int], memory: dict[tuple[str, int], int]) -> tuple[object, ...]:
    regs, memory = dict(regs), dict(memory)
    space_of = {"global": "global", "shared": "shared"}
    for ins in lines:
        if ins.predicate and not regs[ins.predicate.lstrip("@!")] ^ ins.predicate.startswith("@!"):
            continue
        ops = [o.strip() for o in ins.operands]
        mods = ins.modifiers

        def val(o: str) -> int:
            return regs[o] if o.startswith("%") else int(o, 0)

        if ins.base_opcode in ("ld", "st"):
            space = space_of.get(mods[0], "global")  # a generic address here maps onto global memory
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


def check_reordering(original: str, result: str) -> int:
    """Assert that `result` only permutes movable instructions between fixed lines and keeps every
    conflicting pair in order; returns how many instructions changed place."""
    fixed_a, seg_a = _segments(original)
    fixed_b, seg_b = _segments(result)
    assert fixed_a == fixed_b and len(seg_a) == len(seg_b)
    moved = 0
    for sa, sb in zip(seg_a, seg_b, strict=True):
        assert Counter(t for t, _ in sa) == Counter(t for t, _ in sb)
        seen: Counter[str] = Counter()
        where: dict[tuple[str, int], int] = {}
        for k, (t, _) in enumerate(sb):
            where[(t, seen[t])] = k
            seen[t] += 1
        seen.clear()
        position = []
        for t, _ in sa:
            position.append(where[(t, seen[t])])
            seen[t] += 1
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
