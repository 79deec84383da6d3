"""Our own kernels, KernelBench-format tasks and the tests of the project."""
