"""A checkpoint file's disk write starts while it is still being written (sync_file_range), on a real file."""

from __future__ import annotations

import errno
import os

from slurm_ft.core import layout
from slurm_ft.train.storage import START_WRITEBACK, WRITEBACK_BYTES, _HashingStream

MIB = 1 << 20


def _digest(data: bytes) -> str:
    digest = layout.new_digest()
    digest.update(data)
    return digest.hexdigest()


def test_the_disk_write_starts_every_writeback_bytes_and_the_digest_is_the_whole_files(tmp_path):
    started = []
    data = os.urandom(20 * MIB + 3) + os.urandom(5 * MIB)
    with open(tmp_path / "shard", "wb") as raw:
        stream = _HashingStream(raw, start_writeback=lambda fd: started.append(raw.tell()))
        assert stream.write(data[:20 * MIB + 3]) == 20 * MIB + 3
        for offset in range(20 * MIB + 3, len(data), MIB):
            stream.write(data[offset:offset + MIB])
    assert WRITEBACK_BYTES == 8 * MIB and started == [8 * MIB, 16 * MIB, 24 * MIB + 3]
    assert stream.size == len(data) and stream.digest.hexdigest() == _digest(data)
    assert (tmp_path / "shard").read_bytes() == data


def test_a_filesystem_without_writeback_is_left_to_the_closing_fsync(tmp_path):
    calls = []

    def refused(fd):
        calls.append(fd)
        raise OSError(errno.EINVAL, "sync_file_range")

    data = os.urandom(30 * MIB)
    with open(tmp_path / "shard", "wb") as raw:
        stream = _HashingStream(raw, start_writeback=refused)
        stream.write(data)
    assert len(calls) == 1  # asked once, then no more
    assert (tmp_path / "shard").read_bytes() == data and stream.digest.hexdigest() == _digest(data)


def test_linux_writeback_on_a_real_file(tmp_path):
    assert START_WRITEBACK is not None
    data = os.urandom(17 * MIB)
    with open(tmp_path / "shard", "wb") as raw:
        stream = _HashingStream(raw)
        stream.write(data)
        raw.flush()
        os.fsync(raw.fileno())
    assert stream._start_writeback is START_WRITEBACK  # not refused on this filesystem
    assert (tmp_path / "shard").read_bytes() == data
