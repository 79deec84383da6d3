"""Passes by name: the built-in catalogue (imported lazily) and third-party passes from the
`kstrata.passes` entry-point group.

A third-party package registers passes in its `pyproject.toml`:

    [project.entry-points."kstrata.passes"]
    my-pass = "my_package.passes:MyPass"

The entry point's name must equal the pass's `name`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from .base import KernelPass, PassError

ENTRY_POINT_GROUP = "kstrata.passes"

#: Built-in passes: name -> "module:Class" (modules are imported only when a pass is asked for).
BUILTIN_PASSES: dict[str, str] = {
    "dot-precision": "kstrata.passes.ttir:DotPrecision",
    "load-eviction": "kstrata.passes.ttir:LoadEviction",
    "grouped-pid": "kstrata.passes.grouped_pid:GroupedProgramIds",
    "interleaved-pid": "kstrata.passes.interleaved_pid:InterleavedProgramIds",
    "num-warps": "kstrata.passes.ttgir:NumWarps",
    "num-stages": "kstrata.passes.ttgir:NumStages",
    "noalias-args": "kstrata.passes.llir:NoAliasArgs",
    "flush-denormals": "kstrata.passes.llir:FlushDenormals",
    "ld-nc": "kstrata.passes.ptx:LoadNonCoherent",
    "cache-hints": "kstrata.passes.ptx:CacheHints",
    "ptxas-options": "kstrata.passes.ptx:PtxasOptionsPass",
    "max-registers": "kstrata.passes.ptx:MaxRegisters",
    "ptx-reorder": "kstrata.passes.ptx_sched:PtxReorder",
    "redundant-cvt": "kstrata.passes.ptx_cvt:RedundantConversions",
    "ptx-predicate": "kstrata.passes.ptx_predicate:PtxPredicate",
    "nontemporal-hints": "kstrata.passes.amdgcn:NontemporalHints",
    "mfma-priority": "kstrata.passes.amdgcn:MfmaPriority",
    "amdgcn-reorder": "kstrata.passes.amdgcn_sched:AmdgcnReorder",
}


def _load(target: str, origin: str) -> type[KernelPass]:
    module_name, _, attr = target.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PassError(f"cannot load pass {target!r} ({origin}): {exc}") from None
    if not (isinstance(obj, type) and issubclass(obj, KernelPass)):
        raise PassError(f"{target!r} ({origin}) is not a KernelPass subclass")
    return obj


def _plugin_passes() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_passes() -> dict[str, str]:
    """Every pass name with where it comes from ("module:Class")."""
    passes = dict(BUILTIN_PASSES)
    for name, target in _plugin_passes().items():
        if name in passes and passes[name] != target:
            raise PassError(f"plugin pass {name!r} ({target}) clashes with {passes[name]}")
        passes[name] = target
    return passes


def get_pass(name: str) -> type[KernelPass]:
    """The pass class called `name`; a `PassError` lists the known names otherwise."""
    passes = available_passes()
    if name not in passes:
        raise PassError(f"unknown pass {name!r}; known passes: {', '.join(sorted(passes))}")
    cls = _load(passes[name], "built-in" if name in BUILTIN_PASSES else f"entry point {ENTRY_POINT_GROUP}")
    if cls.name != name:
        raise PassError(f"pass registered as {name!r} calls itself {cls.name!r}")
    return cls
