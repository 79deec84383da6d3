"""The pass contract: a level, options, a precondition, `apply`, and a schedule space.

A pass is a frozen dataclass whose fields are its options, so the object is its own command-line
spelling (`ld-nc{assume_noalias=true}`). Options are checked when the pass is constructed, against
their type hints: `bool`, `int`, `float`, `str`, `X | None`, and `Literal[...]` for options with a fixed
set of values (an unknown value is an error listing the valid ones); a numeric option may declare a
range with `option(default, range=(lo, hi))`, a text option a grammar with `option(default,
pattern=OptionPattern(...))` (the `scope=lines:A-B` windows of `passes/window.py`). A pass declares the
level it rewrites, the backends it applies to, and — when its result is not bit-exact — the tolerance it
needs. `precondition` returns `None` when the pass is sound on this kernel, or the reason it is not;
then the pass changes nothing. `apply` returns the new text of its level (and, for passes that change how lower levels are built,
metadata updates such as `num_warps` or `ptx_options`). `schedule_space(bundle)` says which option
values are worth trying on one kernel, for a search to enumerate; given the kernel's hot window from a
profile (`schedule_space(bundle, window=...)`), a pass with a window option offers it (`windowed_values`).

TTIR/TTGIR passes that rewrite ops derive from `RewritePass`: they give xDSL `RewritePattern`s, which
a `PatternRewriteWalker` applies to the level's module, parsed once per level group
(`PassContext.module`) and shared by the passes of that group.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, Union

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError
from kstrata.ir.tolerance import Tolerance

if TYPE_CHECKING:
    from xdsl.pattern_rewriter import RewritePattern

    from kstrata.ir.triton_ir import TritonModule

PASS_LEVELS = ("ttir", "ttgir", "llir", "ptx", "amdgcn")


class PassError(KstrataError):
    """A pass or pipeline that cannot be built or run."""


@dataclass
class PassContext:
    """What a pass sees: the kernel as it is now (all levels), and the text of the pass's level.

    For TTIR and TTGIR, `module` is that text parsed once; the passes of one level group share it
    (the pipeline hands it from pass to pass while the text stays the module's), so a group of
    rewrites parses its level once, not once per pass.
    """

    bundle: KernelBundle
    level: str
    parsed: TritonModule | None = field(default=None, repr=False)

    @property
    def text(self) -> str:
        return self.bundle.text(self.level)

    @property
    def module(self) -> TritonModule:
        """The level's text as a typed xDSL module (TTIR/TTGIR), parsed on first use."""
        if self.parsed is None:
            from kstrata.ir.triton_ir import parse_triton

            if self.level not in ("ttir", "ttgir"):
                raise PassError(f"level {self.level} is not MLIR: no module to rewrite")
            self.parsed = parse_triton(self.text, self.bundle.origin)
        return self.parsed


@dataclass
class PassResult:
    """The outcome of one pass on one kernel."""

    text: str
    #: Metadata the lower levels must be built with (e.g. `num_warps`, `ptx_options`).
    metadata_updates: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The rewritten module whose printing `text` is (TTIR/TTGIR rewrites), handed to the next pass.
    module: TritonModule | None = field(default=None, repr=False)


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    text = str(value)
    if isinstance(value, str) and (not text or re.search(r'[\s{}(),"=]', text)):
        return json.dumps(text)
    return text


# ---------------------------------------------------------------------------------------------------
# Options: declared by type hints, checked at construction
# ---------------------------------------------------------------------------------------------------
class ScopeWindow(Protocol):
    """Lines of a level's text that a pass with a window option can be confined to (`passes/window.py`'s
    `LineWindow`); `spelling()` is the option value that names them (`lines:A-B@DIGEST`)."""

    def spelling(self) -> str: ...


@dataclass(frozen=True)
class OptionPattern:
    """The grammar of a `str` option: a regular expression the whole value must match, the valid
    spellings in words (for messages), an optional check of what the expression cannot say (returns why
    a matching value is still invalid), and a valid value other than the usual ones (for tests and docs)."""

    regex: str
    words: str
    check: Callable[[str], str | None] | None = None
    example: str = ""

    def refusal(self, value: str) -> str | None:
        if not re.fullmatch(self.regex, value):
            return f"expected {self.words}"
        return self.check(value) if self.check is not None else None


def option(default: Any, *, range: tuple[float, float] | None = None, pattern: OptionPattern | None = None,
           doc: str = "") -> Any:
    """A pass option with a default, for numbers the closed range of valid values, for text its grammar."""
    return field(default=default, metadata={"range": range, "pattern": pattern, "doc": doc})


@dataclass(frozen=True)
class OptionSpec:
    """One option of a pass: its name, type, default, and (when finite) its choices."""

    name: str
    hint: Any
    default: Any
    choices: tuple[Any, ...] | None
    range: tuple[float, float] | None
    optional: bool
    doc: str = ""
    pattern: OptionPattern | None = None

    @property
    def base(self) -> type | None:
        """`bool`, `int`, `float` or `str` (the type of a Literal's values), or None for other types."""
        if self.choices is not None:
            kinds = {type(c) for c in self.choices}
            return kinds.pop() if len(kinds) == 1 else None
        return self.hint if self.hint in (bool, int, float, str) else None

    def describe(self) -> str:
        """`int`, `int in 16..255`, `one of evict_first, evict_last`, with `or none` when optional."""
        if self.choices is not None:
            kind = "one of " + ", ".join(_format_value(c) for c in self.choices)
        elif self.pattern is not None:
            kind = f"str: {self.pattern.words}"
        else:
            kind = getattr(self.hint, "__name__", str(self.hint))
            if self.range is not None:
                lo, hi = self.range
                kind += f" in {_format_value(lo)}..{_format_value(hi)}"
        return kind + (" or none" if self.optional else "")

    def domain(self) -> tuple[Any, ...] | None:
        """Every valid value when there are finitely many (Literal choices, bool), else None."""
        if self.choices is not None:
            return self.choices + ((None,) if self.optional else ())
        if self.hint is bool:
            return (False, True)
        return None

    def check(self, pass_name: str, value: Any) -> Any:
        """`value` when valid (an int widened to float for a float option), else a `PassError`."""
        if value is None and self.optional:
            return None
        base = self.base
        ok = False
        if self.choices is not None:
            ok = any(value == c and type(value) is type(c) for c in self.choices)
        elif base is bool:
            ok = isinstance(value, bool)
        elif base is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif base is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif base is str:
            ok = isinstance(value, str)
        else:
            raise PassError(f"pass {pass_name}: option {self.name} has a type kstrata cannot check ({self.hint}); "
                            "use bool, int, float, str, X | None or Literal[...]")
        if ok and self.range is not None and not self.range[0] <= value <= self.range[1]:
            ok = False
        if ok and self.pattern is not None:
            why = self.pattern.refusal(value)
            if why is not None:
                raise PassError(f"pass {pass_name}: option {self.name}={_format_value(value)} is not valid: {why}")
        if not ok:
            raise PassError(f"pass {pass_name}: option {self.name}={_format_value(value)} is not valid: "
                            f"expected {self.describe()}")
        return value

    def convert(self, pass_name: str, raw: str) -> Any:
        """The value a pipeline string `raw` names, checked."""
        if self.optional and raw.lower() == "none":
            return None
        if self.choices is not None:
            for c in self.choices:
                if _format_value(c) == raw or str(c) == raw:
                    return c
            return self.check(pass_name, raw)  # raises, listing the choices
        base = self.base
        try:
            if base is bool:
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                value: Any = raw.lower() in ("true", "1")
            elif base is int:
                value = int(raw, 0)
            elif base is float:
                value = float(raw)
            else:
                value = raw
        except ValueError:
            raise PassError(f"pass {pass_name}: option {self.name}={raw!r} is not a valid {self.describe()}") from None
        return self.check(pass_name, value)


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


_SPECS: dict[type, tuple[OptionSpec, ...]] = {}


def option_specs(cls: type[KernelPass]) -> tuple[OptionSpec, ...]:
    """The options of a pass class, from its fields' type hints (resolved once per class)."""
    cached = _SPECS.get(cls)
    if cached is not None:
        return cached
    try:
        hints = typing.get_type_hints(cls)
    except Exception as exc:
        raise PassError(f"pass {getattr(cls, 'name', cls.__name__)}: cannot resolve its option types: {exc}") from None
    specs = []
    for f in dataclasses.fields(cls):
        hint, optional = _unwrap_optional(hints[f.name])
        choices = tuple(typing.get_args(hint)) if typing.get_origin(hint) is Literal else None
        default = f.default if f.default is not dataclasses.MISSING else None
        specs.append(OptionSpec(f.name, hint, default, choices, f.metadata.get("range"), optional,
                                f.metadata.get("doc", ""), f.metadata.get("pattern")))
    _SPECS[cls] = tuple(specs)
    return _SPECS[cls]


# ---------------------------------------------------------------------------------------------------
# Schedule spaces
# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScheduleSpace:
    """The instances of a pass worth trying on one kernel; when empty, `reason` says why."""

    candidates: tuple[KernelPass, ...]
    reason: str | None = None

    def __iter__(self) -> Iterator[KernelPass]:
        return iter(self.candidates)

    def __len__(self) -> int:
        return len(self.candidates)

    def __bool__(self) -> bool:
        return bool(self.candidates)

    def spellings(self) -> list[str]:
        return [p.spelling() for p in self.candidates]


#: At most this many option combinations are tried by the default schedule space.
_MAX_COMBINATIONS = 64


@dataclass(frozen=True)
class KernelPass:
    """Base of every pass. Subclasses are frozen dataclasses; their fields are the options."""

    name: ClassVar[str]
    level: ClassVar[str]
    #: Other levels the pass also rewrites (a TTIR rewrite of scalar ops works on TTGIR unchanged).
    also_at: ClassVar[tuple[str, ...]] = ()
    backends: ClassVar[tuple[str, ...]] = ("cuda", "hip")
    #: `None` when the pass keeps results bit-exact; otherwise the tolerance it needs (ULPs or
    #: relative/absolute error, and why). Passes whose tolerance depends on their options override
    #: `declared_tolerance`.
    tolerance: ClassVar[Tolerance | None] = None

    def __post_init__(self) -> None:
        for spec in option_specs(type(self)):
            value = spec.check(self.name, getattr(self, spec.name))
            object.__setattr__(self, spec.name, value)

    def declared_tolerance(self) -> Tolerance | None:
        """The tolerance this pass, with these options, declares (None: bit-exact)."""
        return self.tolerance

    def precondition(self, ctx: PassContext) -> str | None:
        """`None` when the pass is sound on `ctx`'s kernel, or why it is not (then nothing changes)."""
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        raise NotImplementedError

    # -- search ---------------------------------------------------------------------------------
    @classmethod
    def space_values(cls, bundle: KernelBundle) -> dict[str, Sequence[Any]] | None:
        """The values worth trying per option on `bundle` (options not named keep their default).

        The default tries every value of the finite options (Literal choices, bools), at most 64
        combinations; passes with numeric or free-text options, or many choices, narrow it here.
        """
        return {s.name: d for s in option_specs(cls) if (d := s.domain()) is not None}

    @classmethod
    def windowed_values(cls, values: dict[str, Sequence[Any]], window: ScopeWindow) -> dict[str, Sequence[Any]]:
        """`space_values` when the hot window of the kernel's text at the pass's level is known from a
        profile (`window`: its lines, anchored). Passes without a window option (`passes/window.py`)
        keep their values."""
        return values

    @classmethod
    def schedule_space(cls, bundle: KernelBundle, window: ScopeWindow | None = None) -> ScheduleSpace:
        """The instances of this pass worth trying on `bundle`: every combination of `space_values`
        (`windowed_values` with a profiled `window` of the pass's level) whose precondition holds on it.
        Empty, with the reason, when the pass cannot apply."""
        if bundle.target.backend not in cls.backends:
            return ScheduleSpace((), f"{cls.name} applies to {', '.join(cls.backends)} only, not {bundle.target}")
        if cls.level not in bundle.target.levels:
            return ScheduleSpace((), f"{bundle.target} has no {cls.level} level")
        if cls.level not in bundle.levels and not cls.relowers():
            return ScheduleSpace((), f"the kernel's {cls.level} is not known")
        values = cls.space_values(bundle)
        if values is not None and window is not None:
            values = cls.windowed_values(values, window)
        if values is None or any(len(v) == 0 for v in values.values()):
            return ScheduleSpace((), f"{cls.name} has no option values worth trying on this kernel")
        names = list(values)
        combos = list(itertools.islice(itertools.product(*(values[n] for n in names)), _MAX_COMBINATIONS))
        ctx = PassContext(bundle, cls.level)
        found: list[KernelPass] = []
        reasons: list[str] = []
        for combo in combos:
            try:
                instance = cls(**dict(zip(names, combo, strict=True)))
                why = instance.precondition(ctx)
            except KstrataError as exc:
                why = exc.message
            if why is None:
                if instance not in found:
                    found.append(instance)
            elif why not in reasons:
                reasons.append(why)
        if found:
            return ScheduleSpace(tuple(found))
        return ScheduleSpace((), "; ".join(reasons[:3]) or f"{cls.name} does not apply")

    @classmethod
    def relowers(cls) -> bool:
        """Whether the pass makes its level anew from the level above (num-warps, num-stages)."""
        return False

    # -- spelling -------------------------------------------------------------------------------
    def spelling(self) -> str:
        """`name{opt=value …}` with every option's value, defaults included: a reader of a pipeline
        must not need to know the defaults (and a default that changes must not change the meaning)."""
        parts = [f"{s.name}={_format_value(getattr(self, s.name))}" for s in option_specs(type(self))]
        return self.name + ("{" + " ".join(parts) + "}" if parts else "")

    @classmethod
    def from_options(cls, options: dict[str, str]) -> KernelPass:
        """Build the pass from `name{k=v}` option strings, converting each to its option's type."""
        specs = {s.name: s for s in option_specs(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in options.items():
            if key not in specs:
                known = ", ".join(f"{s.name} ({s.describe()})" for s in specs.values()) or "none"
                raise PassError(f"pass {cls.name} has no option {key!r} (options: {known})")
            kwargs[key] = specs[key].convert(cls.name, raw)
        return cls(**kwargs)

    @classmethod
    def describe(cls) -> dict[str, Any]:
        doc = (cls.__doc__ or "").strip()
        return {
            "name": cls.name, "level": cls.level, "also_at": list(cls.also_at), "backends": list(cls.backends),
            "tolerance": cls.tolerance.spelling() if cls.tolerance else None,
            "tolerance_why": cls.tolerance.why if cls.tolerance else None,
            "options": {s.name: {"type": s.describe(), "default": s.default,
                                 "choices": list(s.choices) if s.choices is not None else None,
                                 "range": list(s.range) if s.range is not None else None}
                        for s in option_specs(cls)},
            "summary": doc.splitlines()[0] if doc else "", "doc": doc,
        }


@dataclass(frozen=True)
class RewritePass(KernelPass):
    """A TTIR/TTGIR pass made of xDSL rewrite patterns, applied in place to the level's module.

    Subclasses give `patterns(ctx, rewrites)`; a pattern records what it changed in `rewrites`, which
    becomes the pass's notes. The walker applies each pattern once per op (not to ops it created).
    """

    def patterns(self, ctx: PassContext, rewrites: Rewrites) -> Sequence[RewritePattern]:
        raise NotImplementedError

    def apply(self, ctx: PassContext) -> PassResult:
        from xdsl.pattern_rewriter import GreedyRewritePatternApplier, PatternRewriteWalker

        from kstrata.ir.triton_ir import print_triton

        module = ctx.module
        rewrites = Rewrites()
        walker = PatternRewriteWalker(GreedyRewritePatternApplier(list(self.patterns(ctx, rewrites))),
                                      apply_recursively=False)
        changed = walker.rewrite_module(module.module)
        text = print_triton(module) if changed else ctx.text
        return PassResult(text, notes=rewrites.notes(), module=module)


@dataclass
class Rewrites:
    """What a pass's patterns did, by kind (`{"tt.load given evict_first": 2}`), for its notes."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def notes(self) -> list[str]:
        return [f"{n} {what}" for what, n in self.counts.items()]
