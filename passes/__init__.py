"""Transformations of kernels at every level: typed IR passes, LLVM passes and assembly patches."""
