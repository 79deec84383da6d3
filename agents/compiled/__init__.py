"""Optimizing already-compiled kernels: a Triton cache plus the launch records of a recorded program.

    program.py    the cache's kernels matched to launch records, ranked by their share of GPU time
    spaces.py     the edits worth trying on a kernel, from every pass's `schedule_space`
    search.py     singletons then simulated annealing over edit sequences, every candidate gated by
                  `Engine.check` before it is scored (timed on an NVIDIA GPU, surrogate-ranked on AMD)
    surrogate.py  the static AMD surrogate (llvm-mca throughput of the hot window)
    run.py        `kstrata optimize CACHE_DIR --launches RECORDS`: the driver, outputs and report
"""
