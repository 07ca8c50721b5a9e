"""`nmt demo --quick` end to end: Ray Data, a Tune sweep of Ray Train runs, MLflow registry, test BLEU."""

import re

import pytest
from mlflow.tracking import MlflowClient

from pipeline.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def test_quick_demo_runs_end_to_end_and_the_champion_has_learned(ray_session, tmp_path, capsys):
    assert main(["demo", "--quick", "--workdir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "test BLEU" in out and "*best*" in out and "mlflow ui --backend-store-uri" in out
    # The sweep reports each trial in one line when it ends, not in Tune's periodic status tables.
    assert err.count("[tune] trial ") >= 4 and err.count(" ended at update 200: val_bleu ") == 2, err[-3000:]
    assert "Trial status" not in out + err
    # Ray's C++ log lines from workers ("[... E 123 456] core_worker.cc:2465: ...") stay in Ray's log files.
    assert not re.search(r"\] \w+\.cc:\d+: ", out + err), err[-3000:]
    test_bleu = float(re.search(r"^test BLEU ([0-9.]+),", out, re.MULTILINE).group(1))
    assert test_bleu >= 5.0, out[-3000:]  # an untrained model scores ~0; ~20 on a quiet machine
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    champion = client.get_model_version_by_alias("transformer-nmt", "champion")
    assert str(champion.version) == "1"
    # A second run reuses the data and the finished sweep: nothing new to register.
    assert main(["demo", "--quick", "--workdir", str(tmp_path)]) == 0
    assert len(client.search_model_versions("name = 'transformer-nmt'")) == 1
