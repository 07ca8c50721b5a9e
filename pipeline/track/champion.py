"""The champion alias: which model version translate, evaluate and serve load, decided one process at a time.

A new version becomes champion only if its val_bleu beats the champion's. Sweeps and training runs on a
shared server finish together, so the read-compare-move runs under a lock the registry itself holds
(a claim tag on the registered model), and each version records the decision taken on it: a version
that has none (its process died between registering and deciding) is decided by the next registration
or `nmt promote`.
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..common import log
from ..common.errors import UserError
from .login import redact
from .target import mlflow_client
from .tracking import error_line

CHAMPION = "champion"
DECISION_TAG = "champion_decision"  # on each version: "champion", "kept version N" or "promoted by hand"
LOCK_TAG = "champion_lock"  # on the registered model: "<token> <unix time>" of the process deciding now
LOCK_SETTLE_S = 1.0  # a claim holds once it stood this long: far longer than one registry call takes
LOCK_STALE_S = 60.0  # a claim this old was left by a process that died holding it
logger = log.get("registry")


def _client(uri: str):
    return mlflow_client(uri)


def champion_bleu(uri: str, name: str) -> tuple[str, float] | None:
    """(version, val_bleu) of the current champion; None only when there is none, any other failure raised."""
    client = _client(uri)
    try:
        model = _registered_model(client, uri, name)
    except MissingModel:
        return None
    version = model.aliases.get(CHAMPION)
    if version is None:
        return None
    tags = client.get_model_version(name, version).tags
    return str(version), _bleu(tags, name, version)


class MissingModel(UserError):
    """The registered model does not exist."""


def _registered_model(client, uri: str, name: str):
    """The registered model; MissingModel when there is none, any other failure a UserError saying so."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_registered_model(name)
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise MissingModel(f"there is no registered model {name!r} in {redact(uri)}") from None
        raise UserError(f"cannot read registered model {name!r} from {redact(uri)}: {error_line(err)}") from None


def _bleu(tags: dict[str, str], name: str, version: Any) -> float:
    try:
        return float(tags.get("val_bleu", "-inf"))
    except ValueError:
        raise UserError(f"{name} version {version} has val_bleu tag {tags['val_bleu']!r}, not a number; fix it "
                        f"in the MLflow UI or move the champion with `nmt promote`") from None


@contextlib.contextmanager
def decision_lock(uri: str, name: str, timeout_s: float = 180.0) -> Iterator[None]:
    """Hold the registered model's champion lock: a claim tag that stood LOCK_SETTLE_S unchanged.

    A lease, not consensus: two processes could both hold it only if one took longer than
    LOCK_SETTLE_S between reading the tag free and writing its claim.
    """
    client, token = _client(uri), uuid.uuid4().hex
    deadline = time.monotonic() + timeout_s
    while True:
        holder = _registered_model(client, uri, name).tags.get(LOCK_TAG, "")
        if _is_free(holder):
            client.set_registered_model_tag(name, LOCK_TAG, f"{token} {time.time():.3f}")
            time.sleep(LOCK_SETTLE_S)
            if client.get_registered_model(name).tags.get(LOCK_TAG, "").startswith(token):
                break
        if time.monotonic() > deadline:
            raise UserError(f"another process has held the champion lock of {name!r} for {timeout_s:.0f}s "
                            f"(tag {LOCK_TAG}={holder!r}); retry, or delete the tag if that process is gone")
        time.sleep(random.uniform(0.2, 1.0))  # apart, so that two waiters do not claim in step again
    try:
        yield
    finally:
        with contextlib.suppress(Exception):  # a lock left behind goes stale; the decision stands
            if client.get_registered_model(name).tags.get(LOCK_TAG, "").startswith(token):
                client.delete_registered_model_tag(name, LOCK_TAG)


def _is_free(holder: str) -> bool:
    _, _, since = holder.partition(" ")
    try:
        return not holder or time.time() - float(since) > LOCK_STALE_S
    except ValueError:
        return True  # not a claim this code wrote


@dataclass
class Decision:
    """The champion after a decision, and the one before it (None: there was none)."""

    version: str | None
    val_bleu: float | None
    previous: tuple[str, float] | None


def decide(uri: str, name: str) -> Decision:
    """Under the lock: the best undecided version becomes champion if it beats the champion; each gets its decision."""
    client = _client(uri)
    with decision_lock(uri, name):
        current = champion_bleu(uri, name)
        pending = [v for v in client.search_model_versions(f"name = '{name}'") if DECISION_TAG not in v.tags]
        pending.sort(key=lambda v: (_bleu(v.tags, name, v.version), -int(v.version)), reverse=True)
        best = pending[0] if pending else None
        if best is not None and (current is None or _bleu(best.tags, name, best.version) > current[1]):
            client.set_registered_model_alias(name, CHAMPION, best.version)
            winner = (str(best.version), _bleu(best.tags, name, best.version))
        else:
            winner = current
        for version in pending:
            verdict = CHAMPION if winner and str(version.version) == winner[0] else f"kept version {winner[0]}"
            client.set_model_version_tag(name, version.version, DECISION_TAG, verdict)
    return Decision(*(winner or (None, None)), current)


def promote(uri: str, name: str, version: str) -> None:
    """Move the champion alias to a version by hand (`nmt promote VERSION`), under the lock."""
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    try:
        client.get_model_version(name, str(version))
    except MlflowException:
        raise UserError(f"registered model {name!r} has no version {version} in {redact(uri)}; "
                        f"list versions in the MLflow UI or with `mlflow models`") from None
    with decision_lock(uri, name):
        client.set_registered_model_alias(name, CHAMPION, str(version))
        client.set_model_version_tag(name, str(version), DECISION_TAG, "promoted by hand")
