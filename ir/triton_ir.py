"""Parse and print Triton's TTIR and TTGIR text through the xDSL dialects, exactly as Triton prints it.

`parse_triton(text, path)` reads a module into a `TritonModule`: the xDSL `ModuleOp` (typed ops, types,
encodings, locations) plus how the text spelled it — the attribute and location aliases (`#blocked`,
`#loc12`) in their order and place (before or after the module, as MLIR defers location aliases), and
the SSA value names. `print_triton(module)` writes it back: for an unchanged module the output equals
the input byte for byte; `locations=False` drops every `loc(...)` and `#loc` alias. Values created
after parsing get fresh numeric names, new attributes print inline.

Errors in the input raise `IRParseError` with `file:line:col`, the op (when known) and what was expected.
"""

from __future__ import annotations

import bisect
import io
import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from xdsl.dialects.builtin import (
    AnyDenseElement,
    AnyFloat,
    BytesAttr,
    DenseIntOrFPElementsAttr,
    ModuleOp,
    RankedStructure,
)
from xdsl.ir import Attribute, BlockArgument, Operation, OpResult, SSAValue
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError, VerifyException
from xdsl.utils.lexer import Span

from .dialects import defined_op_names, triton_context
from .errors import KstrataError, cut_text
from .files import check_ir_lines


class IRParseError(KstrataError):
    """Triton IR text that does not parse or verify: where (`file:line:col`), which op, what was expected."""

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None,
                 column: int | None = None, op: str | None = None, hint: str | None = None) -> None:
        self.line = line
        self.column = column
        self.op = op
        where = "" if line is None else f"{line}:{column}: "
        super().__init__(f"{where}{message}", path=path, hint=hint)

    def __str__(self) -> str:
        where = (f"{self.path}:" if self.line is not None else f"{self.path}: ") if self.path else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{self.message}{hint}"


@dataclass
class TritonModule:
    """A parsed TTIR/TTGIR module and the spelling needed to print it back exactly."""

    module: ModuleOp
    #: Alias definitions by name (`#blocked`, `#loc3`), in the order the text gave them.
    aliases: dict[str, Attribute] = field(default_factory=dict)
    #: Aliases the text defined after the module (MLIR defers location aliases there).
    trailing_aliases: frozenset[str] = frozenset()
    #: The name each SSA value had in the text (without `%`); results of one multi-result op share it.
    value_names: dict[SSAValue, str] = field(default_factory=dict)
    path: str | None = None
    #: Whether the text carried locations (MLIR prints all of them or none).
    has_locations: bool = True
    #: Where each parsed op starts in the text (line, column), for messages.
    op_positions: dict[Operation, tuple[int, int]] = field(default_factory=dict)

    @property
    def level(self) -> str:
        """`ttgir` when the module carries TritonGPU attributes, else `ttir`."""
        return "ttgir" if "ttg.num-warps" in self.module.attributes else "ttir"

    def ops(self) -> Iterator[Operation]:
        yield from self.module.walk()

    def verify(self) -> None:
        """Run every op's and attribute's verifier; raises `IRParseError` naming the op and its location."""
        for op in self.module.walk():
            try:
                op.verify(verify_nested_ops=False)
            except VerifyException as exc:
                line, col = self.op_positions.get(op, (None, None))
                raise IRParseError(f"`{op.name}` does not verify: {cut_text(str(exc))}", path=self.path, op=op.name,
                                   line=line, column=col) from None

    def __str__(self) -> str:
        return print_triton(self)


# ---------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------
_ALIAS_DEF = re.compile(r"^([#!][A-Za-z_][\w$.-]*) = ", re.M)


class _TritonParser(Parser):
    """xDSL's parser, remembering the name each SSA value was given, reading hex float splats as bits."""

    value_names: dict[SSAValue, str]
    op_offsets: dict[Operation, int]
    _literal: list[AttrParser._TensorLiteralElement] | None = None

    def parse_operation(self) -> Operation:
        start = self._current_token.span.start
        op = super().parse_operation()
        self.op_offsets[op] = start
        return op

    def _parse_tensor_literal(self) -> tuple[list[AttrParser._TensorLiteralElement], list[int]]:
        elements, shape = super()._parse_tensor_literal()
        self._literal = elements
        return elements, shape

    def parse_dense_int_or_fp_elements_attr(self, type: RankedStructure[AnyDenseElement] | None
                                            ) -> DenseIntOrFPElementsAttr:
        self._literal = None
        attr = super().parse_dense_int_or_fp_elements_attr(type)
        elements, self._literal = self._literal, None
        elt = attr.get_element_type()
        # MLIR reads `dense<0xFF800000> : tensor<..xf32>` as the float with those bits; xDSL as an integer.
        if elements and isinstance(elt, AnyFloat) and any(e.span.text.lower().startswith("0x") for e in elements):
            values = [next(iter(elt.iter_unpack(int(e.value).to_bytes(elt.compile_time_size, "little"))))
                      if e.span.text.lower().startswith("0x") else e.to_float(self)
                      for e in elements]
            count = len(attr)
            if len(values) == 1:
                values = values * count
            attr = DenseIntOrFPElementsAttr(attr.type, BytesAttr(elt.pack(values)))
        return attr

    def _register_ssa_definition(self, name: str, values: Sequence[SSAValue], span: Span) -> None:
        super()._register_ssa_definition(name, values, span)
        for v in values:
            self.value_names[v] = name


def _positions(text: str, offsets: dict[Operation, int]) -> dict[Operation, tuple[int, int]]:
    """(line, column) of many offsets at once: one pass over the text, a bisection per offset."""
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    out: dict[Operation, tuple[int, int]] = {}
    for op, off in offsets.items():
        line = bisect.bisect_right(starts, off)
        out[op] = (line, off - starts[line - 1] + 1)
    return out


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _op_at(text: str, offset: int) -> str | None:
    """The op name on the line of `offset`, for error messages."""
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    m = re.search(r'(?:^|=\s*|\s)"?([a-z_][a-z0-9_]*\.[a-z0-9_.]+)"?', text[start:end if end >= 0 else None])
    return m.group(1) if m else None


#: A string literal as MLIR (and xDSL's lexer) accepts it, written without nested repetition: xDSL's own
#: pattern, `"(?:[^"\\\n\v\f]+|\\(?:...))*"`, backtracks exponentially on a literal that does not close
#: (28 characters take minutes), so every literal is checked with this one first.
_STRING_LITERAL = re.compile(r'"(?:[^"\\\n\v\f]|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*"')
_QUOTE_OR_COMMENT = re.compile(r'"|//')


def _check_string_literals(text: str, path: str | None) -> None:
    """Raise at the first string literal that does not close on its line (or holds an invalid escape)."""
    pos = 0
    while True:
        m = _QUOTE_OR_COMMENT.search(text, pos)
        if m is None:
            return
        if m.group() == "//":  # a comment runs to the end of its line
            nl = text.find("\n", m.end())
            if nl < 0:
                return
            pos = nl + 1
            continue
        lit = _STRING_LITERAL.match(text, m.start())
        if lit is None:
            line, col = _position(text, m.start())
            raise IRParseError("string literal without its closing quote on the same line (or with an invalid "
                               "escape)", path=path, line=line, column=col)
        pos = lit.end()


def _parse_error(exc: ParseError, text: str, path: str | None) -> IRParseError:
    span = exc.span
    offset = span.start
    msg = str(getattr(exc, "msg", "") or exc).strip()
    msg = cut_text(msg.splitlines()[-1].strip()) if msg else "syntax error"
    op = _op_at(text, offset)
    unknown = re.search(r"Operation (\S+) is not registered", msg)
    if unknown:
        op = unknown.group(1)
        line_start = text.rfind("\n", 0, offset) + 1
        found = text.find(op, line_start)
        offset = found if 0 <= found <= offset else offset
        dialect = op.split(".")[0]
        known = [n for n in defined_op_names() if n.startswith(dialect + ".")]
        msg = (f"unknown op `{op}`: expected one of the {len(known)} `{dialect}` ops kstrata defines"
               if known else f"unknown op `{op}`: kstrata defines no `{dialect}` dialect")
        line, col = _position(text, offset)
        return IRParseError(msg, path=path, line=line, column=col, op=op)
    line, col = _position(text, offset)
    where_op = f" (in `{op}`)" if op else ""
    return IRParseError(f"{msg}{where_op}", path=path, line=line, column=col, op=op)


def parse_triton(text: str, path: str | Path | None = None, *, verify: bool = True) -> TritonModule:
    """Parse TTIR or TTGIR text; raises `IRParseError` (file:line:col, op, what was expected)."""
    name = str(path) if path is not None else "<text>"
    if not text.strip():
        raise IRParseError("empty file: no module", path=name)
    check_ir_lines(text, name, error=IRParseError)
    _check_string_literals(text, name)
    try:
        return _parse_checked(text, path, name, verify)
    except RecursionError:
        raise IRParseError("nested too deeply to parse (types, attributes or regions)", path=name) from None


def _parse_checked(text: str, path: str | Path | None, name: str, verify: bool) -> TritonModule:
    ctx = triton_context()
    # Alias definitions are lines `#name = ...` at the top level, before or after the module; MLIR lets
    # op locations refer to aliases defined after the module, so they are all read first.
    defs = [(m.group(1), m.start(), m.end()) for m in _ALIAS_DEF.finditer(text)]
    module_at = re.search(r"^module\b", text, re.M)
    module_start = module_at.start() if module_at else len(text)
    blanked = list(text)
    pending: list[tuple[str, int, int]] = []
    for alias, start, value_start in defs:
        end = text.find("\n", value_start)
        end = len(text) if end < 0 else end
        pending.append((alias, start, value_start))
        for i in range(start, end):
            blanked[i] = " "
    try:
        parser = _TritonParser(ctx, text, name)  # it reads the first token already
    except ParseError as exc:
        raise _parse_error(exc, text, name) from None
    parser.value_names = {}
    parser.op_offsets = {}
    aliases: dict[str, Attribute] = {}
    while pending:
        progressed = False
        still: list[tuple[str, int, int]] = []
        last_error: ParseError | None = None
        for alias, start, value_start in pending:
            parser._resume_from(value_start)
            try:
                value = parser.parse_attribute() if alias.startswith("#") else parser.parse_type()
            except ParseError as exc:
                if "undefined symbol alias" not in str(exc):
                    raise _parse_error(exc, text, name) from None
                still.append((alias, start, value_start))
                last_error = exc
                continue
            parser.attribute_aliases[alias] = value
            progressed = True
        if not progressed:
            assert last_error is not None
            raise _parse_error(last_error, text, name) from None
        pending = still
    for alias, _start, _vs in defs:
        aliases[alias] = parser.attribute_aliases[alias]
    trailing = frozenset(alias for alias, start, _ in defs if start > module_start)
    try:
        body = _TritonParser(ctx, "".join(blanked), name)
    except ParseError as exc:
        raise _parse_error(exc, text, name) from None
    body.value_names = parser.value_names
    body.op_offsets = {}
    body.attribute_aliases = dict(parser.attribute_aliases)
    try:
        module = body.parse_module()
    except ParseError as exc:
        raise _parse_error(exc, text, name) from None
    except VerifyException as exc:  # raised while an op is built from its assembly format
        line, col = _position(text, body.pos)
        op = _op_at(text, body.pos)
        raise IRParseError(cut_text(f"{exc}") + (f" in `{op}`" if op else ""), path=name, line=line, column=col,
                           op=op) from None
    result = TritonModule(module=module, aliases=aliases, trailing_aliases=trailing,
                          value_names=body.value_names, path=None if path is None else str(path),
                          op_positions=_positions(text, body.op_offsets),
                          has_locations=re.search(r"\bloc\(", text) is not None)
    if verify:
        result.verify()
    return result


def parse_file(path: str | Path, *, verify: bool = True) -> TritonModule:
    """Parse a `.ttir`/`.ttgir` file."""
    from .files import read_text, user_path

    p = user_path(path)
    return parse_triton(read_text(p, "IR file", error=IRParseError), p, verify=verify)


# ---------------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------------
class TritonPrinter(Printer):
    """xDSL's printer, writing MLIR's spelling of aliases, value names and locations."""

    def __init__(self, stream: io.StringIO, module: TritonModule, locations: bool) -> None:
        super().__init__(stream=stream)
        self._module = module
        self._locations = locations
        self._alias_of: dict[Attribute, str] = {}
        for alias, attr in module.aliases.items():
            if locations or not _is_location(attr):
                self._alias_of.setdefault(attr, alias)
        self._defining: Attribute | None = None
        self._taken = set(module.value_names.values())
        self._fresh = 0

    # -- aliases ---------------------------------------------------------------------------------
    @contextmanager
    def defining(self, attr: Attribute) -> Iterator[None]:
        self._defining = attr
        yield
        self._defining = None

    def print_attribute(self, attribute: Attribute) -> None:
        if self._defining is not None and attribute is self._defining:
            self._defining = None
            super().print_attribute(attribute)
            return
        try:
            alias = self._alias_of.get(attribute)
        except TypeError:  # an unhashable attribute is never aliased
            alias = None
        if alias is not None:
            self.print_string(alias)
            return
        super().print_attribute(attribute)

    # -- names -----------------------------------------------------------------------------------
    def _name_of(self, value: SSAValue) -> str:
        name = self._module.value_names.get(value)
        if name is None:
            name = self._ssa_values.get(value)
            if name is None:
                while str(self._fresh) in self._taken:
                    self._fresh += 1
                name = str(self._fresh)
                self._taken.add(name)
                self._ssa_values[value] = name
        return name

    def print_ssa_value(self, value: SSAValue) -> str:
        name = self._name_of(value)
        if isinstance(value, OpResult) and len(value.op.results) > 1 and \
                all(self._module.value_names.get(r) == name for r in value.op.results):
            text = f"{name}#{value.index}"
            self.print_string(f"%{text}")
            return text
        self.print_string(f"%{name}")
        return name

    def _print_results(self, op: Operation) -> None:
        if not op.results:
            return
        names = [self._name_of(r) for r in op.results]
        if len(names) > 1 and len(set(names)) == 1:
            self.print_string(f"%{names[0]}:{len(names)} = ")
            return
        self.print_string(", ".join(f"%{n}" for n in names) + " = ")

    # -- locations -------------------------------------------------------------------------------
    def print_location(self, loc: Attribute, *, inline: bool) -> None:
        if not self._locations:
            return
        self.print_string(" ")
        alias = None if inline else self._alias_of.get(loc)
        if alias is not None:
            self.print_string(f"loc({alias})")
        else:
            super().print_attribute(loc)

    def print_block_argument(self, arg: BlockArgument, print_type: bool = True) -> None:
        self.print_ssa_value(arg)
        if print_type:
            self.print_string(": ")
            self.print_attribute(arg.type)
            self.print_arg_location(arg)

    def print_arg_location(self, arg: BlockArgument) -> None:
        """Block arguments carry their location inline (MLIR does not alias them), `loc(unknown)` included."""
        self.print_location(arg.location, inline=True)

    # -- numbers ---------------------------------------------------------------------------------
    def print_float(self, value: float, type: AnyFloat) -> None:
        self.print_string(format_float(value, type))

    def print_op(self, op: Operation) -> None:
        if isinstance(op, ModuleOp):  # MLIR spells the builtin module `module`
            self.print_string("module")
            if op.sym_name is not None:
                self.print_string(" ")
                self.print_symbol_name(op.sym_name.data)
            self.print_op_attributes(op.attributes, print_keyword=True)
            self.print_string(" ")
            self.print_region(op.body, print_entry_block_args=False, print_empty_block=False)
        else:
            super().print_op(op)
        self.print_location(op.location, inline=False)


def apfloat_to_string(value: float, precision_bits: int, format_precision: int = 0, max_padding: int = 3,
                      truncate_zero: bool = True) -> str:
    """LLVM's `APFloat::toString` for a finite value of a float type with `precision_bits` significand bits.

    Followed step by step (LLVM 19-22): exact binary-to-decimal expansion, a first cut of whole powers of ten
    by bit count, then round-half-up on the last kept digit; MLIR's printer calls it twice (see `format_float`).
    """
    if format_precision == 0:
        format_precision = 2 + precision_bits * 59 // 196
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        if truncate_zero:
            return f"{sign}0.0E+0" if not max_padding else f"{sign}0.0"
        return f"{sign}0.{'0' * format_precision}e+00"
    mantissa, exponent = math.frexp(abs(value))
    sig, exp = int(mantissa * (1 << 64)), exponent - 64  # exact: a double has 53 significand bits
    trailing = (sig & -sig).bit_length() - 1
    sig, exp = sig >> trailing, exp + trailing
    if exp > 0:
        sig, exp = sig << exp, 0
    elif exp < 0:
        sig, exp = sig * 5 ** -exp, exp  # sig * 2^exp == sig * 5^-exp * 10^exp
    bits_required = (format_precision * 196 + 58) // 59
    bits = sig.bit_length()
    if bits > bits_required:
        tens = (bits - bits_required) * 59 // 196
        if tens:
            sig //= 10 ** tens
            exp += tens
    buffer: list[str] = []  # least significant digit first
    for ch in reversed(str(sig)):
        if not buffer and ch == "0":
            exp += 1
        else:
            buffer.append(ch)
    n = len(buffer)
    if n > format_precision:  # round half up on the digit below the cut
        first = n - format_precision
        if buffer[first - 1] < "5":
            while first < n and buffer[first] == "0":
                first += 1
            exp += first
            buffer = buffer[first:]
        else:
            i = first
            while i < n and buffer[i] == "9":
                i += 1
            if i == n:
                exp += n
                buffer = ["1"]
            else:
                buffer[i] = str(int(buffer[i]) + 1)
                exp += i
                buffer = buffer[i:]
    n = len(buffer)
    digits = "".join(reversed(buffer))
    if not max_padding:
        scientific = True
    elif exp >= 0:
        scientific = exp > max_padding or n + exp > format_precision
    else:
        msd = exp + n - 1
        scientific = msd < 0 and -msd > max_padding
    if scientific:
        exp += n - 1
        out = digits[0] + "." + ("0" if n == 1 and truncate_zero else digits[1:])
        if not truncate_zero and format_precision > n - 1:
            out += "0" * (format_precision - n + 1)
        exp_digits = str(abs(exp))
        if not truncate_zero and len(exp_digits) < 2:
            exp_digits = "0" + exp_digits
        return f"{sign}{out}{'E' if truncate_zero else 'e'}{'+' if exp >= 0 else '-'}{exp_digits}"
    if exp >= 0:
        return sign + digits + "0" * exp
    whole = exp + n
    if whole > 0:
        return f"{sign}{digits[:whole]}.{digits[whole:]}"
    return f"{sign}0.{'0' * -whole}{digits}"


def format_float(value: float, type: AnyFloat) -> str:
    """A float as MLIR prints it: `%.6e`-style when that reads back exactly, else LLVM's natural form,
    else the bit pattern in hex (infinities, NaNs, and values whose natural form has no `.`)."""
    if math.isfinite(value):
        bits = _PRECISION_BITS.get(type.name, 53)
        short = apfloat_to_string(value, bits, 6, 0, False)
        if type.unpack(type.pack([float(short)]), 1)[0] == value:
            return short
        text = apfloat_to_string(value, bits)
        if "." in text:
            return text
    raw = type.pack([value])
    return "0x" + f"{int.from_bytes(raw, 'little'):X}"


#: Significand bits (with the implicit bit) of MLIR's float types, as LLVM's semantics give them.
_PRECISION_BITS = {"f16": 11, "bf16": 8, "f32": 24, "f64": 53, "tf32": 11}


def _is_location(attr: Attribute) -> bool:
    return type(attr).__name__ in {"UnknownLoc", "FileLineColLoc", "CallSiteLoc", "FusedLoc", "NameLoc"}


def print_triton(module: TritonModule, *, locations: bool = True) -> str:
    """Triton's textual form of `module`; `locations=False` leaves out every `loc(...)` and `#loc` alias."""
    out = io.StringIO()
    printer = TritonPrinter(out, module, locations and module.has_locations)

    def print_alias(alias: str, attr: Attribute) -> None:
        out.write(f"{alias} = ")
        with printer.defining(attr):
            printer.print_attribute(attr)
        out.write("\n")

    wanted = [(a, v) for a, v in module.aliases.items() if locations or not _is_location(v)]
    for alias, attr in wanted:
        if alias not in module.trailing_aliases:
            print_alias(alias, attr)
    printer.print_op(module.module)
    out.write("\n")
    for alias, attr in wanted:
        if alias in module.trailing_aliases:
            print_alias(alias, attr)
    return out.getvalue()
