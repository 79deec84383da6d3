"""A model of PTX text: module directives, entries and their parameters, register declarations, labels
and (predicated) instructions, that prints back byte for byte.

Every line is classified and split into fields; printing re-renders each line from its fields, so the
identity `str(parse_ptx(text)) == text` checks the parser itself, not a copy of the input. An edit
changes fields (an instruction's opcode, operands or predicate) and the printer renders them in the
same layout as the line it replaces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from kstrata.ir.errors import KstrataError


class PtxError(KstrataError):
    """PTX text the model cannot read."""


# -- lines -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PtxLine:
    """One source line. `trail` is what follows the statement: spaces and an optional `//` comment."""

    lineno: int


@dataclass(frozen=True)
class Blank(PtxLine):
    text: str  # whitespace only


@dataclass(frozen=True)
class Comment(PtxLine):
    indent: str
    text: str  # starting with //


@dataclass(frozen=True)
class Brace(PtxLine):
    indent: str
    brace: str  # "{" or "}"
    trail: str = ""


@dataclass(frozen=True)
class Label(PtxLine):
    indent: str
    name: str
    trail: str = ""


@dataclass(frozen=True)
class Directive(PtxLine):
    """A line starting with a `.directive`: `.version`, `.target`, `.reg`, `.loc`, `.param …,`, `.reqntid`, …"""

    indent: str
    name: str  # e.g. ".reg"
    sep: str  # whitespace between the name and the rest
    rest: str  # everything up to the trail, including a final `;` or `,` or `(` when present
    trail: str = ""


@dataclass(frozen=True)
class Instruction(PtxLine):
    """`[@[!]%p] opcode[.mod…] operand, operand;` — operands split at top-level commas."""

    indent: str
    predicate: str | None  # e.g. "@%p1" or "@!%p3"
    pred_sep: str  # whitespace after the predicate
    opcode: str  # e.g. "ld.global.v4.b32"
    sep: str  # whitespace between the opcode and the operands
    operands: tuple[str, ...]
    operand_seps: tuple[str, ...]  # the separators between operands, e.g. (", ", ", ")
    semicolon_space: str = ""  # whitespace before the `;`
    trail: str = ""

    @property
    def base_opcode(self) -> str:
        return self.opcode.split(".", 1)[0]

    @property
    def modifiers(self) -> tuple[str, ...]:
        return tuple(self.opcode.split(".")[1:])

    def with_opcode(self, opcode: str) -> Instruction:
        return replace(self, opcode=opcode)

    def with_operands(self, operands: tuple[str, ...]) -> Instruction:
        seps = self.operand_seps[: max(len(operands) - 1, 0)]
        seps += (", ",) * (max(len(operands) - 1, 0) - len(seps))
        return replace(self, operands=operands, operand_seps=seps, sep=self.sep or " ")


@dataclass(frozen=True)
class Raw(PtxLine):
    """A line the model keeps as text (e.g. the entry header `.visible .entry name(`)."""

    text: str


def render(line: PtxLine) -> str:
    """The text of one line, rendered from its fields."""
    if isinstance(line, Blank):
        return line.text
    if isinstance(line, Comment):
        return line.indent + line.text
    if isinstance(line, Brace):
        return line.indent + line.brace + line.trail
    if isinstance(line, Label):
        return f"{line.indent}{line.name}:{line.trail}"
    if isinstance(line, Directive):
        return f"{line.indent}{line.name}{line.sep}{line.rest}{line.trail}"
    if isinstance(line, Instruction):
        pred = f"{line.predicate}{line.pred_sep}" if line.predicate else ""
        ops = ""
        for i, op in enumerate(line.operands):
            ops += op if i == 0 else line.operand_seps[i - 1] + op
        body = f"{line.opcode}{line.sep}{ops}" if line.operands else line.opcode + line.sep
        return f"{line.indent}{pred}{body}{line.semicolon_space};{line.trail}"
    if isinstance(line, Raw):
        return line.text
    raise TypeError(f"not a PTX line: {line!r}")


# -- parsing -----------------------------------------------------------------------------------------
_TRAIL = r"(?P<trail>\s*(?://.*)?)$"
_LABEL = re.compile(r"^(?P<indent>\s*)(?P<name>[$%\w.]+):" + _TRAIL)
_BRACE = re.compile(r"^(?P<indent>\s*)(?P<brace>[{}])" + _TRAIL)
_DIRECTIVE = re.compile(r"^(?P<indent>\s*)(?P<name>\.[a-z_][\w]*)(?P<sep>\s*)(?P<rest>.*?)" + _TRAIL)
_INSTR = re.compile(
    r"^(?P<indent>\s*)(?:(?P<pred>@!?%[\w]+)(?P<pred_sep>\s+))?(?P<opcode>[a-z][\w.:]*)(?P<sep>\s*)"
    r"(?P<ops>.*?)(?P<semi_space>\s*);" + _TRAIL
)


def _split_operands(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Split at commas outside brackets; returns (operands, separators) with separators kept verbatim."""
    operands: list[str] = []
    seps: list[str] = []
    depth = 0
    start = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            j = i + 1
            while j < len(text) and text[j] == " ":
                j += 1
            # trailing spaces of the operand belong to the separator too
            k = i
            while k > start and text[k - 1] == " ":
                k -= 1
            operands.append(text[start:k])
            seps.append(text[k:j])
            start = j
            i = j
            continue
        i += 1
    if text[start:] or operands:
        operands.append(text[start:])
    return tuple(operands), tuple(seps)


def _comment_only(code: str) -> bool:
    return code.lstrip().startswith("//")


def parse_line(text: str, lineno: int) -> PtxLine:
    """Classify and split one line of PTX."""
    if not text.strip():
        return Blank(lineno, text)
    if _comment_only(text):
        stripped = text.lstrip()
        return Comment(lineno, text[: len(text) - len(stripped)], stripped)
    m = _BRACE.match(text)
    if m:
        return Brace(lineno, m["indent"], m["brace"], m["trail"])
    m = _LABEL.match(text)
    if m and not text.lstrip().startswith("."):
        return Label(lineno, m["indent"], m["name"], m["trail"])
    if text.lstrip().startswith("."):
        m = _DIRECTIVE.match(text)
        if m:
            return Directive(lineno, m["indent"], m["name"], m["sep"], m["rest"], m["trail"])
    m = _INSTR.match(text)
    if m:
        operands, seps = _split_operands(m["ops"]) if m["ops"] else ((), ())
        return Instruction(lineno, m["indent"], m["pred"], m["pred_sep"] or "", m["opcode"], m["sep"], operands, seps,
                           m["semi_space"], m["trail"])
    return Raw(lineno, text)


@dataclass(frozen=True)
class PtxParam:
    """One `.param` of an entry: its type (`.u64`), attributes (`.ptr .global .align 1`) and name."""

    type: str
    attributes: tuple[str, ...]
    name: str


@dataclass
class PtxEntry:
    """A `.entry` (kernel): name, parameters, launch directives and the line range of its body."""

    name: str
    visible: bool
    params: list[PtxParam]
    reqntid: tuple[int, ...] | None
    maxntid: tuple[int, ...] | None
    maxnreg: int | None
    body_start: int  # index of the opening `{` line in PtxModule.lines
    body_end: int  # index of the matching `}` line


@dataclass
class PtxModule:
    """A PTX file as a list of lines, with the module directives and entries indexed."""

    lines: list[PtxLine]
    trailing_newline: bool
    version: str = ""
    target: str = ""
    address_size: int = 64
    entries: list[PtxEntry] = field(default_factory=list)

    def __str__(self) -> str:
        text = "\n".join(render(line) for line in self.lines)
        return text + ("\n" if self.trailing_newline else "")

    def entry(self, name: str | None = None) -> PtxEntry:
        """The entry called `name`, or the only entry when `name` is None."""
        if name is None:
            if len(self.entries) != 1:
                raise PtxError(f"module has {len(self.entries)} entries; name one of "
                               + ", ".join(e.name for e in self.entries))
            return self.entries[0]
        for e in self.entries:
            if e.name == name:
                return e
        raise PtxError(f"no entry {name!r}; entries: {', '.join(e.name for e in self.entries)}")

    def instructions(self, entry: str | None = None) -> list[tuple[int, Instruction]]:
        """(line index, instruction) pairs of an entry's body."""
        e = self.entry(entry)
        return [(i, ln) for i, ln in enumerate(self.lines[e.body_start:e.body_end + 1], e.body_start)
                if isinstance(ln, Instruction)]

    def labels(self) -> dict[str, int]:
        return {ln.name: i for i, ln in enumerate(self.lines) if isinstance(ln, Label)}

    def register_declarations(self) -> dict[str, str]:
        """`.reg` declarations: register name or range (`%r<288>`) -> type (`.b32`)."""
        regs: dict[str, str] = {}
        for ln in self.lines:
            if isinstance(ln, Directive) and ln.name == ".reg":
                m = re.match(r"(\.\w+)\s+(.+?);", ln.rest)
                if m:
                    for reg in m.group(2).split(","):
                        regs[reg.strip()] = m.group(1)
        return regs


_ENTRY_HEAD = re.compile(r"^\s*(?P<visible>\.visible\s+)?(?:\.weak\s+)?\.entry\s+(?P<name>[\w$]+)\s*\(?\s*$")
_PARAM = re.compile(r"^\.param\s+(?P<type>\.\w+)(?P<attrs>(?:\s+\.\w+(?:\s+\d+)?)*)\s+(?P<name>[\w$]+)(?:\[\d+\])?\s*,?$")


def parse_ptx(text: str, origin: str | None = None) -> PtxModule:
    """Parse PTX text; raises `PtxError` naming the line when an entry's structure cannot be read."""
    trailing_newline = text.endswith("\n")
    raw_lines = (text[:-1] if trailing_newline else text).split("\n")
    lines: list[PtxLine] = []
    for n, raw in enumerate(raw_lines, 1):
        m = _ENTRY_HEAD.match(raw)
        lines.append(Raw(n, raw) if m else parse_line(raw, n))
    module = PtxModule(lines, trailing_newline)
    i = 0
    while i < len(lines):
        ln = lines[i]
        if isinstance(ln, Directive) and ln.name in (".version", ".target", ".address_size"):
            value = ln.rest.strip()
            if ln.name == ".version":
                module.version = value
            elif ln.name == ".target":
                module.target = value
            else:
                module.address_size = int(value)
        if isinstance(ln, Raw) and (m := _ENTRY_HEAD.match(ln.text)):
            i = _parse_entry(module, i, m["name"], bool(m["visible"]), origin)
            continue
        i += 1
    return module


def _launch_dims(rest: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", rest))


def _parameter_list(lines: list[PtxLine], start: int, name: str, where: str) -> tuple[list[PtxParam], int]:
    """The parameters between the entry's `(` and `)`, read as text whatever the layout (one per line,
    several on a line, a leading or trailing comma), and the index of the line after the `)`."""
    text = re.sub(r"//.*", "", render(lines[start]))
    opened = "(" in text
    chunks = [text[text.index("(") + 1:]] if opened else []
    i = start + 1
    while i < len(lines):
        t = re.sub(r"//.*", "", render(lines[i]))
        if not opened:
            if not t.strip():
                i += 1
                continue
            if not t.lstrip().startswith("("):
                return [], i  # an entry without a parameter list
            opened, t = True, t.lstrip()[1:]
        if ")" in t:
            chunks.append(t[:t.index(")")])
            if t[t.index(")") + 1:].strip():
                raise PtxError(f"{where}{lines[i].lineno}: unexpected text after the parameter list of {name}")
            break
        chunks.append(t)
        i += 1
    else:
        raise PtxError(f"{where}{lines[start].lineno}: the parameter list of entry {name} is not closed")
    body = re.sub(r"/\*.*?\*/", " ", " ".join(chunks), flags=re.S).strip()
    params: list[PtxParam] = []
    if not body:
        return params, i + 1
    for piece in body.split(","):
        m = _PARAM.match(" ".join(piece.split()))
        if not m:
            what = f"`{' '.join(piece.split())}`" if piece.strip() else "an empty parameter (a stray comma)"
            raise PtxError(f"{where}{lines[start].lineno}: cannot read {what} in the parameter list of {name}")
        params.append(PtxParam(m["type"], tuple(m["attrs"].split()), m["name"]))
    return params, i + 1


def _parse_entry(module: PtxModule, start: int, name: str, visible: bool, origin: str | None) -> int:
    lines = module.lines
    where = f"{origin}:" if origin else "line "
    reqntid = maxntid = None
    maxnreg = None
    params, i = _parameter_list(lines, start, name, where)
    while i < len(lines):
        ln = lines[i]
        if isinstance(ln, Directive) and ln.name == ".param":
            raise PtxError(f"{where}{ln.lineno}: parameter `{render(ln).strip()}` of {name} after its parameter list")
        elif isinstance(ln, Directive) and ln.name == ".reqntid":
            reqntid = _launch_dims(ln.rest)
        elif isinstance(ln, Directive) and ln.name == ".maxntid":
            maxntid = _launch_dims(ln.rest)
        elif isinstance(ln, Directive) and ln.name == ".maxnreg":
            maxnreg = _launch_dims(ln.rest)[0]
        elif isinstance(ln, Brace) and ln.brace == "{":
            break
        i += 1
    else:
        raise PtxError(f"{where}{lines[start].lineno}: entry {name} has no body")
    body_start = i
    depth = 0
    while i < len(lines):
        ln = lines[i]
        if isinstance(ln, Brace):
            depth += 1 if ln.brace == "{" else -1
            if depth == 0:
                module.entries.append(PtxEntry(name, visible, params, reqntid, maxntid, maxnreg, body_start, i))
                return i + 1
        i += 1
    raise PtxError(f"{where}{lines[body_start].lineno}: the body of entry {name} is not closed (truncated PTX?)")
