"""Planted-bug cases for the verifiers: wrong candidates `kstrata verify` must reject and correct
rewrites it must accept, at every level, with a harness (`python -m kstrata.testsuite.planted.run`)
that reports the rejection rate per level and which bugs only a GPU run catches."""

from __future__ import annotations

from .cases import CASES, get_case
from .spec import PlantedCase, PlantedEditError, TextEdit

__all__ = ["CASES", "PlantedCase", "PlantedEditError", "TextEdit", "get_case"]
