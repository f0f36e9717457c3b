"""Node health: NVML probe, kernel-log Xid parser, node checks."""
