"""`leave()`: how kstrata's child processes end (the job runners that load user code)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn

#: What must run before `leave` ends the process (`os._exit` skips the exit hooks): a launch recorder
#: installed in this process (`kstrata record` around the job) registers the writing of its launch counts.
_BEFORE_LEAVING: list[Callable[[], None]] = []


def before_leaving(fn: Callable[[], None]) -> None:
    """Run `fn` when this process ends through `leave` (it runs at interpreter exit otherwise)."""
    _BEFORE_LEAVING.append(fn)


def leave(code: int = 0) -> NoReturn:
    """Flush and leave at once (`os._exit`): threads a user's code left running must not keep the process,
    and the parent waiting on it, alive. What `before_leaving` registered runs first."""
    for fn in _BEFORE_LEAVING:
        try:
            fn()
        except Exception as exc:  # the job's result is written already: say it and leave
            print(f"kstrata: before leaving: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
