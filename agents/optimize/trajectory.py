"""`trajectory.jsonl`: every event of one task's search, one JSON object a line, appended and fsynced.

Events (`type`): `start`, `contract`, `candidate` (every candidate: key, parent, space, proposer, edit,
verdict, timings, speedup, SOL fraction, status), `baselines`, `evidence`, `findings`, `plan`, `incumbent`,
`prune`, `plateau`, `stop`, `final`. A run killed with `kill -9` leaves at worst a torn last line;
`replay` skips it, and `--resume` rebuilds the search from the events (candidates judged before the kill
are not judged again). Candidate sources live beside it in `candidates/<key>.py`.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TRAJECTORY_SCHEMA = "kstrata.optimize-trajectory/1"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


class Trajectory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def append(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, default=str, sort_keys=False)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def replay(self) -> Iterator[dict[str, Any]]:
        """The events written so far; a torn (unparseable) line — the kill's — is skipped."""
        if not self.path.exists():
            return
        for raw in self.path.read_text(errors="replace").splitlines():
            if not raw.strip():
                continue
            try:
                ev = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(ev, dict) and "type" in ev:
                yield ev
