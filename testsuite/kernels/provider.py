"""The project's kernel suite (and its planted cases) as a provider for `kstrata suite`, `kstrata verify`
(importing `.launch` registers the suite kernels' launches) and the scripts under `tools/`.

Registered under the `kstrata.suites` entry-point group (pyproject.toml), so the command line finds the
suite without importing `testsuite/` (the package never imports its tests; see `tools/suite.py`).
Everything here is a re-export: the suite's own modules stay where they are.
"""

from __future__ import annotations

from typing import Any

from . import all_kernels, get_kernel
from .build import build_suite, bundle_for, specialization
from .launch import suite_launch_record
from .run import launch


def planted_cases() -> list[Any]:
    """The planted candidates (`testsuite/planted`): wrong and correct rewrites for the verifiers."""
    from kstrata.testsuite.planted import CASES

    return list(CASES)


NAME = "kstrata"
DESCRIPTION = "the project's own Triton kernels, with PyTorch references and launch specs"

__all__ = ["DESCRIPTION", "NAME", "all_kernels", "build_suite", "bundle_for", "get_kernel", "launch",
           "planted_cases", "specialization", "suite_launch_record"]
