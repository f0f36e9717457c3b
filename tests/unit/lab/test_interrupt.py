"""SIGTERM, SIGHUP and SIGINT end a lab run as an exception (its teardown runs), once; real signals to this process."""

from __future__ import annotations

import io
import os
import signal

import pytest

from slurm_ft.lab.interrupt import Interrupted, run_to_the_end, signals_end_the_run, teardown


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_each_signal_raises_once_and_the_teardown_runs_to_its_end(signum):
    before = signal.getsignal(signum)
    done = []
    with pytest.raises(Interrupted) as caught:
        with signals_end_the_run():
            try:
                os.kill(os.getpid(), signum)
                pytest.fail("the signal did not end the run")
            finally:
                os.kill(os.getpid(), signum)  # a second one during the teardown is ignored
                done.append("down")
    assert caught.value.signum == signum and caught.value.exit_code == 128 + signum
    assert isinstance(caught.value, KeyboardInterrupt)  # what pytest and Ctrl-C-aware code stop on
    assert done == ["down"] and signal.getsignal(signum) == before


def test_a_signal_during_a_teardown_waits_for_its_end():
    done = []
    with pytest.raises(Interrupted):
        with signals_end_the_run():
            with teardown():
                os.kill(os.getpid(), signal.SIGTERM)
                done.append("down")
            done.append("after")
    assert done == ["down"]


def test_the_cli_says_which_signal_in_one_line_and_answers_128_plus_it():
    err = io.StringIO()

    def body():
        os.kill(os.getpid(), signal.SIGHUP)
        return 0
    assert run_to_the_end("demo", body, err) == 128 + signal.SIGHUP
    assert err.getvalue() == "slurm-ft: demo ended by SIGHUP\n"
    assert run_to_the_end("demo", lambda: 1, err) == 1
