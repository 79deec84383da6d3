"""A worker for the zygote's tests (`backends/zygote.py`): reports how it was started, then does what its
argument (JSON) asks: read lines from stdin, write to stdout/stderr, start a grandchild, sleep, exit with a
code or kill itself with a signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

PRELOADED = "torch" in sys.modules  # before anything here imports it


def main() -> None:
    spec = json.loads(sys.argv[1])
    report = {"preloaded": PRELOADED, "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0),
              "cwd": os.getcwd(), "argv": sys.argv, "path0": sys.path[0], "main": __name__,
              "env": {k: os.environ.get(k) for k in spec.get("env", [])}, "stdin": []}
    for _ in range(spec.get("read", 0)):
        report["stdin"].append(sys.stdin.readline().strip())
    if spec.get("grandchild"):
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        report["grandchild"] = g.pid
    with open(spec["report"], "w") as f:
        json.dump(report, f)
    print(spec.get("out", ""), flush=True)
    print(spec.get("err", ""), file=sys.stderr, flush=True)
    if spec.get("sleep"):
        time.sleep(spec["sleep"])
    if spec.get("signal"):
        os.kill(os.getpid(), getattr(signal, spec["signal"]))
    sys.exit(spec.get("exit", 0))


if __name__ == "__main__":
    main()
