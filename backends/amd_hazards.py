"""A static check for AMDGCN memory-counter hazards: a register used while a load that writes it may
still be outstanding.

On AMD GPUs a memory load returns its data asynchronously; the program must execute an `s_waitcnt`
before it reads (or overwrites) the destination. Vector memory ops (`buffer_`/`global_`/`flat_`/
`scratch_`) count in `vmcnt`; LDS ops (`ds_*`) and scalar loads (`s_load*`) count in `lgkmcnt`.
`s_waitcnt vmcnt(N)` stalls until at most N vector memory ops are outstanding. The model, as in the
ISA documents for gfx9/CDNA:

- vector memory ops (loads and stores) complete in the order they were issued: after `vmcnt(N)` every
  op with at least N younger vector memory ops is done;
- LDS ops complete in order among themselves, but scalar loads may return out of order, so after
  `lgkmcnt(N)` an LDS op is done when at least N LDS ops are younger, and a scalar load only after
  `lgkmcnt(0)`; a FLAT op counts in both counters and is done only when both say so;
- `s_barrier` does not wait for memory: an LDS op still outstanding at a barrier races with the other
  waves' LDS accesses after it, so that is reported too.

Not covered: waits that order memory for atomics and cache invalidations (`s_waitcnt vmcnt(0)` before
`buffer_inv` or a release atomic), which guard memory rather than a register.

The analysis is conservative where the code is unclear: instructions whose counter behaviour is not
certain are not counted (counting fewer younger ops can only keep a load outstanding longer), control
flow is followed through labels and branches with a join that keeps a register outstanding if any
predecessor has it outstanding (with the fewest younger ops), and every appearance of an outstanding
register in a later instruction is a use. A conservative model reports some uses in correct code, so
the check compares a candidate with its original: `waitcnt_hazards(text)` lists the uses,
`new_waitcnt_hazards(original, candidate)` the ones the candidate added, and
`check_waitcnt_hazards(original, candidate)` raises `CheckFailed` when there are any.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from .checks import CheckFailed

#: Where an outstanding load is tracked: the in-order vector memory queue, the in-order LDS queue, or
#: the out-of-order scalar/FLAT part of lgkmcnt (cleared only by `lgkmcnt(0)`).
_SLOTS = ("vm", "lds", "smem")
_COUNTER = {"vm": "vmcnt", "lds": "lgkmcnt", "smem": "lgkmcnt"}

_LABEL = re.compile(r"^([.\w$]+):\s*(?:;.*)?$")
_INSTRUCTION = re.compile(r"^\s+([a-z][a-z0-9_]*)\b(.*)$")
_REGISTER = re.compile(r"(?<![\w.$])([vsa])(?:(\d+)|\[(\d+):(\d+)\])(?![\w$])")
_FUNCTION = re.compile(r"^\s*\.type\s+([\w$.]+)\s*,\s*@function")
_WAIT_FIELD = re.compile(r"(vmcnt|lgkmcnt|expcnt)\((\d+)\)")

Unit = tuple[str, int]
#: The kind of pseudo-unit an LDS write (or an LDS op returning nothing) occupies until it completes,
#: so that an `s_barrier` reached with it outstanding is reported.
_LDS_WRITE = "lds-write"


@dataclass(frozen=True)
class Hazard:
    """A use of `register` at `line` while the load at `load_line` that writes it may be outstanding."""

    line: int
    instruction: str
    register: str
    load_line: int
    load: str
    counter: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What identifies the hazard across two versions of a kernel (line numbers shift)."""
        return (self.instruction, self.load, self.register, self.counter)

    def __str__(self) -> str:
        return (f"line {self.line}: `{self.instruction}` uses {self.register} while `{self.load}` (line "
                f"{self.load_line}) may be outstanding ({self.counter})")


@dataclass(frozen=True)
class _Instruction:
    line: int
    mnemonic: str
    operands: str

    @property
    def text(self) -> str:
        return f"{self.mnemonic} {self.operands}".strip()


@dataclass
class _Block:
    label: str | None
    instructions: list[_Instruction] = field(default_factory=list)
    successors: list[str] = field(default_factory=list)
    falls_through: bool = True


#: (younger ops counted in the load's queue, line of the load, its destination operand, its text)
_Pending = tuple[int, int, str, str]
_State = dict[str, dict[Unit, _Pending]]


def _units(operand_text: str) -> list[tuple[str, list[Unit]]]:
    found = []
    for m in _REGISTER.finditer(operand_text):
        kind = m.group(1)
        if m.group(2) is not None:
            lo = hi = int(m.group(2))
        else:
            lo, hi = int(m.group(3)), int(m.group(4))
        found.append((m.group(0), [(kind, i) for i in range(lo, hi + 1)]))
    return found


def _first_operand(operands: str) -> str:
    return operands.split(",", 1)[0].strip()


def _classify(ins: _Instruction) -> tuple[list[str], str | None]:
    """(slots the instruction is counted in, its destination operand if it returns data)."""
    m = ins.mnemonic
    modifiers = f" {ins.operands} "
    if m.startswith(("buffer_", "global_", "flat_", "scratch_", "tbuffer_", "image_")):
        if not any(k in m for k in ("load", "store", "atomic")):
            return [], None  # cache control (buffer_wbinvl1, buffer_inv, …): counter use not certain
        returns = ("load" in m and " lds " not in modifiers) or (
            "atomic" in m and (" glc " in modifiers or " sc0 " in modifiers or "_rtn" in m))
        slots = ["vm", "smem"] if m.startswith("flat_") else ["vm"]
        return slots, _first_operand(ins.operands) if returns else None
    if m.startswith("ds_"):
        if m.startswith("ds_gws") or m in ("ds_nop",):
            return [], None
        returns = any(k in m for k in ("ds_read", "ds_load", "_rtn", "permute", "swizzle", "ds_append",
                                         "ds_consume", "ds_ordered_count"))
        return ["lds"], _first_operand(ins.operands) if returns else None
    if m.startswith(("s_load_", "s_buffer_load_", "s_scratch_load_")):
        return ["smem"], _first_operand(ins.operands)
    return [], None


def _wait_limits(ins: _Instruction) -> dict[str, int]:
    """Counter limits of an `s_waitcnt` (gfx9 encoding for a numeric operand)."""
    if ins.mnemonic == "s_waitcnt_vmcnt":
        return {"vmcnt": int(ins.operands.split(",")[-1].strip(), 0)}
    if ins.mnemonic == "s_waitcnt_lgkmcnt":
        return {"lgkmcnt": int(ins.operands.split(",")[-1].strip(), 0)}
    fields = {name: int(value) for name, value in _WAIT_FIELD.findall(ins.operands)}
    if fields:
        return fields
    operand = ins.operands.split(";")[0].strip()
    try:
        imm = int(operand, 0)
    except ValueError:
        return {}
    return {"vmcnt": (imm & 0xF) | ((imm >> 14) & 0x3) << 4, "lgkmcnt": (imm >> 8) & 0xF}


def _parse(text: str) -> list[list[_Block]]:
    """The functions of `text`, each as a list of basic blocks in text order."""
    functions = set()
    for raw in text.splitlines():
        m = _FUNCTION.match(raw)
        if m:
            functions.add(m.group(1))
    result: list[list[_Block]] = []
    blocks: list[_Block] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(";", 1)[0].rstrip() if not raw.lstrip().startswith(";") else ""
        label = _LABEL.match(raw)
        if label:
            name = label.group(1)
            if name in functions:
                blocks = [_Block(name)]
                result.append(blocks)
            elif blocks is not None and name.startswith(".Lfunc_end"):
                blocks = None
            elif blocks is not None:
                blocks.append(_Block(name))
            continue
        if blocks is None or not line.strip() or line.lstrip().startswith("."):
            continue
        ins_match = _INSTRUCTION.match(line)
        if not ins_match:
            continue
        ins = _Instruction(number, ins_match.group(1), ins_match.group(2).strip())
        block = blocks[-1]
        block.instructions.append(ins)
        mnemonic = ins.mnemonic
        if mnemonic == "s_branch" or mnemonic.startswith("s_cbranch"):
            block.successors.append(ins.operands.split(",")[-1].strip())
            block.falls_through = mnemonic != "s_branch"
            blocks.append(_Block(None))
        elif mnemonic in ("s_endpgm", "s_setpc_b64", "s_trap"):
            # An indirect jump's target is unknown; Triton kernels have none. Nothing follows here.
            block.falls_through = False
            blocks.append(_Block(None))
    return result


def _join(a: _State, b: _State) -> _State:
    out: _State = {s: dict(a[s]) for s in _SLOTS}
    for slot in _SLOTS:
        for unit, pending in b[slot].items():
            mine = out[slot].get(unit)
            # fewer younger ops = a later wait needed: the conservative side
            if mine is None or (pending[0], pending[1]) < (mine[0], mine[1]):
                out[slot][unit] = pending
    return out


def _transfer(block: _Block, state: _State, hazards: list[Hazard] | None) -> _State:
    st: _State = {s: dict(state[s]) for s in _SLOTS}
    for ins in block.instructions:
        if ins.mnemonic.startswith("s_waitcnt"):
            limits = _wait_limits(ins)
            if "vmcnt" in limits:
                n = limits["vmcnt"]
                st["vm"] = {u: p for u, p in st["vm"].items() if p[0] < n}
            if "lgkmcnt" in limits:
                n = limits["lgkmcnt"]
                st["lds"] = {u: p for u, p in st["lds"].items() if p[0] < n}
                if n == 0:
                    st["smem"] = {}
            continue
        if hazards is not None and ins.mnemonic == "s_barrier":
            # Other waves access LDS after the barrier: this wave's LDS ops must be complete before it
            # (a write could be read stale, a read could see another wave's later write).
            at_barrier = {p[1]: p for p in st["lds"].values()}
            hazards.extend(Hazard(ins.line, ins.text, "LDS", p[1], p[3], "lgkmcnt") for p in at_barrier.values())
        slots, dest = _classify(ins)
        if hazards is not None:
            # A load into the destination of an older load of the same in-order queue lands after it.
            in_order = {(u, s) for _, us in _units(dest or "") for u in us for s in slots if s != "smem"}
            seen: set[tuple[int, str]] = set()
            for _, units in _units(ins.operands):
                for unit in units:
                    for slot in _SLOTS:
                        pending = st[slot].get(unit)
                        if pending is not None and (unit, slot) not in in_order and \
                                (pending[1], _COUNTER[slot]) not in seen:
                            seen.add((pending[1], _COUNTER[slot]))
                            hazards.append(Hazard(ins.line, ins.text, pending[2], pending[1], pending[3],
                                                  _COUNTER[slot]))
        for slot in slots:
            if slot != "smem":  # younger ops count only in the in-order queues
                st[slot] = {u: (p[0] + 1, *p[1:]) for u, p in st[slot].items()}
            if dest:
                for text, units in _units(dest):
                    for unit in units:
                        st[slot][unit] = (0, ins.line, text, ins.text)
            elif slot == "lds":
                st[slot][(_LDS_WRITE, ins.line)] = (0, ins.line, "LDS", ins.text)
    return st


def waitcnt_hazards(amdgcn_text: str) -> list[Hazard]:
    """Every use of a register whose load may still be outstanding, in every function of `amdgcn_text`."""
    hazards: list[Hazard] = []
    for blocks in _parse(amdgcn_text):
        by_label = {b.label: i for i, b in enumerate(blocks) if b.label is not None}
        preds: dict[int, list[int]] = {i: [] for i in range(len(blocks))}
        succs: dict[int, list[int]] = {i: [] for i in range(len(blocks))}
        for i, b in enumerate(blocks):
            targets = [i + 1] if b.falls_through and i + 1 < len(blocks) else []
            targets += [by_label[t] for t in b.successors if t in by_label]
            for j in targets:
                preds[j].append(i)
                succs[i].append(j)
        empty: _State = {s: {} for s in _SLOTS}
        out: dict[int, _State] = {}
        work = list(range(len(blocks)))
        while work:
            i = work.pop(0)
            state = empty
            for p in preds[i]:
                if p in out:
                    state = _join(state, out[p])
            new = _transfer(blocks[i], state, None)
            if out.get(i) != new:
                out[i] = new
                work.extend(j for j in succs[i] if j not in work)
        for i, block in enumerate(blocks):
            state = empty
            for p in preds[i]:
                if p in out:
                    state = _join(state, out[p])
            _transfer(block, state, hazards)
    return sorted(hazards, key=lambda h: (h.line, h.load_line))


def new_waitcnt_hazards(original: str, candidate: str) -> list[Hazard]:
    """The candidate's hazards that the original does not have (matched by instruction text, not line)."""
    budget = Counter(h.key for h in waitcnt_hazards(original))
    new = []
    for h in waitcnt_hazards(candidate):
        if budget[h.key] > 0:
            budget[h.key] -= 1
        else:
            new.append(h)
    return new


def check_waitcnt_hazards(original: str, candidate: str) -> str:
    """Raise `CheckFailed` when `candidate` (AMDGCN text) uses a loaded register before an `s_waitcnt`
    that the original has; otherwise a one-line summary for the verdict."""
    new = new_waitcnt_hazards(original, candidate)
    if new:
        shown = "; ".join(str(h) for h in new[:4])
        more = f" (and {len(new) - 4} more)" if len(new) > 4 else ""
        raise CheckFailed(f"{len(new)} new use(s) of a register before its load is waited for: {shown}{more}")
    known = len(waitcnt_hazards(original))
    return "no new uses of an outstanding load's register" + (
        f" ({known} conservative report(s) shared with the original)" if known else "")
