"""The pass contract: a level, options, a precondition, and `apply`.

A pass is a frozen dataclass whose fields are its options, so the object is its own command-line
spelling (`ld-nc{assume_noalias=true}`). It declares the level it rewrites, the backends it applies
to, and — when its result is not bit-exact — the tolerance it needs. `precondition` returns `None`
when the pass is sound on this kernel, or the reason it is not; then the pass changes nothing.
`apply` returns the new text of its level (and, for passes that change how lower levels are built,
metadata updates such as `num_warps` or `ptx_options`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError
from kstrata.ir.tolerance import Tolerance

PASS_LEVELS = ("ttir", "ttgir", "llir", "ptx", "amdgcn")


class PassError(KstrataError):
    """A pass or pipeline that cannot be built or run."""


@dataclass
class PassContext:
    """What a pass sees: the kernel as it is now (all levels), and the text of the pass's level."""

    bundle: KernelBundle
    level: str

    @property
    def text(self) -> str:
        return self.bundle.text(self.level)


@dataclass
class PassResult:
    """The outcome of one pass on one kernel."""

    text: str
    #: Metadata the lower levels must be built with (e.g. `num_warps`, `ptx_options`).
    metadata_updates: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class KernelPass:
    """Base of every pass. Subclasses are frozen dataclasses; their fields are the options."""

    name: ClassVar[str]
    level: ClassVar[str]
    backends: ClassVar[tuple[str, ...]] = ("cuda", "hip")
    #: `None` when the pass keeps results bit-exact; otherwise the tolerance it needs (ULPs or
    #: relative/absolute error, and why). Passes whose tolerance depends on their options override
    #: `declared_tolerance`.
    tolerance: ClassVar[Tolerance | None] = None

    def declared_tolerance(self) -> Tolerance | None:
        """The tolerance this pass, with these options, declares (None: bit-exact)."""
        return self.tolerance

    def precondition(self, ctx: PassContext) -> str | None:
        """`None` when the pass is sound on `ctx`'s kernel, or why it is not (then nothing changes)."""
        return None

    def apply(self, ctx: PassContext) -> PassResult:
        raise NotImplementedError

    # -- spelling -------------------------------------------------------------------------------
    def spelling(self) -> str:
        """`name{opt=value …}` with the options that differ from their defaults."""
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            default = f.default if f.default is not dataclasses.MISSING else None
            if value != default:
                parts.append(f"{f.name}={_format_value(value)}")
        return self.name + ("{" + " ".join(parts) + "}" if parts else "")

    @classmethod
    def from_options(cls, options: dict[str, str]) -> KernelPass:
        """Build the pass from `name{k=v}` option strings, converting each to its field's type."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in options.items():
            if key not in fields:
                known = ", ".join(fields) or "none"
                raise PassError(f"pass {cls.name} has no option {key!r} (options: {known})")
            kwargs[key] = _convert(cls.name, key, raw, fields[key])
        return cls(**kwargs)

    @classmethod
    def describe(cls) -> dict[str, Any]:
        doc = (cls.__doc__ or "").strip()
        return {
            "name": cls.name, "level": cls.level, "backends": list(cls.backends),
            "tolerance": cls.tolerance.spelling() if cls.tolerance else None,
            "tolerance_why": cls.tolerance.why if cls.tolerance else None,
            "options": {f.name: {"type": str(f.type), "default": None if f.default is dataclasses.MISSING else f.default}
                        for f in dataclasses.fields(cls)},
            "summary": doc.splitlines()[0] if doc else "", "doc": doc,
        }


def _convert(pass_name: str, key: str, raw: str, f: dataclasses.Field[Any]) -> Any:
    kind = str(f.type)
    try:
        if kind in ("bool", "<class 'bool'>"):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if kind in ("int", "<class 'int'>"):
            return int(raw)
        if kind in ("float", "<class 'float'>"):
            return float(raw)
        if kind.startswith("int | None"):
            return None if raw.lower() == "none" else int(raw)
    except ValueError:
        raise PassError(f"pass {pass_name}: option {key}={raw!r} is not a valid {kind}") from None
    return raw
