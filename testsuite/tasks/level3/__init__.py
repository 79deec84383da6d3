"""Small whole models at KernelBench level 3's published sizes: batch 1, so each layer is a few microseconds of
GPU work and a call is bound by launching kernels (what CUDA graphs are for)."""
