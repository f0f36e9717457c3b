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
