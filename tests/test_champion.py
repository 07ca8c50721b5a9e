"""The champion on a real MLflow registry (SQLite): decided from the registry alone, a stale writer corrected by
its own next read, a pin by hand; a NaN val_bleu that neither wins nor blocks; export, evaluate and translate
resolve @champion once."""

import threading

import pytest
from mlflow.tracking import MlflowClient
from registry_files import register, small_tokenizer, small_translator
from stores import sqlite_uri

from pipeline.serve import commands
from pipeline.track import champion, registry

NAME = "m"


@pytest.fixture
def store(tmp_path):
    """A registry with a registered model."""
    uri = sqlite_uri(tmp_path)
    client = MlflowClient(uri, registry_uri=uri)
    client.create_registered_model(NAME)
    return uri, client


def _version(client, bleu: str, decision: str | None = None) -> str:
    tags = {"val_bleu": bleu, **({champion.DECISION_TAG: decision} if decision else {})}
    return str(client.create_model_version(NAME, "file:///nowhere", tags=tags).version)


def test_a_decider_whose_view_went_stale_is_corrected_by_its_own_next_read(store, monkeypatch):
    """A decides on versions 1-2; before its alias write lands, B registers a better 3 and decides. A's late write
    of 2 must not stand: A reads the registry again after writing and moves the alias to 3."""
    uri, client = store
    first = _version(client, "20.0")
    client.set_registered_model_alias(NAME, champion.CHAMPION, first)
    better = _version(client, "30.0")
    write, seen = MlflowClient.set_registered_model_alias, {}

    def landing_late(self, name, alias, version):
        if not seen:  # A's first write: B registers and decides before it lands
            seen["B"] = None
            newest = _version(client, "40.0")
            seen["B"] = (newest, champion.decide(uri, NAME).version)
        return write(self, name, alias, version)

    monkeypatch.setattr(MlflowClient, "set_registered_model_alias", landing_late)
    decision = champion.decide(uri, NAME)
    newest, decided_by_b = seen["B"]
    assert decided_by_b == newest and decision.version == newest and decision.val_bleu == 40.0
    assert str(client.get_registered_model(NAME).aliases[champion.CHAMPION]) == newest
    verdicts = {v: client.get_model_version(NAME, v).tags[champion.DECISION_TAG] for v in (first, better, newest)}
    assert verdicts == {first: f"kept version {newest}", better: f"kept version {newest}", newest: "champion"}


def test_promote_pins_a_version_that_only_later_versions_compete_with(store, caplog):
    uri, client = store
    low, high = _version(client, "10.0"), _version(client, "30.0")
    assert champion.decide(uri, NAME).version == high
    champion.promote(uri, NAME, low)  # back to an older, lower version by hand: it stays
    assert champion.decide(uri, NAME).version == low
    assert client.get_model_version(NAME, low).tags[champion.DECISION_TAG] == "promoted by hand"
    assert champion.decide(uri, NAME).version == low
    assert champion.decide(uri, NAME).version == low  # high does not compete again
    worse = _version(client, "5.0")
    assert champion.decide(uri, NAME).version == low
    later = _version(client, "20.0")  # registered after the pin, and better than the pinned version
    assert champion.decide(uri, NAME).version == later
    # A pinned version without a number holds until a later finite one comes; a pin that is not
    # "<version> <newest>" is ignored with a warning, and every version competes again.
    broken = _version(client, "nan")
    champion.promote(uri, NAME, broken)
    assert champion.decide(uri, NAME).version == broken
    finite = _version(client, "1.0")
    assert champion.decide(uri, NAME).version == finite
    client.set_registered_model_tag(NAME, champion.PIN_TAG, "garbage")
    assert champion.decide(uri, NAME).version == high
    assert "champion_pin='garbage'" in caplog.text and worse != high


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
    # A champion whose own tag is no longer a number gives way to the best finite one; garbage blocks nothing.
    client.set_model_version_tag(NAME, wronged, "val_bleu", "not-a-number")
    assert champion.decide(uri, NAME).version == better
    later = _version(client, "1.0")
    assert champion.decide(uri, NAME).version == better
    assert client.get_model_version(NAME, later).tags[champion.DECISION_TAG] == f"kept version {better}"


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


def test_two_deciders_at_once_agree_and_leave_the_best_version_champion(store):
    uri, client = store
    _version(client, "10.0")
    _version(client, "12.0")
    results = []
    threads = [threading.Thread(target=lambda: results.append(champion.decide(uri, NAME))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert [r.version for r in results] == ["2", "2"]
    assert str(client.get_registered_model(NAME).aliases[champion.CHAMPION]) == "2"
    assert client.get_model_version(NAME, "1").tags[champion.DECISION_TAG] == "kept version 2"
