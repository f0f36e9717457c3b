"""Staging copies for async saves: independent of the live tensors, buffers reused between saves."""

import torch

from slurm_ft.train.staging import Stager


def test_stage_copies_and_reuses_buffers():
    live = {"w": torch.arange(6.0).reshape(2, 3), "opt": {"step": torch.tensor(3.0), "lr": 0.1},
            "t": torch.arange(6.0).reshape(3, 2).t(), "ids": [torch.ones(2), 5]}
    stager = Stager(reuse_buffers=True)
    first = stager.stage(live)
    assert first["w"].equal(live["w"]) and first["t"].equal(live["t"]) and first["opt"]["lr"] == 0.1
    assert first["ids"][1] == 5 and first["w"].data_ptr() != live["w"].data_ptr()
    live["w"].add_(1)
    assert not first["w"].equal(live["w"])  # a copy, not a view
    second = stager.stage(live)
    assert second["w"].data_ptr() == first["w"].data_ptr() and second["w"].equal(live["w"])
    assert stager.cached_bytes == sum(t.numel() * 4 for t in (live["w"], live["opt"]["step"], live["t"],
                                                              live["ids"][0]))


def test_stage_reallocates_on_shape_change_and_can_skip_caching():
    stager = Stager(reuse_buffers=False)
    a = stager.stage({"w": torch.zeros(2)})
    b = stager.stage({"w": torch.zeros(3)})
    assert b["w"].shape == (3,) and stager.cached_bytes == 0 and a["w"].shape == (2,)


def test_the_cpu_path_makes_no_cuda_call(monkeypatch):
    """CPU tensors take the plain memcpy: no side stream, no stream wait, no synchronize, no pinned buffer."""
    def cuda(*args, **kwargs):
        raise AssertionError("a CUDA call on the CPU path")

    for name in ("Stream", "current_stream", "synchronize", "stream"):
        monkeypatch.setattr(torch.cuda, name, cuda)
    stager = Stager(reuse_buffers=True, pin_memory=True)  # pinning is for device tensors only
    live = {"w": torch.arange(4.0), "nested": [torch.ones(3, dtype=torch.int64)]}
    staged = stager.stage(live)
    again = stager.stage(live)
    assert staged["w"].equal(live["w"]) and not staged["w"].is_pinned()
    assert again["w"].data_ptr() == staged["w"].data_ptr() and again["nested"][0].equal(live["nested"][0])
