"""Storage faults, in process (single rank, real files): disk full, corrupted shards, emergency save."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import subprocess
import threading
import time
import uuid

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.utils.serialization
from torch import nn
from torch.distributed.checkpoint.filesystem import FileSystem

from slurm_ft.core import layout
from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointError, CheckpointManager, FileStorage
from slurm_ft.train.storage import HashingFileSystem, HashingWriter

pytestmark = pytest.mark.gloo


class Position:
    """Extra state, like a sampler position."""

    def __init__(self):
        self.index = 0

    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        self.index = state["index"]


def _setup(ckpt, *, hidden=8, async_save=False, storage=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    pos = Position()
    mgr = CheckpointManager(CheckpointConfig(dir=str(ckpt), every=2, keep_last=5, async_save=async_save),
                            model=model, optimizer=opt, lr_scheduler=sched, extra_state={"pos": pos},
                            storage=storage)
    return mgr, model, opt, sched, pos


def _train(model, opt, sched, pos, step):
    x = torch.full((3, 4), float(step))
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    sched.step()
    pos.index = step


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


class FullDisk(FileStorage):
    """Fails every write with ENOSPC while ``full`` is set."""

    def __init__(self):
        super().__init__()
        self.full = False

    def write_file(self, path, data):
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        super().write_file(path, data)


def test_resume_restores_model_optimizer_scheduler_extra_and_rng(tmp_path):
    mgr, model, opt, sched, pos = _setup(tmp_path)
    for step in (1, 2):
        _train(model, opt, sched, pos, step)
    torch.manual_seed(123)
    assert mgr.save(2).ok
    expected, rng_next = _params(model), torch.rand(3)
    lr = opt.param_groups[0]["lr"]
    mgr2, model2, opt2, sched2, pos2 = _setup(tmp_path)
    assert mgr2.resume() == 2
    assert all(torch.equal(a, b) for a, b in zip(_params(model2), expected))
    assert opt2.param_groups[0]["lr"] == lr and sched2.last_epoch == 2 and pos2.index == 2
    assert torch.equal(torch.rand(3), rng_next)
    assert opt2.state_dict()["state"][0]["step"] == 2


def test_disk_full_during_save_keeps_old_checkpoint_and_training_goes_on(tmp_path, caplog):
    storage = FullDisk()
    mgr, model, opt, sched, pos = _setup(tmp_path, async_save=True, storage=storage)
    _train(model, opt, sched, pos, 2)
    mgr.save(2)
    mgr.wait()
    storage.full = True
    _train(model, opt, sched, pos, 4)
    with caplog.at_level(logging.ERROR, logger="slurm_ft.train.checkpoint"):
        mgr.save(4)
        mgr.wait()
    assert mgr.stats["failed"] == 1 and "No space left" in mgr.stats["last_error"]
    assert "step 4 FAILED" in caplog.text
    assert layout.committed_steps(tmp_path) == [2] and not list(tmp_path.glob(".tmp-*"))
    storage.full = False
    _train(model, opt, sched, pos, 6)
    mgr.save(6)
    mgr.close()
    assert layout.committed_steps(tmp_path) == [2, 6] and mgr.stats["failed"] == 1


class _FailingFileSystem(FileSystem):
    """Fails opening shards for writing in any thread but the one that called ``dcp.save``."""

    def create_stream(self, path, mode):
        if "w" in mode and str(path).endswith(".distcp") and threading.current_thread() is not threading.main_thread():
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
        return super().create_stream(path, mode)


class _HelperThreadFails(HashingFileSystem, _FailingFileSystem):
    pass


class HelperThreadEIO(FileStorage):
    """DCP's extra writer thread (write_threads=2) hits EIO on its shard; the calling thread's writes succeed."""

    def __init__(self):
        super().__init__(write_threads=2)
        self.failing = False

    def writer(self, path, *, step=-1):
        writer = super().writer(path, step=step)
        if self.failing:
            writer.fs = _HelperThreadFails(path, step)
        return writer


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # DCP's writer thread dies
def test_a_write_error_in_a_dcp_helper_thread_fails_the_save_instead_of_committing_it(tmp_path, caplog):
    """DCP's helper threads die silently; a save that lost their shards must not commit (it would not load)."""
    storage = HelperThreadEIO()
    mgr, model, opt, sched, pos = _setup(tmp_path, storage=storage)
    _train(model, opt, sched, pos, 2)
    assert mgr.save(2).ok
    _train(model, opt, sched, pos, 4)
    storage.failing = True
    with caplog.at_level(logging.ERROR, logger="slurm_ft.train.checkpoint"):
        result = mgr.save(4)
    # the helper's error, whether the calling thread finished first ("items not written") or had yet to open a file
    assert not result.ok and "not written" in result.error and "Input/output error" in result.error
    assert "step 4 FAILED" in caplog.text
    assert layout.committed_steps(tmp_path) == [2] and not list(tmp_path.glob(".tmp-*"))
    assert _setup(tmp_path)[0].resume() == 2


class _CallerFailsWhileHelperWrites(HashingFileSystem):
    """The calling thread's shard fails (ENOSPC) while DCP's helper thread is still writing its own shard."""

    def __init__(self, root, step):
        super().__init__(root, step)
        self.helper_writing, self.helper_done = threading.Event(), threading.Event()

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        shard = "w" in mode and str(path).endswith(".distcp")
        with super().create_stream(path, mode) as stream:
            if shard and threading.current_thread() is threading.main_thread():
                self.helper_writing.wait(5)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            if shard:
                self.helper_writing.set()
                time.sleep(0.3)
            yield stream
            if shard:
                self.helper_done.set()


class CallerENOSPC(FileStorage):
    def __init__(self):
        super().__init__(write_threads=2)
        self.fs = None

    def writer(self, path, *, step=-1):
        writer = super().writer(path, step=step)
        writer.fs = self.fs = _CallerFailsWhileHelperWrites(path, step)
        return writer


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # DCP's writer thread dies
def test_a_failed_save_waits_for_dcp_helper_threads_to_close_their_files(tmp_path):
    """DCP's calling thread raises without joining its helpers: the save must not end (and its temporary folder
    be removed) while a helper still writes there; on a full tmpfs the open file kept the mount busy."""
    storage = CallerENOSPC()
    mgr, model, opt, sched, pos = _setup(tmp_path, storage=storage)
    _train(model, opt, sched, pos, 2)
    result = mgr.save(2)
    assert not result.ok and "No space left" in result.error
    assert storage.fs.helper_writing.is_set() and storage.fs.helper_done.is_set()
    assert not list(tmp_path.glob(".tmp-*"))


def test_no_file_opens_for_writing_once_the_save_failed(tmp_path):
    fs = HashingFileSystem(tmp_path, 3)
    fs.failures.append("__0_0.distcp: No space left on device")
    already = r"__1_0.distcp not written: this save already failed \(__0_0.distcp: No space left on device\)"
    with pytest.raises(OSError, match=already):
        with fs.create_stream(tmp_path / "__1_0.distcp", "wb"):
            pass
    assert not (tmp_path / "__1_0.distcp").exists() and fs.settle(timeout=0)


def test_settle_waits_only_while_a_file_is_open_for_writing(tmp_path):
    fs = HashingFileSystem(tmp_path, 3)
    opened, release = threading.Event(), threading.Event()

    def helper_writes():
        with fs.create_stream(tmp_path / "__0_0.distcp", "wb") as stream:
            stream.write(b"shard")
            opened.set()
            release.wait(5)

    helper = threading.Thread(target=helper_writes)
    helper.start()
    assert opened.wait(5)
    assert fs.settle(timeout=0.05) is False  # a helper still writing: the failed save must not end yet
    threading.Timer(0.1, release.set).start()
    assert fs.settle(timeout=5) is True
    helper.join()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # DCP's writer thread dies
def test_a_checkpoint_whose_dcp_metadata_lacks_items_is_skipped_on_resume(tmp_path, monkeypatch, caplog):
    """What an unchecked writer (DCP's own) commits when a helper thread fails: resume falls back, no KeyError."""
    storage = HelperThreadEIO()
    mgr, model, opt, sched, pos = _setup(tmp_path, storage=storage)
    _train(model, opt, sched, pos, 2)
    mgr.save(2)
    monkeypatch.setattr(HashingWriter, "write_data", dcp.FileSystemWriter.write_data)
    for unchecked in ("_stream_opens", "_stream_closed"):  # files open after a failure, as in DCP's own writer
        monkeypatch.setattr(HashingFileSystem, unchecked, lambda *args: None)
    storage.failing = True
    _train(model, opt, sched, pos, 4)
    assert mgr.save(4).ok and layout.committed_steps(tmp_path) == [2, 4]  # the broken checkpoint is committed
    with caplog.at_level(logging.ERROR, logger="slurm_ft.train.checkpoint"):
        assert _setup(tmp_path)[0].resume() == 2
    assert "step 4 is corrupt" in caplog.text and ".metadata: no stored data for" in caplog.text


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # DCP's writer thread dies
def test_real_enospc_on_tiny_tmpfs(tiny_tmpfs):
    # ~0.3M params: model + 2 AdamW moments ~ 1.3 MB per checkpoint; the second does not fit in 2 MB.
    mgr, model, opt, sched, pos = _setup(tiny_tmpfs, hidden=20000, async_save=True)
    for step in (2, 4):
        _train(model, opt, sched, pos, step)
        mgr.save(step)
        mgr.wait()
    with pytest.raises(CheckpointError, match=r"last checkpoint save \(step 4\) failed"):
        mgr.close()  # the run's last save failed: it must not end as if it had saved
    assert layout.committed_steps(tiny_tmpfs) == [2]
    # torch.save's zip writer reports a full disk as "unexpected pos"; the free-space note makes it clear
    assert mgr.stats["failed"] == 1 and f"(free space in {tiny_tmpfs}: " in mgr.stats["last_error"], mgr.stats
    assert not list(tiny_tmpfs.glob(".tmp-*"))


def test_corrupted_shard_is_named_and_falls_back_to_previous(tmp_path, caplog):
    mgr, model, opt, sched, pos = _setup(tmp_path)
    _train(model, opt, sched, pos, 2)
    mgr.save(2)
    at_two = _params(model)
    _train(model, opt, sched, pos, 4)
    mgr.save(4)
    shard = layout.step_dir(tmp_path, 4) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    mgr2, model2, *_ = _setup(tmp_path)
    with caplog.at_level(logging.ERROR, logger="slurm_ft.train.checkpoint"):
        assert mgr2.resume() == 2
    assert "step 4 is corrupt" in caplog.text and "__0_0.distcp: crc32 mismatch" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(_params(model2), at_two))


def test_all_checkpoints_corrupt_is_an_error_not_a_silent_restart(tmp_path):
    mgr, model, opt, sched, pos = _setup(tmp_path)
    _train(model, opt, sched, pos, 2)
    mgr.save(2)
    (layout.step_dir(tmp_path, 2) / "rank_00000.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="rank_00000.pt"):
        _setup(tmp_path)[0].resume()


def test_resume_hint_and_env(tmp_path, monkeypatch):
    mgr, model, opt, sched, pos = _setup(tmp_path)
    for step in (2, 4, 6):
        _train(model, opt, sched, pos, step)
        mgr.save(step)
    assert _setup(tmp_path)[0].resume(hint_step=4) == 4
    monkeypatch.setenv("SLURM_FT_RESUME_STEP", "2")
    assert _setup(tmp_path)[0].resume() == 2
    monkeypatch.setenv("SLURM_FT_RESUME_STEP", "5")  # not committed: newest
    assert _setup(tmp_path)[0].resume() == 6
    assert _setup(tmp_path / str(uuid.uuid4()))[0].resume() == 0


def test_emergency_signal_saves_synchronously_and_requests_exit(tmp_path):
    mgr, model, opt, sched, pos = _setup(tmp_path, async_save=True)
    old = signal.getsignal(signal.SIGUSR1)
    try:
        mgr.install_signal_handlers(signals=(signal.SIGUSR1,))
        _train(model, opt, sched, pos, 1)
        assert not mgr.maybe_save(1) and not mgr.exit_requested
        os.kill(os.getpid(), signal.SIGUSR1)
        _train(model, opt, sched, pos, 3)
        assert mgr.maybe_save(3) and mgr.exit_requested
        assert layout.committed_steps(tmp_path) == [3] and mgr.results[-1].emergency
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_sigusr1_to_example_trainer_saves_and_exits_cleanly(tmp_path):
    import json
    import sys
    import time
    cmd = [sys.executable, "-m", "slurm_ft.train.example", "--steps", "1000", "--ckpt-every", "500",
           "--step-time", "0.05", "--hidden", "8", "--ckpt-dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    beat = tmp_path / ".slurm-ft" / "heartbeat.rank0.json"
    deadline = time.monotonic() + 60
    while not beat.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["emergency"] and 0 < result["step"] < 1000
    assert layout.committed_steps(tmp_path) == [result["step"]]


def test_manifest_digests_taken_while_writing_match_the_files(tmp_path):
    mgr, model, opt, sched, pos = _setup(tmp_path, async_save=True)
    _train(model, opt, sched, pos, 2)
    result = mgr.save(2)
    mgr.close()
    manifest = layout.read_manifest(layout.step_dir(tmp_path, 2))
    assert {".metadata", "rank_00000.pt"} <= set(manifest.files)
    assert any(name.endswith(".distcp") for name in manifest.files)
    assert set(manifest.files) == set(layout.scan_files(layout.step_dir(tmp_path, 2)))
    assert layout.verify_files(manifest) == []  # the CRC-32 recomputed from disk equals the one taken on the fly
    assert result.ok and result.bytes_written == sum(e.size for e in manifest.files.values())


def _zip_record_crcs(data: bytes) -> list[int]:
    """The CRC-32 of every record in the zip central directories in ``data`` (a .distcp holds one zip per
    tensor; torch's writer leaves the local headers' CRC at 0 and fills in the directory's)."""
    crcs, at = [], data.find(b"PK\x01\x02")
    while at >= 0:
        crcs.append(int.from_bytes(data[at + 16:at + 20], "little"))
        at = data.find(b"PK\x01\x02", at + 4)
    return crcs


def test_shards_skip_torch_saves_own_zip_crc_and_still_load(tmp_path):
    mgr, model, opt, sched, pos = _setup(tmp_path, hidden=64, async_save=True)
    _train(model, opt, sched, pos, 2)
    result = mgr.save(2)
    mgr.close()
    assert result.ok
    shards = list(layout.step_dir(tmp_path, 2).glob("*.distcp"))
    crcs = [crc for shard in shards for crc in _zip_record_crcs(shard.read_bytes())]
    assert crcs and set(crcs) == {0}  # torch.save computed no CRC that torch.load would never check
    assert torch.utils.serialization.config.save.compute_crc32 is True  # only DCP's writer threads skip it
    saved = _params(model)
    _train(model, opt, sched, pos, 3)
    mgr2, model2, *_ = _setup(tmp_path, hidden=64)
    assert mgr2.resume() == 2
    assert all(torch.equal(a, b) for a, b in zip(_params(model2), saved))


def test_verify_off_checks_sizes_only(tmp_path):
    mgr, model, opt, sched, pos = _setup(tmp_path)
    _train(model, opt, sched, pos, 2)
    mgr.save(2)
    shard = next(layout.step_dir(tmp_path, 2).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, different content (a zip trailer byte DCP does not read)
    shard.write_bytes(bytes(data))
    manifest = layout.read_manifest(layout.step_dir(tmp_path, 2))
    assert layout.verify_files(manifest, checksums=False) == []
    assert "crc32 mismatch" in layout.verify_files(manifest)[0]


class SlowDisk(FileStorage):
    def write_file(self, path, data):
        import time
        time.sleep(30)


EMERGENCY_SCRIPT = """
import os, signal, sys, time, torch
from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointManager
sys.path.insert(0, sys.argv[2])
from test_checkpoint_faults import SlowDisk
model = torch.nn.Linear(2, 2)
cfg = CheckpointConfig(dir=sys.argv[1], every=1000, emergency_deadline_s=1.0)
mgr = CheckpointManager(cfg, model=model, storage=SlowDisk())
mgr.install_signal_handlers()
print("signalled at", time.monotonic(), file=sys.stderr, flush=True)
os.kill(os.getpid(), signal.SIGUSR1)
mgr.maybe_save(7)  # returns at the deadline with the save still running
time.sleep(60)  # the watchdog ends the process first
"""


def test_emergency_save_past_its_deadline_ends_the_process(tmp_path):
    import re
    import sys
    import time
    proc = subprocess.run([sys.executable, "-c", EMERGENCY_SCRIPT, str(tmp_path), os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=90)
    ended = time.monotonic()
    assert proc.returncode == 128 + signal.SIGUSR1, proc.stderr[-2000:]
    signalled = float(re.search(r"signalled at (\S+)", proc.stderr).group(1))  # after the imports: a busy host's
    assert ended - signalled < 20  # torch import is not the watchdog's doing; the script's own sleep is 60 s
    assert "emergency save not finished 1.0s after signal" in proc.stderr
    assert layout.committed_steps(tmp_path) == []
