"""Triton's struct-like attribute syntax, `#ttg.blocked<{sizePerThread = [1, 1], order = [0]}>`, declared once.

Triton prints most of its layout encodings as a dictionary of named fields in a fixed order, leaving
out fields that hold their default. `StructAttr` subclasses declare their fields (`FIELDS`: the key as
Triton spells it and its kind); parsing checks each key against that declaration, and printing writes
the present fields back in declaration order, so a parsed encoding prints as Triton printed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from xdsl.dialects.builtin import ArrayAttr, IntAttr, NoneAttr, StringAttr
from xdsl.ir import Attribute, ParametrizedAttribute
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

FieldKind = Literal["int", "ints", "intss", "bool", "attr", "str"]


@dataclass(frozen=True)
class Field:
    """One field of a struct attribute: Triton's key, what it holds, whether it may be left out."""

    key: str
    kind: FieldKind
    optional: bool = False


def ints(values: Sequence[int]) -> ArrayAttr[IntAttr]:
    return ArrayAttr(IntAttr(v) for v in values)


def int_list(attr: Attribute) -> tuple[int, ...]:
    """The integers of an `ints` field (empty when absent)."""
    if isinstance(attr, ArrayAttr):
        return tuple(a.data for a in attr.data if isinstance(a, IntAttr))
    return ()


def _parse_ints(parser: AttrParser) -> ArrayAttr[IntAttr]:
    values = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, lambda: parser.parse_integer(allow_boolean=False))
    return ints(values)


def _parse_value(parser: AttrParser, field: Field) -> Attribute:
    match field.kind:
        case "int":
            return IntAttr(parser.parse_integer(allow_boolean=False))
        case "bool":
            return IntAttr(int(parser.parse_boolean(f"for `{field.key}`")))
        case "ints":
            return _parse_ints(parser)
        case "intss":
            return ArrayAttr(parser.parse_comma_separated_list(parser.Delimiter.SQUARE, lambda: _parse_ints(parser)))
        case "str":
            return StringAttr(parser.parse_str_literal(f"for `{field.key}`"))
        case "attr":
            return parser.parse_attribute()


def _print_value(printer: Printer, field: Field, value: Attribute) -> None:
    match field.kind:
        case "int":
            assert isinstance(value, IntAttr)
            printer.print_string(str(value.data))
        case "bool":
            assert isinstance(value, IntAttr)
            printer.print_string("true" if value.data else "false")
        case "ints":
            printer.print_string("[" + ", ".join(str(v) for v in int_list(value)) + "]")
        case "intss":
            assert isinstance(value, ArrayAttr)
            printer.print_string("[" + ", ".join("[" + ", ".join(str(v) for v in int_list(row)) + "]"
                                                 for row in value.data) + "]")
        case "str":
            printer.print_attribute(value)
        case "attr":
            printer.print_attribute(value)


_KIND_CHECK: dict[FieldKind, type[Attribute]] = {
    "int": IntAttr, "bool": IntAttr, "ints": ArrayAttr, "intss": ArrayAttr, "str": StringAttr, "attr": Attribute,
}


class StructAttr(ParametrizedAttribute):
    """Base of attributes printed `<{key = value, ...}>`; one parameter per field, `NoneAttr` when absent."""

    FIELDS: ClassVar[tuple[Field, ...]] = ()

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        by_key = {f.key: i for i, f in enumerate(cls.FIELDS)}
        values: list[Attribute] = [NoneAttr() for _ in cls.FIELDS]
        parser.parse_punctuation("<")
        parser.parse_punctuation("{")
        first = True
        while first or parser.parse_optional_punctuation(",") is not None:
            first = False
            pos = parser.pos
            key = parser.parse_optional_identifier()
            if key is None or key not in by_key:
                parser.raise_error(f"#{cls.name}: expected one of the fields " + ", ".join(f.key for f in cls.FIELDS),
                                   pos, parser.pos if key is not None else pos)
            parser.parse_punctuation("=")
            values[by_key[key]] = _parse_value(parser, cls.FIELDS[by_key[key]])
        parser.parse_punctuation("}")
        parser.parse_punctuation(">")
        for f, v in zip(cls.FIELDS, values, strict=True):
            if not f.optional and isinstance(v, NoneAttr):
                parser.raise_error(f"#{cls.name}: missing field `{f.key}`")
        return values

    def print_parameters(self, printer: Printer) -> None:
        parts = [(f, v) for f, v in zip(self.FIELDS, self.parameters, strict=True) if not isinstance(v, NoneAttr)]
        printer.print_string("<{")
        for i, (f, v) in enumerate(parts):
            if i:
                printer.print_string(", ")
            printer.print_string(f"{f.key} = ")
            _print_value(printer, f, v)
        printer.print_string("}>")

    def field(self, key: str) -> Attribute:
        """The value of the field Triton calls `key` (`NoneAttr` when absent)."""
        for f, v in zip(self.FIELDS, self.parameters, strict=True):
            if f.key == key:
                return v
        raise KeyError(key)

    def verify(self) -> None:
        if len(self.parameters) != len(self.FIELDS):
            raise VerifyException(f"#{self.name}: {len(self.parameters)} parameters for {len(self.FIELDS)} fields")
        for f, v in zip(self.FIELDS, self.parameters, strict=True):
            if isinstance(v, NoneAttr):
                if not f.optional:
                    raise VerifyException(f"#{self.name}: field `{f.key}` is required")
            elif not isinstance(v, _KIND_CHECK[f.kind]):
                raise VerifyException(f"#{self.name}: field `{f.key}` must be {f.kind}, got {v}")
