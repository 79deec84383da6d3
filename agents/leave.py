"""`leave()`: how kstrata's child processes end (the job runners that load user code)."""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def leave(code: int = 0) -> NoReturn:
    """Flush and leave at once (`os._exit`): threads a user's code left running must not keep the process,
    and the parent waiting on it, alive. `os._exit` skips the exit hooks, so a launch recorder installed in
    this process (`kstrata record` around the job) writes its launch counts first; it is looked up, never
    imported (the package does not import `tools/`)."""
    recorder = sys.modules.get("kstrata.tools.record")
    if recorder is not None:
        try:
            recorder.flush_counts()
        except Exception as exc:  # the job's result is written already: say it and leave
            print(f"kstrata record: launch counts not written: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
