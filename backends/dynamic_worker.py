"""`python -m kstrata.backends.dynamic_worker JOBS`: the child process of `dynamic.run_jobs` (a module of
its own, so that `backends.zygote` may fork it from a process with torch imported)."""

from __future__ import annotations

import sys

from kstrata.backends.dynamic import child_main

if __name__ == "__main__":
    child_main(sys.argv[1])
