"""`linstream embed` runs the job in a thread of its own (so that Ctrl-C stops it cleanly); Beam's
runners that start their own job server (PrismRunner, FlinkRunner, SparkRunner) install a SIGINT
handler from that thread, which Python refuses outside the main thread.  The job must run."""

from __future__ import annotations

import signal

from linstream.pipeline.app.stopping import run_stoppable


def test_a_runner_may_set_a_signal_handler_from_the_job_thread() -> None:
    def starts_a_job_server() -> str:
        # What apache_beam.runners.portability.job_server.StopOnExitJobServer.start does.
        signal.signal(signal.SIGINT, lambda *_: None)
        return "ran"

    before = signal.getsignal(signal.SIGINT)
    assert run_stoppable(starts_a_job_server) == "ran"
    assert signal.getsignal(signal.SIGINT) is before  # the main thread's handler stays
    assert signal.signal is not None and signal.signal.__module__ == "signal"  # restored
