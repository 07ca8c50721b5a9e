"""The private names of Ray and Python the pipeline uses (pipeline/common/compat.py) still exist, in the Ray they
were checked with: an upgrade fails here first, not silently in the output or the exit of every command."""

import importlib.util
import logging

import ray

from pipeline.common import compat


def test_compat_ray_is_the_version_its_private_names_were_checked_with():
    assert ray.__version__ == compat.CHECKED_RAY, (
        f"Ray {ray.__version__} is installed, pipeline/common/compat.py was checked with {compat.CHECKED_RAY}: "
        "check each of its names against this Ray, then move CHECKED_RAY on")


def test_compat_private_names_resolve():
    for name in (*compat.RAY_NOTICE_LOGGERS, *compat.RAY_UPLOAD_LOGGERS):  # loggers named after their modules
        assert importlib.util.find_spec(name) is not None, f"{name} is gone: its logger no longer quiets anything"
    found = compat.worker_output_dispatcher()
    assert found is not None, "Ray's worker output dispatcher moved: worker lines are no longer tidied"
    dispatcher, lock = found
    assert hasattr(dispatcher, "handlers") and hasattr(lock, "acquire")
    assert compat.ray_train_report_logger().endswith("context.py")
    assert compat.interpreter_exit_steps() is not None, "CPython's exit steps moved: nmt exits the slow way"


def test_compat_train_report_logger_is_the_one_ray_train_logs_reports_with():
    from ray.train.v2._internal.execution import context

    assert logging.getLogger(compat.ray_train_report_logger()) is logging.getLogger(context.__file__)
