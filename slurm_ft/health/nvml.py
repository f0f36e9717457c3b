"""The NVML probe: one ``NvmlSnapshot`` per call, never an exception.

NVML sits behind a module-like object (``pynvml`` by default, ``nvml_fake.FakeNvml`` in tests), so the probe
runs the same code on a GPU node and on a laptop. Where NVML, its library or the GPUs are absent the snapshot
says so (``available=False, error="nvml unavailable: ..."``); a counter a GPU does not support stays ``None``.

Xid events come from an NVML event set registered for ``XidCriticalError``. An event set only sees events
that happen after it was registered, so a one-shot probe only catches Xids during its ``xid_wait_ms``; a
long-lived caller keeps an ``XidWatcher``. Past Xids (before registration) are in the kernel log: see kmsg.py.

``python -m slurm_ft.health.nvml`` prints this node's snapshot as JSON.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from slurm_ft.health.records import GpuHealth, GpuUse, NvmlSnapshot, XidEvent, normalize_pci_bus

# NVML constants (stable across NVML versions; spelled here so a fake need not define them).
_VOLATILE_ECC, _AGGREGATE_ECC = 0, 1
_CORRECTED, _UNCORRECTED = 0, 1
_RETIRE_SBE, _RETIRE_DBE = 0, 1
_TEMPERATURE_GPU = 0
_FEATURE_ENABLED = 1
_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
_NVLINK_MAX_LINKS = 18  # fallback when the module lacks NVML_NVLINK_MAX_LINKS (H100/B200: 18 links per GPU)
_NVLINK_COUNTERS = (0, 1, 2, 3)  # DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA
_ERROR_TIMEOUT = 10
_FI_GPU_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h, R550+)
_SUCCESS = 0


def load_pynvml() -> Any:
    """Import pynvml (nvidia-ml-py); ``None`` when it is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class NvmlProbe:
    """Reads GPU count, counters and pending Xid events through ``nvml`` (``pynvml`` or a fake)."""

    def __init__(self, nvml: Any = None, *, clock: Callable[[], float] = time.time,
                 xid_wait_ms: int = 0) -> None:
        self._nvml = nvml if nvml is not None else load_pynvml()
        self._clock = clock
        self._xid_wait_ms = xid_wait_ms
        self._max_links = int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", _NVLINK_MAX_LINKS))

    def snapshot(self, node: str | None = None) -> NvmlSnapshot:
        """What NVML says about this node now; ``available=False`` with the reason when it cannot say."""
        node = node or socket.gethostname()
        now = self._clock()
        nv = self._nvml
        if nv is None:
            return NvmlSnapshot(node=node, time=now, available=False, error="nvml unavailable: pynvml not installed")
        try:
            nv.nvmlInit()
        except Exception as exc:  # noqa: BLE001 - NVMLError subclasses, OSError from a broken library
            return NvmlSnapshot(node=node, time=now, available=False, error=f"nvml unavailable: {_describe(exc)}")
        try:
            return self._read(node, now)
        except Exception as exc:  # noqa: BLE001 - a driver fault mid-read is a record, not a crash
            return NvmlSnapshot(node=node, time=now, available=False, error=f"nvml failed: {_describe(exc)}")
        finally:
            _call(nv.nvmlShutdown)

    def _read(self, node: str, now: float) -> NvmlSnapshot:
        nv = self._nvml
        driver = _text(_call(nv.nvmlSystemGetDriverVersion) or "")
        count = nv.nvmlDeviceGetCount()
        gpus = tuple(self._gpu(index) for index in range(count))
        xids: tuple[XidEvent, ...] = ()
        if self._xid_wait_ms > 0 and count:
            watcher = XidWatcher(nv, node=node, clock=self._clock)
            try:
                xids = tuple(watcher.poll(self._xid_wait_ms))
            finally:
                watcher.close()
        return NvmlSnapshot(node=node, time=now, available=True, driver_version=driver, gpus=gpus, xids=xids)

    def _gpu(self, index: int) -> GpuHealth:
        nv = self._nvml
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # noqa: BLE001 - e.g. NVML_ERROR_GPU_IS_LOST: evidence, not a crash
            return GpuHealth(index=index, error=_describe(exc))
        remap = _call(nv.nvmlDeviceGetRemappedRows, handle)
        pci = _call(nv.nvmlDeviceGetPciInfo, handle)
        links_up, links_down, link_errors = self._nvlinks(handle)
        return GpuHealth(
            index=index,
            uuid=_text(_call(nv.nvmlDeviceGetUUID, handle) or ""),
            pci_bus=normalize_pci_bus(_text(getattr(pci, "busId", b""))) if pci is not None else "",
            ecc_volatile_uncorrected=_call(nv.nvmlDeviceGetTotalEccErrors, handle, _UNCORRECTED, _VOLATILE_ECC),
            ecc_volatile_corrected=_call(nv.nvmlDeviceGetTotalEccErrors, handle, _CORRECTED, _VOLATILE_ECC),
            ecc_aggregate_uncorrected=_call(nv.nvmlDeviceGetTotalEccErrors, handle, _UNCORRECTED, _AGGREGATE_ECC),
            ecc_aggregate_corrected=_call(nv.nvmlDeviceGetTotalEccErrors, handle, _CORRECTED, _AGGREGATE_ECC),
            remapped_rows_correctable=None if remap is None else int(remap[0]),
            remapped_rows_uncorrectable=None if remap is None else int(remap[1]),
            remap_pending=None if remap is None else bool(remap[2]),
            remap_failure=None if remap is None else bool(remap[3]),
            retired_pages_sbe=_count(_call(nv.nvmlDeviceGetRetiredPages, handle, _RETIRE_SBE)),
            retired_pages_dbe=_count(_call(nv.nvmlDeviceGetRetiredPages, handle, _RETIRE_DBE)),
            retired_pages_pending=_enabled(_call(nv.nvmlDeviceGetRetiredPagesPendingStatus, handle)),
            nvlink_up=links_up,
            nvlink_down=links_down,
            nvlink_errors=link_errors,
            temperature_c=_call(nv.nvmlDeviceGetTemperature, handle, _TEMPERATURE_GPU),
            recovery_action=self._recovery_action(handle),
        )

    def _recovery_action(self, handle: Any) -> int | None:
        """The driver's own word on what the GPU needs; None where the driver (or pynvml) lacks the field."""
        get = getattr(self._nvml, "nvmlDeviceGetFieldValues", None)
        values = _call(get, handle, [_FI_GPU_RECOVERY_ACTION]) if get is not None else None
        if not values:
            return None
        value = values[0]
        if int(getattr(value, "nvmlReturn", -1)) != _SUCCESS:
            return None
        return int(value.value.uiVal)

    def _nvlinks(self, handle: Any) -> tuple[int | None, tuple[int, ...], int | None]:
        """(active links, inactive link ids, summed error counters of active links); None where unsupported."""
        nv = self._nvml
        up, down, errors, counted = 0, [], 0, False
        for link in range(self._max_links):
            state = _call(nv.nvmlDeviceGetNvLinkState, handle, link)
            if state is None:
                continue  # link not present on this GPU
            if not state:
                down.append(link)
                continue
            up += 1
            for counter in _NVLINK_COUNTERS:
                value = _call(nv.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
                if value is not None:
                    errors, counted = errors + int(value), True
        if not up and not down:
            return None, (), None
        return up, tuple(down), errors if counted else None


def gpu_use(nvml: Any) -> list[GpuUse]:
    """Who holds each GPU now: its compute processes (``nvmlDeviceGetComputeRunningProcesses``) and memory used
    (``nvmlDeviceGetMemoryInfo``). The caller owns NVML initialisation (one ``nvmlInit`` for a whole wait: it can
    take a second where persistence mode is off); a GPU NVML cannot open is a record with its ``error``."""
    return [_use(nvml, index) for index in range(nvml.nvmlDeviceGetCount())]


def _use(nvml: Any, index: int) -> GpuUse:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:  # noqa: BLE001 - NO_PERMISSION (another job's GPU under cgroups), GPU_IS_LOST
        return GpuUse(index=index, error=_describe(exc))
    processes = _call(nvml.nvmlDeviceGetComputeRunningProcesses, handle)
    memory = _call(nvml.nvmlDeviceGetMemoryInfo, handle)
    pci = _call(nvml.nvmlDeviceGetPciInfo, handle)
    return GpuUse(index=index, uuid=_text(_call(nvml.nvmlDeviceGetUUID, handle) or ""),
                  pci_bus=normalize_pci_bus(_text(getattr(pci, "busId", b""))) if pci is not None else "",
                  pids=None if processes is None else tuple(sorted(int(p.pid) for p in processes)),
                  used_mb=None if memory is None else int(memory.used) // 2**20)


def gpu_identity(nvml: Any, device: str) -> tuple[int, str, str] | None:
    """(NVML index, UUID, PCI bus) of ``device``: a UUID (``GPU-...``, as CUDA_VISIBLE_DEVICES may name it) or an
    NVML index; None when NVML cannot find it. The caller owns NVML initialisation."""
    try:
        if device.startswith(("GPU-", "MIG-")):
            handle = nvml.nvmlDeviceGetHandleByUUID(device)
            index = int(nvml.nvmlDeviceGetIndex(handle))
        else:
            index = int(device)
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # noqa: BLE001 - not a device NVML knows (ValueError: not a number either)
        return None
    pci = _call(nvml.nvmlDeviceGetPciInfo, handle)
    return (index, _text(_call(nvml.nvmlDeviceGetUUID, handle) or ""),
            normalize_pci_bus(_text(getattr(pci, "busId", b""))) if pci is not None else "")


class XidWatcher:
    """An NVML event set registered for XidCriticalError on every GPU; ``poll`` drains what arrived.

    The caller owns NVML initialisation for the watcher's lifetime (``NvmlProbe`` does it for one-shot use).
    """

    def __init__(self, nvml: Any, *, node: str, clock: Callable[[], float] = time.time) -> None:
        self._nv = nvml
        self._node = node
        self._clock = clock
        self._set = nvml.nvmlEventSetCreate()
        self.registered: list[int] = []
        self.notes: list[str] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, _XID_CRITICAL, self._set)
                self.registered.append(index)
            except Exception as exc:  # noqa: BLE001 - unsupported on this GPU: say so, watch the others
                self.notes.append(f"gpu {index}: xid events unavailable: {_describe(exc)}")

    def poll(self, timeout_ms: int, *, max_events: int = 64) -> list[XidEvent]:
        """Xid events pending now, waiting up to ``timeout_ms`` for the first one."""
        events: list[XidEvent] = []
        wait = timeout_ms
        while len(events) < max_events and self.registered:
            try:
                data = self._nv.nvmlEventSetWait(self._set, wait)
            except Exception as exc:  # noqa: BLE001 - NVML_ERROR_TIMEOUT ends the drain
                if getattr(exc, "value", None) != _ERROR_TIMEOUT:
                    self.notes.append(f"xid wait failed: {_describe(exc)}")
                break
            wait = 0
            if not int(getattr(data, "eventType", 0)) & _XID_CRITICAL:
                continue
            events.append(self._event(data))
        return events

    def _event(self, data: Any) -> XidEvent:
        index = _call(self._nv.nvmlDeviceGetIndex, data.device)
        pci = _call(self._nv.nvmlDeviceGetPciInfo, data.device)
        xid = int(data.eventData)
        return XidEvent(node=self._node, xid=xid, gpu_index=index, time=self._clock(),
                        pci_bus=normalize_pci_bus(_text(getattr(pci, "busId", b""))) if pci is not None else "",
                        text=f"NVML XidCriticalError {xid}", source="nvml")

    def close(self) -> None:
        _call(self._nv.nvmlEventSetFree, self._set)


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None when NVML raises (NotSupported, NoPermission, ...): the field stays unknown."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - every NVMLError means "NVML cannot tell", which None records
        return None


def _count(pages: Any) -> int | None:
    return None if pages is None else len(pages)


def _enabled(value: Any) -> bool | None:
    return None if value is None else int(value) == _FEATURE_ENABLED


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def main(argv: list[str] | None = None) -> int:
    """Print this node's NVML snapshot as JSON (``--xid-wait-ms N`` also waits for Xid events)."""
    argv = sys.argv[1:] if argv is None else argv
    wait = int(argv[argv.index("--xid-wait-ms") + 1]) if "--xid-wait-ms" in argv else 0
    snap = NvmlProbe(xid_wait_ms=wait).snapshot()
    print(json.dumps(dataclasses.asdict(snap), indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
