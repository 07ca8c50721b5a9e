"""The champion alias: which model version translate, evaluate and serve load, decided one process at a time.

A new version becomes champion only if its val_bleu beats the champion's; a val_bleu that is not a
finite number never wins and never blocks. Sweeps and training runs on a shared server finish together,
so the read-compare-move runs under a lease the registry itself holds (a claim tag on the registered
model, renewed while its holder decides), and each version records the decision taken on it: a version
that has none (its process died between registering and deciding), or whose "kept" verdict its own
numbers contradict, is decided by the next registration or `nmt promote`.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import threading
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
LOCK_TAG = "champion_lock"  # on the registered model: "<token> <renewal> <unix time>" of the process deciding now
LOCK_SETTLE_S = 1.0  # a claim holds once it stood this long: far longer than one registry call takes
# A claim that a waiter has seen unchanged this long, on the waiter's own clock, was left by a process that died
# holding it: its holder rewrites it every LOCK_RENEW_S. Nobody compares their clock with the writer's stamp.
LOCK_STALE_S = 60.0
LOCK_RENEW_S = 10.0
KEPT = re.compile(r"kept version (\d+)")
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


class LockLost(UserError):
    """Another process took the champion lock over while this one decided: nothing was moved."""


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
    """A version's val_bleu; NaN (never champion by the rule) when its tag is missing or not a number."""
    try:
        return float(tags.get("val_bleu", "nan"))
    except ValueError:
        logger.warning(f"{name} version {version} has val_bleu tag {tags['val_bleu']!r}, not a number: it is "
                       f"never champion by the val_bleu rule (`nmt promote {version}` moves it by hand)")
        return math.nan


def _score(bleu: float) -> float:
    """What a val_bleu counts for in a comparison: itself when finite, below every finite value otherwise."""
    return bleu if math.isfinite(bleu) else -math.inf


class Lease:
    """The held champion lock: renewed in a thread while the block runs; check() before every registry change."""

    def __init__(self, uri: str, name: str, token: str):
        self.client, self.name, self.token = _client(uri), name, token
        self.renewals, self.lost = 0, False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._renew, daemon=True, name="nmt-champion-lease")

    def claim(self) -> str:
        """The tag value of the current renewal."""
        return f"{self.token} {self.renewals} {time.time():.3f}"

    def holds(self) -> bool:
        """Whether the tag still names this process (read from the registry now)."""
        return self.client.get_registered_model(self.name).tags.get(LOCK_TAG, "").startswith(f"{self.token} ")

    def _renew(self) -> None:
        while not self.stop.wait(LOCK_RENEW_S):
            try:
                if not self.holds():
                    self.lost = True
                    return
                self.renewals += 1
                self.client.set_registered_model_tag(self.name, LOCK_TAG, self.claim())
            except Exception as err:  # a slow or failing server: check() finds out whether the claim survived
                logger.warning(f"renewing the champion lock of {self.name!r} failed ({error_line(err)})")

    def check(self) -> None:
        """Raise LockLost unless this process still holds the lock: the fence before moving anything."""
        if self.lost or not self.holds():
            self.lost = True
            raise LockLost(f"another process took over the champion lock of {self.name!r} while this one decided "
                           f"(it stalled over {LOCK_STALE_S:.0f}s); nothing was moved: `nmt promote` decides again")


@contextlib.contextmanager
def decision_lock(uri: str, name: str, timeout_s: float = 180.0) -> Iterator[Lease]:
    """Hold the registered model's champion lock: a claim tag that stood LOCK_SETTLE_S unchanged, renewed in the
    meantime. A claim is free once this process has seen it unchanged for LOCK_STALE_S, whatever it says.

    A lease, not consensus: a holder that stalls longer than LOCK_STALE_S loses it, and its check() says so.
    """
    client, lease = _client(uri), Lease(uri, name, uuid.uuid4().hex)
    deadline, seen, seen_at = time.monotonic() + timeout_s, None, time.monotonic()
    while True:
        holder = _registered_model(client, uri, name).tags.get(LOCK_TAG, "")
        if holder != seen:  # a new claim or a renewal: its age counts from now, on this clock
            seen, seen_at = holder, time.monotonic()
        if (not holder or time.monotonic() - seen_at >= LOCK_STALE_S) and _claimed(client, name, lease.claim()):
            break
        if time.monotonic() > deadline:
            raise UserError(f"another process has held the champion lock of {name!r} for {timeout_s:.0f}s "
                            f"(tag {LOCK_TAG}={holder!r}); retry, or delete the tag if that process is gone")
        time.sleep(random.uniform(0.2, 1.0))  # apart, so that two waiters do not claim in step again
    lease.thread.start()
    try:
        yield lease
    finally:
        lease.stop.set()
        lease.thread.join(timeout=5)
        with contextlib.suppress(Exception):  # a lock left behind goes stale; the decision stands
            if lease.holds():
                client.delete_registered_model_tag(name, LOCK_TAG)


def _claimed(client, name: str, claim: str) -> bool:
    """Write a claim, and whether it still stands LOCK_SETTLE_S later (another waiter may claim at the same time)."""
    from mlflow.exceptions import MlflowException

    try:
        client.set_registered_model_tag(name, LOCK_TAG, claim)
    except MlflowException as err:  # a store racing two writes of the tag (SQLite's insert-or-update): the other won
        if err.get_http_status_code() == 403:  # this login may not change the model: waiting will not help
            raise
        return False
    time.sleep(LOCK_SETTLE_S)
    return client.get_registered_model(name).tags.get(LOCK_TAG, "") == claim


@dataclass
class Decision:
    """The champion after a decision, and the one before it (None: there was none)."""

    version: str | None
    val_bleu: float  # NaN when there is no champion
    previous: tuple[str, float] | None


def _undecided(version, bleus: dict[str, float]) -> bool:
    """No decision yet, or a "kept version N" that its own numbers contradict (it beats N: a blocker's verdict)."""
    verdict = version.tags.get(DECISION_TAG)
    if verdict is None:
        return True
    kept = KEPT.fullmatch(verdict)
    return bool(kept) and _score(bleus[str(version.version)]) > _score(bleus.get(kept[1], math.nan))


def decide(uri: str, name: str) -> Decision:
    """Under the lock: the best undecided version becomes champion if it beats the champion; each gets its decision."""
    client = _client(uri)
    with decision_lock(uri, name) as lease:
        current = champion_bleu(uri, name)
        versions = client.search_model_versions(f"name = '{name}'")
        bleus = {str(v.version): _bleu(v.tags, name, v.version) for v in versions}
        pending = [v for v in versions if _undecided(v, bleus)]
        finite = [v for v in pending if math.isfinite(bleus[str(v.version)])]
        best = max(finite, key=lambda v: (bleus[str(v.version)], -int(v.version)), default=None)
        winner = current
        if best is not None and (current is None or bleus[str(best.version)] > _score(current[1])):
            lease.check()  # the fence: a decision that outlived its lease moves nothing
            client.set_registered_model_alias(name, CHAMPION, best.version)
            winner = (str(best.version), bleus[str(best.version)])
        for version in pending:
            if winner and str(version.version) == winner[0]:
                verdict = CHAMPION
            elif winner:
                verdict = f"kept version {winner[0]}"
            else:
                continue  # no champion and no finite val_bleu: the next registration decides
            client.set_model_version_tag(name, version.version, DECISION_TAG, verdict)
    return Decision(*(winner or (None, math.nan)), current)


def promote(uri: str, name: str, version: str) -> None:
    """Move the champion alias to a version by hand (`nmt promote VERSION`), under the lock."""
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    try:
        client.get_model_version(name, str(version))
    except MlflowException:
        raise UserError(f"registered model {name!r} has no version {version} in {redact(uri)}; "
                        f"list versions in the MLflow UI or with `mlflow models`") from None
    with decision_lock(uri, name) as lease:
        lease.check()
        client.set_registered_model_alias(name, CHAMPION, str(version))
        client.set_model_version_tag(name, str(version), DECISION_TAG, "promoted by hand")
