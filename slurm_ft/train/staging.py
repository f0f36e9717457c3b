"""Staging: the copy of a state dict into host memory that an async save blocks the training loop for.

Buffers are kept between saves (pinned when CUDA is available), so a steady-state stage is one memcpy per
tensor into memory that is already mapped. Safe because at most one save is in flight: the manager waits for
the previous save before staging the next.

Device tensors are copied on a side stream of their device, one per device and kept (DCP's pinned, non-blocking
stager does the same): it first waits for the work queued so far on the current stream (the values the step just
computed), then every copy is queued without blocking (pinned memory makes them real async DMA), and the stage
waits for that stream alone, not for the whole device (``torch.cuda.synchronize`` would also wait for NCCL's
streams and anything else in flight). CPU tensors take the plain memcpy, with no CUDA call at all.
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
        self._streams: dict[torch.device, torch.cuda.Stream] = {}  # one side stream per device, kept
        self._used: list[torch.cuda.Stream] = []  # the side streams this stage queued copies on

    @property
    def cached_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def stage(self, state: Any) -> Any:
        self._next, self._used = {}, []
        staged = self._walk(state, ())
        for stream in self._used:
            stream.synchronize()  # the copies are done: the caller may change the live tensors
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
            with torch.cuda.stream(self._side_stream(src.device)):
                buf.copy_(src, non_blocking=True)
        else:
            buf.copy_(src)
        self._next[path] = buf
        return buf

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        """``device``'s side stream, waiting (once per stage) for what the current stream has queued so far."""
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device=device)
        if stream not in self._used:
            stream.wait_stream(torch.cuda.current_stream(device))
            self._used.append(stream)
        return stream


def _stride(tensor: torch.Tensor) -> tuple[int, ...]:
    """The tensor's strides when contiguous, else a contiguous layout (copy_ handles any source layout)."""
    if tensor.is_contiguous():
        return tuple(tensor.stride())
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta").stride()
