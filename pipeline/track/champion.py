"""The champion alias: which model version translate, evaluate and serve load, decided from the registry alone.

The champion is a function of what the registry holds: the version with the highest val_bleu, the earliest on
a tie, among those that may compete; a val_bleu that is not a finite number never wins. `nmt promote VERSION`
pins a version by hand, and from then on only versions registered after the pin compete with it.

Registrations finish together (a sweep's trials, two members' runs), and MLflow has no compare-and-set, so
there is no lock: every process that decides writes the alias and then reads the registry again, writing
again until what it reads agrees. A writer whose view was stale is corrected by its own next read, and the
last writer leaves the answer for everything registered before it read. A version whose process died
before deciding is counted by the next decision, as every version is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..common import log
from ..common.errors import UserError
from .login import redact
from .target import mlflow_client
from .tracking import error_line

CHAMPION = "champion"
DECISION_TAG = "champion_decision"  # on each version, for the UI: "champion", "kept version N" or "promoted by hand"
PIN_TAG = "champion_pin"  # on the registered model: "<version> <newest version then>", set by `nmt promote VERSION`
# Each round that does not settle means another process wrote in between; this many in a row means the registry
# keeps changing faster than one decision reads it.
MAX_ROUNDS = 20
logger = log.get("registry")


class MissingModel(UserError):
    """The registered model does not exist."""


@dataclass
class Decision:
    """The champion after a decision, and the one before it (None: there was none)."""

    version: str | None
    val_bleu: float  # NaN when there is no champion
    previous: tuple[str, float] | None


def champion_bleu(uri: str, name: str) -> tuple[str, float] | None:
    """(version, val_bleu) of the current champion; None only when there is none, any other failure raised."""
    client = mlflow_client(uri)
    try:
        model = _registered_model(client, uri, name)
    except MissingModel:
        return None
    version = model.aliases.get(CHAMPION)
    if version is None:
        return None
    return str(version), _bleu(client.get_model_version(name, version).tags, name, version)


def decide(uri: str, name: str) -> Decision:
    """Move @champion to the registry's answer until a fresh read agrees; tag each version not yet told its verdict."""
    client = mlflow_client(uri)
    previous = champion_bleu(uri, name)
    winner, versions = _settle(client, uri, name)
    for version in versions:
        if version.tags.get(DECISION_TAG) is None and winner is not None:
            verdict = CHAMPION if str(version.version) == winner else f"kept version {winner}"
            _write(client.set_model_version_tag, name, version.version, DECISION_TAG, verdict)
    if winner is None:
        return Decision(None, math.nan, previous)
    bleus = {str(v.version): _bleu(v.tags, name, v.version) for v in versions}
    return Decision(winner, bleus[winner], previous)


def promote(uri: str, name: str, version: str) -> None:
    """Pin @champion to a version by hand (`nmt promote VERSION`): only later versions compete with it."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(uri)
    try:
        client.get_model_version(name, str(version))
    except MlflowException:
        raise UserError(f"registered model {name!r} has no version {version} in {redact(uri)}; "
                        f"list versions in the MLflow UI or with `mlflow models`") from None
    newest = max(int(v.version) for v in _versions(client, name))
    client.set_registered_model_tag(name, PIN_TAG, f"{version} {newest}")
    client.set_model_version_tag(name, str(version), DECISION_TAG, "promoted by hand")
    winner, _ = _settle(client, uri, name)
    if winner != str(version):  # a version registered since the pin beat it already
        logger.warning(f"{name} version {winner}, registered after the pin, beats version {version}: it is champion")


def _settle(client, uri: str, name: str) -> tuple[str | None, list]:
    """(the champion, the versions it was chosen from), once the alias and a read made after writing it agree."""
    failed = ""
    for _ in range(MAX_ROUNDS):
        model = _registered_model(client, uri, name)
        versions = _versions(client, name)
        winner = _choose(versions, model.tags.get(PIN_TAG), name)
        current = model.aliases.get(CHAMPION)
        if winner is None or (current is not None and str(current) == winner):
            return winner, versions
        failed = _write(client.set_registered_model_alias, name, CHAMPION, winner, retry=False)
    raise UserError(f"the champion of {name!r} did not settle in {MAX_ROUNDS} reads of the registry "
                    f"({failed or 'its versions kept changing'}); `nmt promote` decides again")


def _write(change, *args, retry: bool = True) -> str:
    """change(*args) on the registry; "" or, when it failed, why. A store's insert-or-update is not atomic: the
    first writes of one key by two processes at once fail for one of them, and writing again updates the key."""
    from mlflow.exceptions import MlflowException

    try:
        change(*args)
    except MlflowException as err:
        if err.get_http_status_code() == 403:  # a login that may not: retrying will not help
            raise
        if not retry:
            return error_line(err)
        change(*args)
    return ""


def _versions(client, name: str) -> list:
    """Every version of `name`, page by page (a page holds at most 10,000)."""
    versions, token = [], None
    while True:
        page = client.search_model_versions(f"name = '{name}'", page_token=token)
        versions += page
        token = page.token
        if not token:
            return versions


def _choose(versions: list, pin: str | None, name: str) -> str | None:
    """The champion by the rule: the best finite val_bleu (earliest on a tie) among the versions that compete."""
    pinned, after = _pin(pin, name)
    competing = [v for v in versions if pinned is None or str(v.version) == pinned or int(v.version) > after]
    scored = [(_score(_bleu(v.tags, name, v.version)), -int(v.version), str(v.version)) for v in competing]
    best = max(scored, default=None)
    if best is not None and (math.isfinite(best[0]) or best[2] == pinned):
        return best[2]
    return pinned if any(str(v.version) == pinned for v in versions) else None


def _pin(value: str | None, name: str) -> tuple[str | None, int]:
    """(the pinned version, the newest version when it was pinned); (None, 0) when there is no readable pin."""
    try:
        version, newest = (value or "").split()
        return str(int(version)), int(newest)
    except ValueError:
        if value:
            logger.warning(f"{name} has tag {PIN_TAG}={value!r}, not '<version> <newest version>': it is ignored "
                           "(`nmt promote VERSION` sets it again)")
        return None, 0


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
