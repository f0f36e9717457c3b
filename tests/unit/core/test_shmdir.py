"""The job's /dev/shm directory: names, private creation, and removal that follows no symlink and touches only the
job user's directory (another uid's directory is refused both ways)."""

from __future__ import annotations

import os
import stat

import pytest

from slurm_ft.core import shmdir


def test_names_stay_inside_the_root_and_do_not_collide():
    assert shmdir.dir_name("1234") == "slurm-ft-1234"
    odd = shmdir.dir_name("../../etc")
    assert "/" not in odd and odd.startswith("slurm-ft-") and odd != shmdir.dir_name("__.._etc")
    assert shmdir.dir_name("..") != "slurm-ft-.."
    assert shmdir.job_key("77", "run") == "77" and shmdir.job_key(None, "run") == "run"
    assert shmdir.job_key("", None) is None
    with pytest.raises(ValueError, match="got ''"):
        shmdir.dir_name("")


def test_open_creates_a_private_dir_and_refuses_symlinks_and_open_modes(tmp_path):
    path = shmdir.open_job_dir(tmp_path, "42")
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700
    assert shmdir.open_job_dir(tmp_path, "42") == path
    os.symlink(tmp_path / "elsewhere", tmp_path / "slurm-ft-43")
    with pytest.raises(OSError, match="is a symlink"):
        shmdir.open_job_dir(tmp_path, "43")
    os.mkdir(tmp_path / "slurm-ft-44", 0o700)
    os.chmod(tmp_path / "slurm-ft-44", 0o777)
    with pytest.raises(OSError, match="not private"):
        shmdir.open_job_dir(tmp_path, "44")


def test_remove_never_follows_a_symlink(tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "file").write_text("keep")
    os.symlink(target, tmp_path / "slurm-ft-9")
    assert shmdir.remove_job_dir(tmp_path, "9", os.getuid()).startswith("left")
    assert (target / "file").read_text() == "keep"
    job = shmdir.open_job_dir(tmp_path, "10")
    os.symlink(target, job / "link")  # a symlink inside: unlinked, not followed
    assert shmdir.remove_job_dir(tmp_path, "10", os.getuid()).startswith("removed")
    assert not job.exists() and (target / "file").read_text() == "keep"
    assert shmdir.remove_job_dir(tmp_path, "10", os.getuid()).startswith("absent")


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to own a dir as another uid")
def test_another_uid_s_dir_is_neither_opened_nor_removed(tmp_path):
    other = 65534  # nobody
    os.chmod(tmp_path, 0o1777)
    os.mkdir(tmp_path / "slurm-ft-5", 0o700)
    os.chown(tmp_path / "slurm-ft-5", other, other)
    with pytest.raises(OSError, match=f"owned by uid {other}"):
        shmdir.open_job_dir(tmp_path, "5")
    assert "owned by uid" in shmdir.remove_job_dir(tmp_path, "5", 1000)  # root for job uid 1000: not its dir
    assert (tmp_path / "slurm-ft-5").is_dir()
    assert shmdir.remove_job_dir(tmp_path, "5", other).startswith("removed")
