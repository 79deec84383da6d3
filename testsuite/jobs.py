"""Child-process jobs for the tests of `kstrata.agents.workers` (run through `call_in_child`): they report
where they ran and can simulate a GPU whose worker dies."""

from __future__ import annotations

import os
import signal
import time
from typing import Any


def where(payload: dict[str, Any]) -> dict[str, Any]:
    """Sleep `payload["sleep"]` seconds and say which GPU this process was pinned to, and when it ran.
    When that GPU is in `payload["die_on"]`, the process is killed instead (a faulting GPU's worker); in
    `payload["hang_on"]`, it sleeps for an hour (a hung one's, or a job over its time allowance)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if visible in payload.get("die_on", []):
        os.kill(os.getpid(), signal.SIGKILL)
    if visible in payload.get("hang_on", []):  # a hung GPU's worker (or a job slower than its allowance)
        time.sleep(3600)
    start = time.time()
    time.sleep(float(payload.get("sleep", 0.0)))
    return {"cuda_visible_devices": visible, "pid": os.getpid(), "start": start, "end": time.time(),
            "tag": payload.get("tag")}


def cuda_device(payload: dict[str, Any]) -> dict[str, Any]:
    """The CUDA devices this process sees (a pinned GPU worker's process sees exactly one)."""
    import torch

    count = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0) if count else None
    return {"count": count, "name": props.name if props else "", "uuid": str(getattr(props, "uuid", "")),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
