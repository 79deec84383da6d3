"""Errors a user can act on: what failed, where (file, kernel, level), and what to do."""

from __future__ import annotations

from pathlib import Path


class KstrataError(Exception):
    """Base of every error kstrata reports to a user instead of a traceback."""

    def __init__(self, message: str, *, path: str | Path | None = None, hint: str | None = None) -> None:
        self.message = message
        self.path = None if path is None else str(path)
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{self.message}{hint}"


def cut_text(text: str, limit: int = 200) -> str:
    """`text` cut to about `limit` characters, saying how long it was: errors quote input, never all of it."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


class TargetError(KstrataError):
    """A target spelling kstrata does not know."""


class BundleError(KstrataError):
    """A kernel bundle (cache entry, dump entry, override entry) that is missing, truncated or corrupt."""


class CompileError(KstrataError):
    """Triton failed to compile a kernel for a target."""
