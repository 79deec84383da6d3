"""`python -m kstrata.agents.compiled.replay ENTRY RECORD`: launch a cache entry's kernel once on its launch
record (random inputs of the recorded shapes) on the GPU, for a profiler to watch (Nsight Compute's
source-level sampling: `backends/hotwindow.py`). Needs an NVIDIA GPU; exit 2 with one line otherwise."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m kstrata.agents.compiled.replay ENTRY RECORD", file=sys.stderr)
        return 2
    import torch

    from kstrata.agents.engine import _load_one
    from kstrata.backends.launch import LoadedKernel
    from kstrata.backends.replay import replay_args
    from kstrata.ir.errors import KstrataError
    from kstrata.ir.launch import LaunchRecord

    if not torch.cuda.is_available():
        print("error: replaying a kernel needs an NVIDIA GPU", file=sys.stderr)
        return 2
    try:
        record = LaunchRecord.load(args[1])
        bundle = _load_one(args[0])
        record.check_against(bundle.params)
    except KstrataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    LoadedKernel(bundle).call_by_name(record.grid, replay_args(record, "cuda", 0))
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
