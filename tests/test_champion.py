"""The champion on a real MLflow registry (SQLite): a lease judged on the reader's clock, renewed and fenced; a NaN
val_bleu that neither wins nor blocks; export, evaluate and translate resolve @champion once."""

import threading
import time

import pytest
from mlflow.tracking import MlflowClient
from registry_files import register, small_tokenizer, small_translator
from stores import sqlite_uri

from pipeline.common.errors import UserError
from pipeline.serve import commands
from pipeline.track import champion, registry

NAME = "m"


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A registry with a registered model and short lease timings (the same rules, seconds instead of a minute)."""
    monkeypatch.setattr(champion, "LOCK_STALE_S", 2.0)
    monkeypatch.setattr(champion, "LOCK_RENEW_S", 0.3, raising=False)
    monkeypatch.setattr(champion, "LOCK_SETTLE_S", 0.2)
    uri = sqlite_uri(tmp_path)
    client = MlflowClient(uri, registry_uri=uri)
    client.create_registered_model(NAME)
    return uri, client


def _version(client, bleu: str, decision: str | None = None) -> str:
    tags = {"val_bleu": bleu, **({champion.DECISION_TAG: decision} if decision else {})}
    return str(client.create_model_version(NAME, "file:///nowhere", tags=tags).version)


@pytest.mark.parametrize("claim", ["{token} 0 {behind}", "x nan", "x inf", "x 99999999999"])
def test_champion_lock_claims_go_stale_by_the_readers_own_clock(store, claim):
    """A live holder 90 s behind is respected for as long as its claim changes; any claim left unchanged (NaN,
    infinite or future stamps too) is free once this process has seen it for LOCK_STALE_S."""
    uri, client = store
    client.set_registered_model_tag(NAME, champion.LOCK_TAG, claim.format(token="t", behind=time.time() - 90))
    with pytest.raises(UserError, match="held the champion lock"):  # not taken at once, whatever its stamp
        with champion.decision_lock(uri, NAME, timeout_s=1.0):
            pass
    started = time.monotonic()
    with champion.decision_lock(uri, NAME, timeout_s=20.0) as lease:
        assert lease.holds()
    assert champion.LOCK_STALE_S <= time.monotonic() - started < 15  # stale after LOCK_STALE_S, not 180 s
    assert champion.LOCK_TAG not in client.get_registered_model(NAME).tags


def test_champion_lock_of_a_live_holder_is_renewed_and_never_taken(store):
    uri, client = store
    with champion.decision_lock(uri, NAME):  # holds three times as long as a claim goes stale
        with pytest.raises(UserError, match="held the champion lock"):
            with champion.decision_lock(uri, NAME, timeout_s=3 * champion.LOCK_STALE_S):
                pass


def test_champion_decision_that_outlives_its_lease_moves_nothing(store, monkeypatch):
    """The holder stalls (MLflow's retries); another process takes the lock over; the alias must not move."""
    uri, client = store
    first = _version(client, "20.0", "champion")
    client.set_registered_model_alias(NAME, champion.CHAMPION, first)
    better = _version(client, "30.0")
    read = champion.champion_bleu

    def stalled(*args):
        found = read(*args)
        # Taken over meanwhile, as another process takes it: a claim that stood LOCK_SETTLE_S (a first claim
        # written between the lease's read and its renewal is overwritten, and that process would claim again).
        assert any(champion._claimed(client, NAME, "other 0 0") for _ in range(10))
        return found

    monkeypatch.setattr(champion, "champion_bleu", stalled)
    with pytest.raises(champion.LockLost, match="nothing was moved"):
        champion.decide(uri, NAME)
    assert str(client.get_registered_model(NAME).aliases[champion.CHAMPION]) == first
    assert champion.DECISION_TAG not in client.get_model_version(NAME, better).tags  # decided again later
    monkeypatch.setattr(champion, "champion_bleu", read)
    client.delete_registered_model_tag(NAME, champion.LOCK_TAG)
    assert champion.decide(uri, NAME).version == better


def test_champion_nan_val_bleu_neither_wins_nor_blocks_and_a_wrongly_kept_version_is_reconsidered(store):
    uri, client = store
    first = _version(client, "25.0", "champion")
    client.set_registered_model_alias(NAME, champion.CHAMPION, first)
    blocker, better = _version(client, "nan"), _version(client, "31.0")
    decision = champion.decide(uri, NAME)
    assert decision.version == better and decision.val_bleu == 31.0
    assert client.get_model_version(NAME, blocker).tags[champion.DECISION_TAG] == f"kept version {better}"
    # What the old rule left on a server: a 31.0 "kept" behind a 25.0 champion. The next decision corrects it.
    wronged = _version(client, "33.0", f"kept version {first}")
    client.set_registered_model_alias(NAME, champion.CHAMPION, first)
    assert champion.decide(uri, NAME).version == wronged
    # A champion whose own tag is not a number is beaten by any finite val_bleu; garbage blocks nothing either.
    client.set_model_version_tag(NAME, wronged, "val_bleu", "not-a-number")
    assert champion.decide(uri, NAME).version == wronged  # nothing pending: it stays
    assert champion.decide(uri, NAME).val_bleu != champion.decide(uri, NAME).val_bleu  # NaN
    later = _version(client, "1.0")
    assert champion.decide(uri, NAME).version == later


@pytest.fixture
def two_versions(store, tmp_path):
    """Versions 1 and 2 with translator files of their own (told apart by max_positions); @champion on 1."""
    uri, client = store
    tokenizer = small_tokenizer()
    register(uri, NAME, [small_translator(tokenizer, 64), small_translator(tokenizer, 96)], tmp_path)
    client.set_registered_model_alias(NAME, champion.CHAMPION, "1")
    return uri, client


def test_champion_is_resolved_once_and_loaded_by_number(two_versions, tmp_path, monkeypatch):
    """A sweep moves @champion to version 2 right after it is resolved: every file read is still version 1's."""
    uri, client = two_versions
    resolve, reads = registry.model_version, []

    def then_moved(tracking_uri, model_uri):
        found = resolve(tracking_uri, model_uri)
        client.set_registered_model_alias(NAME, champion.CHAMPION, "2")
        return found

    def recorded(tracking_uri, model_uri, device="auto"):
        reads.append(model_uri)
        return load(tracking_uri, model_uri, device)

    load = registry.load_translator
    monkeypatch.setattr(registry, "model_version", then_moved)
    monkeypatch.setattr(registry, "load_translator", recorded)
    alias = f"models:/{NAME}@{champion.CHAMPION}"
    loaded = commands.load_engine(uri, alias, "pytorch", "cpu", str(tmp_path))  # translate and serve
    assert loaded.model.model.cfg.max_positions == 64
    client.set_registered_model_alias(NAME, champion.CHAMPION, "1")
    directory, version = commands.export(uri, alias, str(tmp_path / "ct2"), "int8")
    assert str(version.version) == "1" and reads[-1] == f"models:/{NAME}/1"
    assert '"max_positions": 64' in (directory / "nmt-export.json").read_text()
    client.set_registered_model_alias(NAME, champion.CHAMPION, "1")
    (tmp_path / "src.txt").write_text("a small dog\n")
    (tmp_path / "ref.txt").write_text("a small dog\n")
    scores = commands.evaluate(uri, "e", alias, 1, src_file=str(tmp_path / "src.txt"),
                               ref_file=str(tmp_path / "ref.txt"), engine="pytorch")
    assert client.get_run(scores["run_id"]).data.tags["model_version"] == "1"
    assert reads and all(read == f"models:/{NAME}/1" for read in reads), reads


def test_champion_lock_threads_never_decide_together(store):
    """Two deciders at once: each decision runs alone (the second sees the first's verdicts)."""
    uri, client = store
    _version(client, "10.0")
    _version(client, "12.0")
    results = []
    threads = [threading.Thread(target=lambda: results.append(champion.decide(uri, NAME))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(r.version for r in results) == ["2", "2"] and [r.previous for r in results].count(None) == 1
