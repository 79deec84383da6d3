"""kstrata: make GPU kernels faster at every level of Triton's lowering, and prove the faster version
computes the same thing.

Subpackages: `kstrata.ir` (data model: kernel bundles, targets, IR), `kstrata.passes` (transformations),
`kstrata.backends` (NVIDIA and AMD tools), `kstrata.agents` (search), `kstrata.testsuite` (our kernels
and tasks), `kstrata.tools` (the `kstrata` command line).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kstrata")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

__all__ = ["__version__"]
