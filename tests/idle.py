"""Idle priority for the background lane's idle jobs (tests/lane.py): once set up, such a job runs only on the
cycles that nothing else on the machine wants.

    python tests/idle.py COMMAND [ARG...]    # COMMAND at idle priority: the part of an idle job after its set-up

Two settings are needed on a kernel with autogroups (`sched_autogroup_enabled`), which shares the cores
between sessions first: every lane job and every command the tests start has a session of its own, and a
job with only idle-class threads competed as an equal (a 2-thread torch loop in another session ran 10x
slower beside it). So the job's session, when the job leads it, gets the weight of nice 19, and its threads
the idle scheduling class, which the commands it starts inherit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def lower_to_idle() -> None:
    """From now on this process, and every process or thread it starts, yields the cores to everything else."""
    if os.getsid(0) == os.getpid():  # only a session of its own (the lane's), never the caller's shell
        try:
            Path("/proc/self/autogroup").write_text("19")
        except OSError:  # no autogroups (a kernel without them, or turned off): the idle class is enough
            pass
    for thread in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(thread), os.SCHED_IDLE, os.sched_param(0))
        except ProcessLookupError:  # the thread ended since the listing (a library's, after ray.shutdown())
            pass


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python tests/idle.py COMMAND [ARG...]")
    lower_to_idle()
    os.execvp(sys.argv[1], sys.argv[1:])  # the same process: its session and its scheduling class stay
