"""The data model: targets, kernel bundles (one kernel at every level), launch specs and Triton IR."""

from .errors import BundleError, CompileError, KstrataError, TargetError
from .target import Target

__all__ = ["BundleError", "CompileError", "KstrataError", "Target", "TargetError"]
