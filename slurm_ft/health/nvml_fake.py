"""A scripted stand-in for ``pynvml``: answers from a recorded device description, for hosts without GPUs.

The description (JSON, see ``tests/data/nvml/*.fake.json``) lists what each GPU answers; a field that is
``null`` or absent raises NVML_ERROR_NOT_SUPPORTED, as real NVML does for counters a GPU lacks::

    {"driver_version": "535.129.03", "init_error": null,
     "gpus": [{"uuid": "GPU-...", "pci_bus": "00000000:3B:00.0", "temperature": 41, "lost": false,
               "ecc": {"volatile_uncorrected": 0, "volatile_corrected": 0,
                       "aggregate_uncorrected": 0, "aggregate_corrected": 3},
               "remapped_rows": [0, 0, 0, 0], "retired_pages": {"sbe": [], "dbe": []}, "retired_pending": 0,
               "nvlink": [{"active": true, "errors": [0, 0, 0, 0]}]}],
     "events": [{"gpu": 0, "xid": 79}]}

A GPU's users (``slurm_ft.launch.reclaim`` waits on them): ``"memory": {"total_mb": 81559, "used_mb": 0}`` (used by
nobody listed) and ``"processes": [{"pid": 4242, "used_mb": 30000, "until": 1700000002.5}]``: a compute process
NVML lists, with its memory, until ``until`` (epoch seconds on the fake's clock; null or absent: for good). The
lab keeps one such file per node (``<test_nvml_snapshot_dir>/<node>.fake.json``, TEST-ONLY, see
``slurm_ft.health.checks.recorded_fake_path``): a test holds a killed rank's memory on one node's GPU with it. A
fake made ``from_file`` reads the file again when it changes (at ``nvmlDeviceGetCount``, where every look at
the GPUs starts), as a real GPU's users change under a long-lived caller.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ERROR_NAMES = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions", 6: "Not Found",
    9: "Driver Not Loaded", 10: "Timeout", 12: "NVML Shared Library Not Found", 13: "Function Not Found",
    15: "GPU is lost",
    999: "Unknown Error",
}
_CODES = {name: code for code, name in ERROR_NAMES.items()}


class FakeNvmlError(Exception):
    """Mirrors ``pynvml.NVMLError``: ``value`` is the NVML return code, ``str()`` its name."""

    def __init__(self, value: int) -> None:
        super().__init__(ERROR_NAMES.get(value, f"NVML Error with code {value}"))
        self.value = value


@dataclasses.dataclass
class _PciInfo:
    busId: bytes  # noqa: N815 - the pynvml field name


@dataclasses.dataclass
class _Value:
    uiVal: int  # noqa: N815 - the pynvml union member


@dataclasses.dataclass
class _FieldValue:
    fieldId: int  # noqa: N815
    nvmlReturn: int  # noqa: N815
    value: _Value


@dataclasses.dataclass
class _ProcessInfo:
    pid: int
    usedGpuMemory: int | None  # noqa: N815 - bytes, as pynvml says it


@dataclasses.dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclasses.dataclass
class _EventData:
    device: int
    eventType: int  # noqa: N815
    eventData: int  # noqa: N815


_ECC_KEYS = {(1, 0): "volatile_uncorrected", (0, 0): "volatile_corrected",
             (1, 1): "aggregate_uncorrected", (0, 1): "aggregate_corrected"}


class FakeNvml:
    """The subset of the pynvml API that ``NvmlProbe`` and ``XidWatcher`` call. Handles are GPU indices."""

    NVMLError = FakeNvmlError
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, spec: dict[str, Any], *, clock: Callable[[], float] = time.time) -> None:
        self.spec = spec
        self.clock = clock
        self.gpus: list[dict[str, Any]] = list(spec.get("gpus", []))
        self.pending_events: list[dict[str, Any]] = list(spec.get("events", []))
        self.registered: set[int] = set()
        self.initialised = 0
        self.path: Path | None = None  # the spec's file, read again when it changes
        self._stamp: tuple[int, int] | None = None

    @classmethod
    def from_file(cls, path: str | Path, *, clock: Callable[[], float] = time.time) -> "FakeNvml":
        fake = cls(json.loads(Path(path).read_text()), clock=clock)
        fake.path, fake._stamp = Path(path), _stamp(Path(path))
        return fake

    def _refresh(self) -> None:
        """Read the spec's file again if it changed; a file that cannot be read now leaves the last spec."""
        if self.path is None or _stamp(self.path) == self._stamp:
            return
        try:
            spec = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        self.spec, self.gpus, self._stamp = spec, list(spec.get("gpus", [])), _stamp(self.path)

    # --- library -----------------------------------------------------------------------------------------
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml names
        error = self.spec.get("init_error")
        if error:
            raise FakeNvmlError(_CODES.get(error, 999))
        self.initialised += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._require_init()
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._require_init()
        return str(self.spec.get("driver_version", ""))

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._require_init()
        self._refresh()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        self._require_init()
        if not 0 <= index < len(self.gpus):
            raise FakeNvmlError(2)
        if self.gpus[index].get("lost"):
            raise FakeNvmlError(15)
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:  # noqa: N802
        return handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> int:  # noqa: N802
        self._require_init()
        text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        for index, gpu in enumerate(self.gpus):
            if gpu.get("uuid") == text:
                return self.nvmlDeviceGetHandleByIndex(index)
        raise FakeNvmlError(6)  # NVML_ERROR_NOT_FOUND

    # --- per device --------------------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802
        return str(self._field(handle, "uuid"))

    def nvmlDeviceGetPciInfo(self, handle: int) -> _PciInfo:  # noqa: N802
        return _PciInfo(busId=str(self._field(handle, "pci_bus")).encode())

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter_type: int) -> int:  # noqa: N802
        ecc = self._field(handle, "ecc")
        return int(_supported(ecc.get(_ECC_KEYS[(error_type, counter_type)])))

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:  # noqa: N802
        rows = self._field(handle, "remapped_rows")
        return tuple(int(v) for v in rows)  # type: ignore[return-value]

    def nvmlDeviceGetRetiredPages(self, handle: int, cause: int) -> list[int]:  # noqa: N802
        pages = self._field(handle, "retired_pages")
        return list(_supported(pages.get("sbe" if cause == 0 else "dbe")))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:  # noqa: N802
        return int(self._field(handle, "retired_pending"))

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:  # noqa: N802
        return int(self._field(handle, "temperature"))

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:  # noqa: N802
        return int(bool(self._link(handle, link).get("active")))

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:  # noqa: N802
        errors = _supported(self._link(handle, link).get("errors"))
        return int(errors[counter])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_ProcessInfo]:  # noqa: N802
        return [_ProcessInfo(pid=int(p["pid"]), usedGpuMemory=int(p.get("used_mb", 0)) * 2**20)
                for p in self._live(handle)]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:  # noqa: N802
        memory = self._field(handle, "memory")
        total = int(memory.get("total_mb", 0)) * 2**20
        listed = self._live(handle) if self.gpus[handle].get("processes") is not None else []
        used = (int(memory.get("used_mb", 0)) + sum(int(p.get("used_mb", 0)) for p in listed)) * 2**20
        return _Memory(total=total, free=max(0, total - used), used=used)

    def _live(self, handle: int) -> list[dict[str, Any]]:
        """The processes NVML lists on the GPU now: those whose ``until`` has not passed (``"processes": null``:
        the list is not readable, NVML_ERROR_NOT_SUPPORTED)."""
        now = self.clock()
        listed = self._field(handle, "processes") if "processes" in self.gpus[handle] else []
        return [p for p in listed if p.get("until") is None or float(p["until"]) > now]

    # --- events ------------------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> str:  # noqa: N802
        self._require_init()
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, event_types: int, event_set: str) -> None:  # noqa: N802
        if not self.gpus[handle].get("xid_events", True):
            raise FakeNvmlError(3)
        self.registered.add(handle)

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> _EventData:  # noqa: N802
        for i, event in enumerate(self.pending_events):
            if event["gpu"] in self.registered:
                del self.pending_events[i]
                return _EventData(device=int(event["gpu"]), eventType=0x8, eventData=int(event["xid"]))
        raise FakeNvmlError(10)

    def nvmlEventSetFree(self, event_set: str) -> None:  # noqa: N802
        return None

    def nvmlDeviceGetFieldValues(self, handle: int, field_ids: list[int]) -> list[_FieldValue]:  # noqa: N802
        """A GPU's ``"fields": {"230": 2}``; a field it lacks answers NVML_ERROR_NOT_SUPPORTED in its slot, and a
        spec with ``"field_values": false`` lacks the call (an old driver)."""
        self._require_init()
        if self.spec.get("field_values") is False:
            raise FakeNvmlError(13)  # NVML_ERROR_FUNCTION_NOT_FOUND
        fields = self.gpus[handle].get("fields") or {}
        return [_FieldValue(fieldId=f, nvmlReturn=0 if str(f) in fields else 3,
                            value=_Value(uiVal=int(fields.get(str(f), 0)))) for f in field_ids]

    # --- helpers -----------------------------------------------------------------------------------------
    def _require_init(self) -> None:
        if self.initialised <= 0:
            raise FakeNvmlError(1)

    def _field(self, handle: int, name: str) -> Any:
        self._require_init()
        return _supported(self.gpus[handle].get(name))

    def _link(self, handle: int, link: int) -> dict[str, Any]:
        links = self._field(handle, "nvlink")
        if link >= len(links):
            raise FakeNvmlError(2)
        return links[link]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_ino


def _supported(value: Any) -> Any:
    if value is None:
        raise FakeNvmlError(3)
    return value
