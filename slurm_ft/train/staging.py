"""Staging: the copy of a state dict into host memory that an async save blocks the training loop for.

Buffers are kept between saves (pinned when CUDA is available), so a steady-state stage is one memcpy per
tensor into memory that is already mapped. Safe because at most one save is in flight: the manager waits for
the previous save before staging the next.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.distributed.tensor import DTensor


class Stager:
    """``stage(state)`` returns a CPU copy of ``state`` (DTensors keep mesh and placements)."""

    def __init__(self, *, reuse_buffers: bool = True, pin_memory: bool | None = None) -> None:
        self.reuse_buffers = reuse_buffers
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._next: dict[tuple, torch.Tensor] = {}
        self._device_copies = False

    @property
    def cached_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def stage(self, state: Any) -> Any:
        self._next, self._device_copies = {}, False
        staged = self._walk(state, ())
        if self._device_copies:
            torch.cuda.synchronize()
        self._buffers = self._next if self.reuse_buffers else {}
        return staged

    def _walk(self, obj: Any, path: tuple) -> Any:
        if isinstance(obj, DTensor):
            local = self._copy(obj.to_local(), path)
            return DTensor.from_local(local, obj.device_mesh, obj.placements, run_check=False,
                                      shape=obj.shape, stride=obj.stride())
        if isinstance(obj, torch.Tensor):
            return self._copy(obj, path)
        if isinstance(obj, dict):
            return {k: self._walk(v, (*path, k)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
            return type(obj)(self._walk(v, (*path, i)) for i, v in enumerate(obj))
        return copy.deepcopy(obj)

    def _copy(self, tensor: torch.Tensor, path: tuple) -> torch.Tensor:
        src = tensor.detach()
        buf = self._buffers.get(path)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype or buf.stride() != _stride(src):
            buf = torch.empty_strided(src.shape, _stride(src), dtype=src.dtype, device="cpu",
                                      pin_memory=self.pin_memory and src.device.type == "cuda")
        if src.device.type == "cuda":
            self._device_copies = True
            buf.copy_(src, non_blocking=True)
        else:
            buf.copy_(src)
        self._next[path] = buf
        return buf


def _stride(tensor: torch.Tensor) -> tuple[int, ...]:
    """The tensor's strides when contiguous, else a contiguous layout (copy_ handles any source layout)."""
    if tensor.is_contiguous():
        return tuple(tensor.stride())
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta").stride()
