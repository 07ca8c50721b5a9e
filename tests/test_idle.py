"""The background lane's idle priority (tests/idle.py), in a process of its own: the class cannot be undone."""

import subprocess
import sys

from conftest import ROOT

# A thread that ends between the listing of /proc/self/task and its own change: a clean clone's Multi30k
# job failed on it (ProcessLookupError) right after ray.shutdown(), whose threads were still ending.
ENDED_THREAD = """
import os, sys, threading
sys.path.insert(0, sys.argv[1])
from idle import lower_to_idle

ended = threading.Thread(target=lambda: None)
ended.start()
ended.join()
listdir = os.listdir
os.listdir = lambda path: [*listdir(path), str(ended.native_id)] if path == "/proc/self/task" else listdir(path)
worker = threading.Thread(target=threading.Event().wait, args=(30,), daemon=True)
worker.start()
lower_to_idle()
print(os.sched_getscheduler(0) == os.SCHED_IDLE, os.sched_getscheduler(worker.native_id) == os.SCHED_IDLE)
"""


def test_every_live_thread_goes_idle_and_one_that_ended_meanwhile_is_skipped():
    done = subprocess.run([sys.executable, "-c", ENDED_THREAD, str(ROOT / "tests")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"], done.stdout + done.stderr
