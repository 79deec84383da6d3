"""Shared fixtures: the suite built once per test session for the two reference targets."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kstrata.ir.target import Target

REFERENCE_TARGETS = ("cuda:90", "hip:gfx942")


@pytest.fixture(scope="session", autouse=True)
def engine_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The candidate engine's cache for this session (never the user's ~/.cache/kstrata/engine)."""
    root = tmp_path_factory.mktemp("engine-cache")
    saved = os.environ.get("KSTRATA_ENGINE_CACHE")
    os.environ["KSTRATA_ENGINE_CACHE"] = str(root)
    yield root
    if saved is None:
        os.environ.pop("KSTRATA_ENGINE_CACHE", None)
    else:
        os.environ["KSTRATA_ENGINE_CACHE"] = saved


@pytest.fixture(scope="session")
def suite_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache root holding the whole suite compiled for cuda:90 and hip:gfx942 (built once)."""
    from kstrata.testsuite.kernels.build import build_suite

    root = tmp_path_factory.mktemp("suite-cache")
    for spelling in REFERENCE_TARGETS:
        result = build_suite(Target.parse(spelling), root)
        assert not result.errors, f"suite kernels failed to compile for {spelling}: {result.errors}"
    return root


def has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available()) and torch.version.hip is None
    except Exception:
        return False
