"""Kernel suites for the command line and the scripts under `tools/`, found through the `kstrata.suites`
entry-point group.

The project's suite (`testsuite/kernels`) registers itself there (pyproject.toml), so `tools/` never
imports `testsuite/`: the dependency points from the suite to the tools that serve it, like a pass
plugin's. A package installed without it says so in one line. An editable install made before the group
existed has no entry for it: run `pip install -e .` (or `make setup`) again.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

from kstrata.ir.bundle import KernelBundle
from kstrata.ir.errors import KstrataError

GROUP = "kstrata.suites"


class KernelSuite(Protocol):
    """What a suite provider module exposes."""

    NAME: str
    DESCRIPTION: str

    def all_kernels(self) -> list[Any]: ...
    def get_kernel(self, name: str) -> Any: ...
    def build_suite(self, target: Any, cache_dir: str | Path, kernels: list[Any] | None = None,
                    on_kernel: Callable[..., None] | None = None) -> Any: ...
    def bundle_for(self, kernel: Any, target: Any, cache_dir: str | Path | None = None) -> KernelBundle: ...
    def specialization(self, kernel: Any) -> tuple[dict[str, str], dict[str, Any], dict[Any, Any]]: ...
    def suite_launch_record(self, kernel: Any, target: str, seed: int = 0, snapshot_dir: Path | None = None) -> Any: ...
    def launch(self, kernel: Any, args: Any) -> None: ...
    def planted_cases(self) -> list[Any]: ...


def suite_names() -> Sequence[str]:
    return sorted(ep.name for ep in importlib.metadata.entry_points(group=GROUP))


def load_suite(name: str = "kstrata") -> KernelSuite:
    """The suite registered as `name` (the project's own by default)."""
    found = [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.name == name]
    if not found:
        known = ", ".join(suite_names()) or "none"
        raise KstrataError(f"no kernel suite {name!r} is registered (entry-point group {GROUP}; registered: "
                           f"{known}); reinstall kstrata (pip install -e . or make setup)")
    return cast(KernelSuite, found[0].load())
