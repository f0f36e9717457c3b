"""Error files judged the way the monitor needs: a user's own exception class is user code, and it is the cause."""

from slurm_ft.classify import classify
from slurm_ft.classify.records import Evidence, JobEnd
from slurm_ft.core.rundir import ErrorRecord
from slurm_ft.core.taxonomy import Action, Category

PEER_CLOSED = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"


def _job(exit_code=1):
    return JobEnd(state="FAILED", reason="NonZeroExitCode", exit_code=exit_code, signal=None, nodes=("n1", "n2"))


def test_unknown_exception_class_in_an_error_file_is_user_code_and_beats_the_peers_network_error():
    errors = (ErrorRecord(rank=1, time=10.0, exc_type="mylib.DataFault", message="bad shard 17", host="n2"),
              ErrorRecord(rank=0, time=11.0, exc_type="RuntimeError", message=PEER_CLOSED, host="n1"))
    verdict = classify(Evidence(job=_job(), errors=errors))
    assert verdict.category is Category.USER_CODE
    assert verdict.action is Action.STOP
    assert verdict.culprit.ranks == (1,)


def test_launcher_giving_up_in_the_allocation_is_requeued():
    verdict = classify(Evidence(job=_job(exit_code=75)))
    assert verdict.action is Action.REQUEUE
    assert verdict.recoverable


# --- a process group built from the rendezvous store's data (security review 2026-12-05, finding 2) ---------
_SITE = "/usr/lib/python3.11/site-packages/torch/distributed"
_INIT_FRAMES = f"""Traceback (most recent call last):
  File "/home/u/train.py", line 41, in main
    dist.init_process_group("gloo")
  File "{_SITE}/c10d_logger.py", line 83, in wrapper
    return func(*args, **kwargs)
  File "{_SITE}/distributed_c10d.py", line 1899, in init_process_group
    default_pg, _ = _new_process_group_helper(
  File "{_SITE}/distributed_c10d.py", line {{line}}, in _new_process_group_helper
    {{call}}
"""
GLOO_ENFORCE = ("[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/address.cc:69] "
                "sizeof(impl_) == bytes.size(). 136 vs 0")
IN_GLOO = _INIT_FRAMES.format(line=2169, call="backend_class = ProcessGroupGloo(")


def _attempt(*errors: ErrorRecord):
    """The launcher's view: the allocation lives, no job state yet."""
    return classify(Evidence(errors=errors, in_allocation=True))


def _pg_error(rank: int, exc_type: str, message: str, frames: str = IN_GLOO) -> ErrorRecord:
    return ErrorRecord(rank=rank, time=10.0 + rank, exc_type=exc_type, message=message, host="n1",
                       traceback=f"{frames}{exc_type}: {message}\n")


def test_a_peer_address_from_the_store_that_does_not_parse_is_recoverable_and_says_it_was_the_store():
    """Another user overwrote the gloo address keys of a restarted attempt (both ranks failed at once): one retry
    with a fresh store, not a stop as user code."""
    verdict = _attempt(_pg_error(0, "RuntimeError", GLOO_ENFORCE), _pg_error(1, "RuntimeError", GLOO_ENFORCE))
    assert (verdict.category, verdict.recoverable, verdict.action) == (
        Category.NETWORK, True, Action.RESTART_IN_PLACE)
    assert "rendezvous store" in verdict.evidence[0] and "fresh store" in verdict.evidence[0]


def test_junk_sizes_from_the_store_inside_process_group_setup_are_recoverable_not_host_oom():
    verdict = _attempt(_pg_error(0, "MemoryError", "std::bad_alloc"), _pg_error(1, "MemoryError", "std::bad_alloc"))
    assert (verdict.category, verdict.recoverable) == (Category.NETWORK, True)
    assert "rendezvous store" in verdict.evidence[0]


def test_the_stores_own_timeout_is_recoverable_and_says_so():
    record = _pg_error(1, "DistStoreError", "wait timeout after 10000ms, keys: /default_pg/0//cpu//0/0")
    verdict = _attempt(record)
    assert (verdict.category, verdict.recoverable) == (Category.NETWORK, True)
    assert "rendezvous store's own error" in verdict.evidence[0]


def test_the_same_words_outside_process_group_setup_keep_their_meaning():
    in_model = _INIT_FRAMES.split("  File \"/usr")[0] + "  File \"/home/u/model.py\", line 9, in forward\n"
    verdict = _attempt(_pg_error(0, "MemoryError", "std::bad_alloc", frames=in_model))
    assert verdict.category is Category.OOM_HOST


def test_a_real_misconfiguration_inside_init_process_group_still_stops():
    message = "Distributed package doesn't have NCCL built in"
    no_nccl = _INIT_FRAMES.format(line=2181, call=f"raise RuntimeError({message!r})")
    verdict = _attempt(_pg_error(0, "RuntimeError", message, frames=no_nccl))
    assert not verdict.recoverable and verdict.action is Action.STOP
    unset = ("Error initializing torch.distributed using env:// rendezvous: environment variable MASTER_ADDR "
             "expected, but not set")
    verdict = _attempt(_pg_error(0, "ValueError", unset, frames=_INIT_FRAMES.split("  File \"/usr")[0]))
    assert not verdict.recoverable and verdict.action is Action.STOP
