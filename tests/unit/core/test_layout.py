"""Checkpoint layout: commit protocol, manifest verification, retention (torch-free, real temp dirs)."""

import json

import pytest

from slurm_ft.core import layout


def _publish(root, step, payload=b"data", run_id=None):
    tmp = root / layout.tmp_dir_name(step, "ab12")
    tmp.mkdir(parents=True)
    (tmp / "__0_0.distcp").write_bytes(payload)
    manifest = layout.Manifest(step=step, world_size=2, files=layout.scan_files(tmp), rank_hosts=["a", "b"],
                               run_id=run_id)
    layout.commit(tmp, layout.step_dir(root, step), manifest)
    return layout.step_dir(root, step)


def test_commit_publishes_marker_with_manifest(tmp_path):
    path = _publish(tmp_path, 7)
    assert path.name == "step_00000007"
    assert layout.committed_steps(tmp_path) == [7]
    manifest = layout.read_manifest(path)
    assert manifest.step == 7 and manifest.world_size == 2 and manifest.rank_hosts == ["a", "b"]
    assert set(manifest.files) == {"__0_0.distcp"}
    assert json.loads((path / layout.MARKER).read_text())["files"]["__0_0.distcp"]["size"] == 4
    assert layout.verify_files(manifest) == []
    assert not list(tmp_path.glob(".tmp-*"))


def test_uncommitted_and_temp_dirs_are_not_checkpoints(tmp_path):
    _publish(tmp_path, 1)
    (tmp_path / "step_00000002").mkdir()            # crash between rename and marker
    (tmp_path / ".tmp-step_00000003-ff").mkdir()    # crash mid-save
    assert layout.committed_steps(tmp_path) == [1]
    assert layout.latest_committed(tmp_path).step == 1
    with pytest.raises(layout.ManifestError, match="no commit marker"):
        layout.read_manifest(tmp_path / "step_00000002")


def test_corruption_is_named(tmp_path):
    path = _publish(tmp_path, 5)
    shard = path / "__0_0.distcp"
    shard.write_bytes(b"dat!")
    problems = layout.verify_files(layout.read_manifest(path))
    assert len(problems) == 1 and "__0_0.distcp" in problems[0] and "crc32 mismatch" in problems[0]
    shard.write_bytes(b"longer")
    assert "size 6 != manifest 4" in layout.verify_files(layout.read_manifest(path))[0]


def test_new_manifests_record_crc32_and_ones_written_with_sha256_still_verify(tmp_path):
    import hashlib
    import zlib

    path = _publish(tmp_path, 6)
    entry = json.loads((path / layout.MARKER).read_text())["files"]["__0_0.distcp"]
    assert entry == {"size": 4, "crc32": f"{zlib.crc32(b'data'):08x}"}
    marker = json.loads((path / layout.MARKER).read_text())  # as a manifest before CRC-32 wrote it
    marker["files"]["__0_0.distcp"] = {"size": 4, "sha256": hashlib.sha256(b"data").hexdigest()}
    (path / layout.MARKER).write_text(json.dumps(marker))
    manifest = layout.read_manifest(path)
    assert manifest.files["__0_0.distcp"].algorithm == "sha256" and layout.verify_files(manifest) == []
    (path / "__0_0.distcp").write_bytes(b"dat!")
    assert "sha256 mismatch" in layout.verify_files(layout.read_manifest(path))[0]
    marker["files"]["__0_0.distcp"] = {"size": 4, "md5": "00"}
    (path / layout.MARKER).write_text(json.dumps(marker))
    with pytest.raises(layout.ManifestError, match="malformed manifest.*crc32 or sha256"):
        layout.read_manifest(path)


def test_running_crc32_equals_the_one_shot_crc_and_unknown_algorithms_are_refused():
    import zlib

    digest = layout.new_digest()
    for part in (b"abc", memoryview(b"defg"), b""):
        digest.update(part)
    assert digest.hexdigest() == f"{zlib.crc32(b'abcdefg'):08x}" == layout.digest_bytes(b"abcdefg")
    with pytest.raises(ValueError, match="got 'md5'"):
        layout.new_digest("md5")


def test_malformed_marker_is_an_error(tmp_path):
    path = _publish(tmp_path, 4)
    (path / layout.MARKER).write_text("{not json")
    with pytest.raises(layout.ManifestError, match="not valid JSON"):
        layout.read_manifest(path)
    assert layout.latest_committed(tmp_path) is None


def test_retention_keeps_last_and_every(tmp_path):
    for step in (10, 20, 30, 40, 50):
        _publish(tmp_path, step)
    (tmp_path / ".tmp-step_00000060-aa").mkdir()
    (tmp_path / ".tmp-step_00000070-bb").mkdir()
    removed = layout.apply_retention(tmp_path, keep_last=2, keep_every=20, active_tmp=".tmp-step_00000070-bb")
    assert layout.committed_steps(tmp_path) == [20, 40, 50]
    assert sorted(removed) == [".tmp-step_00000060-aa", "step_00000010", "step_00000030"]
    assert (tmp_path / ".tmp-step_00000070-bb").is_dir()


def test_retained_is_pure():
    assert layout.retained([1, 2, 3, 4], keep_last=1, keep_every=0) == {4}
    assert layout.retained([5, 10, 15], keep_last=0, keep_every=10) == {10}


def test_tmp_token_must_be_hex():
    with pytest.raises(ValueError, match="token"):
        layout.tmp_dir_name(1, "../x")


def test_recommit_same_step_replaces_previous_tree(tmp_path):
    _publish(tmp_path, 3, b"old!")
    (tmp_path / ".tmp-step_00000003-ab12").mkdir()
    tmp = tmp_path / ".tmp-step_00000003-ab12"
    (tmp / "__0_0.distcp").write_bytes(b"new!")
    layout.commit(tmp, layout.step_dir(tmp_path, 3),
                  layout.Manifest(step=3, world_size=1, files=layout.scan_files(tmp)))
    assert (layout.step_dir(tmp_path, 3) / "__0_0.distcp").read_bytes() == b"new!"
    assert layout.verify_files(layout.read_manifest(layout.step_dir(tmp_path, 3))) == []
    assert not list(tmp_path.glob(".tmp-*"))


def test_retention_leaves_later_saves_temp_dirs_alone(tmp_path):
    _publish(tmp_path, 10)
    for name in (".tmp-step_00000010-aa", ".tmp-step_00000009-bb", ".tmp-step_00000020-cc"):
        (tmp_path / name).mkdir()
    removed = layout.apply_retention(tmp_path, keep_last=1, keep_every=0, tmp_up_to=10)
    assert sorted(removed) == [".tmp-step_00000009-bb", ".tmp-step_00000010-aa"]
    assert (tmp_path / ".tmp-step_00000020-cc").is_dir()  # the next save, maybe being written by other ranks


def test_manifest_carries_the_run_identity_and_an_old_one_without_it_is_unowned(tmp_path):
    path = _publish(tmp_path, 3, run_id="job-7")
    assert json.loads((path / layout.MARKER).read_text())["run_id"] == "job-7"
    assert layout.read_manifest(path).run_id == "job-7"
    old = _publish(tmp_path, 4)
    assert "run_id" not in json.loads((old / layout.MARKER).read_text())  # what every manifest looked like before
    assert layout.read_manifest(old).run_id is None
    data = json.loads((path / layout.MARKER).read_text())
    (path / layout.MARKER).write_text(json.dumps({**data, "run_id": 7}))
    with pytest.raises(layout.ManifestError, match="run_id"):
        layout.read_manifest(path)


def test_the_owner_file_else_the_newest_manifest_owns_the_dir(tmp_path):
    assert layout.dir_owner(tmp_path) is None
    _publish(tmp_path, 1)
    assert layout.dir_owner(tmp_path) is None  # unowned: written before run identity
    _publish(tmp_path, 2, run_id="a")
    assert layout.dir_owner(tmp_path) == "a"
    layout.write_owner(tmp_path, "b")
    assert (layout.read_owner(tmp_path), layout.dir_owner(tmp_path)) == ("b", "b")
    assert not list(tmp_path.glob(".OWNER*"))
    (tmp_path / layout.OWNER).write_text("[]")
    with pytest.raises(layout.ManifestError, match="OWNER: malformed owner file"):
        layout.dir_owner(tmp_path)


def test_retention_never_deletes_a_step_dir_another_run_wrote(tmp_path):
    for step, run in ((10, "other"), (20, None), (30, "me"), (40, "me"), (50, "me")):
        _publish(tmp_path, step, run_id=run)
    staged = tmp_path / ".tmp-step_00000005-cc"  # another run's save about to publish
    staged.mkdir()
    (staged / ".COMMITTED.tmp").write_text(json.dumps({"run_id": "other"}))
    removed = layout.apply_retention(tmp_path, keep_last=2, keep_every=0, tmp_up_to=50, run_id="me")
    assert sorted(removed) == ["step_00000020", "step_00000030"]  # the unowned one is this run's to remove
    assert layout.committed_steps(tmp_path) == [10, 40, 50] and staged.is_dir()
    assert layout.apply_retention(tmp_path, keep_last=1, keep_every=0) == []  # no identity: every owned dir is another's
