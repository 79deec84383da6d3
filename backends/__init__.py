"""Targets and their tools: discovery, rebuilds, disassembly, resource reports, launching binaries."""
