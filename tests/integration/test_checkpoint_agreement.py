"""The agreement on emergency signals and the auto interval is off the critical path: a rank's ``maybe_save``
does not wait for its peers' in the same step, agreements are spaced ``agree_every_s`` apart, and every rank
still acts on the same flags at the same step. Two real processes over gloo."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from slurm_ft.train.checkpoint import CheckpointConfig, CheckpointManager

pytestmark = pytest.mark.gloo


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank(rank: int, port: int, ckpt: str, rank0_done, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mgr = CheckpointManager(CheckpointConfig(dir=ckpt, every=1000, async_save=False, agree_every_s=0),
                            model=nn.Linear(2, 2))
    mgr.install_signal_handlers(signals=(signal.SIGUSR1,))
    if rank == 0:
        mgr.maybe_save(1)  # blocked here until rank 1 joined when the agreement waited in the same step
        rank0_done.set()
    else:
        assert rank0_done.wait(60), "rank 0's maybe_save(1) waited for rank 1"
        os.kill(os.getpid(), signal.SIGUSR1)  # rank 1 alone gets the signal, during step 1
        mgr.maybe_save(1)
    saved_at = None
    for step in (2, 3):
        if mgr.maybe_save(step):
            saved_at = step
            break
    out.put((rank, saved_at, mgr.exit_requested))
    mgr.close()
    dist.destroy_process_group()


def _two_ranks(ctx, target, *extra) -> list:
    """Run ``target(rank, port, ckpt, *extra, out)`` as ranks 0 and 1 in a fresh checkpoint dir; what each
    put on ``out``, sorted (by rank first)."""
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as ckpt:
        port = _free_port()
        procs = [ctx.Process(target=target, args=(r, port, ckpt, *extra, out)) for r in range(2)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(120)
        assert [p.exitcode for p in procs] == [0, 0]
        return sorted(out.get(timeout=5) for _ in procs)


def test_a_rank_does_not_wait_for_its_peers_agreement_and_all_act_on_it_at_the_same_step():
    ctx = mp.get_context("spawn")
    results = _two_ranks(ctx, _rank, ctx.Event())
    assert results == [(0, 2, True), (1, 2, True)]  # rank 1's signal in step 1: both save at step 2, then stop


SIGNAL_AT, STEP_S, AGREE_EVERY_S = 40, 0.01, 0.3


def _spaced_rank(rank: int, port: int, ckpt: str, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mgr = CheckpointManager(CheckpointConfig(dir=ckpt, every=1000, agree_every_s=AGREE_EVERY_S),
                            model=nn.Linear(2, 2))
    mgr.install_signal_handlers(signals=(signal.SIGUSR1,))
    saved_at = None
    for step in range(1, 400):
        time.sleep(STEP_S * (1 + rank))  # rank 1 is slower: rank 0's step time must not matter
        if rank == 1 and step == SIGNAL_AT:
            os.kill(os.getpid(), signal.SIGUSR1)
        if mgr.maybe_save(step):
            saved_at = step
            break
    out.put((rank, saved_at, mgr.exit_requested, mgr.agreements))
    mgr.close()
    dist.destroy_process_group()


def test_agreements_are_spaced_and_every_rank_acts_on_a_signal_at_the_same_step():
    results = _two_ranks(mp.get_context("spawn"), _spaced_rank)
    (_, saved0, exit0, agreements0), (_, saved1, exit1, agreements1) = results
    assert saved0 == saved1 and exit0 and exit1  # the same step on both ranks
    # steps take about 20 ms (rank 1's pace): an agreement every 0.3 s is every ~15 steps, so the signal is
    # acted on within about 16 steps, and far fewer agreements than steps were started
    assert SIGNAL_AT < saved0 <= SIGNAL_AT + 2 * AGREE_EVERY_S / (2 * STEP_S) + 2, saved0
    assert agreements0 == agreements1 and agreements0 <= saved0 / 4, (agreements0, saved0)
