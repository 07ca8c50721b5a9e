"""`nmt demo --quick` end to end (Ray Data, a Tune sweep of Ray Train runs, MLflow registry), then fine-tuning."""

import contextlib
import io
import re
import types
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline.cli import main

pytestmark = [pytest.mark.rehearse, pytest.mark.timeout(1500)]
README = Path(__file__).resolve().parents[1] / "README.md"
CHAMPION = "models:/transformer-nmt-demo-en-de@champion"


def structure(text: str) -> list[str]:
    """The demo's step headers in order, with what differs between demo sizes (numbers, space file) masked."""
    return [re.sub(r"\d+", "N", re.sub(r"\S+\.yaml", "SPACE", line))
            for line in text.splitlines() if line.startswith("=== [")]


@pytest.fixture(scope="module")
def quick_demo(ray_session, tmp_path_factory):
    """One `nmt demo --quick` run: its exit code, what it printed, its working directory."""
    workdir = tmp_path_factory.mktemp("quick-demo")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):  # Ray prints forwarded lines here too
        code = main(["demo", "--quick", "--workdir", str(workdir)])
    return types.SimpleNamespace(code=code, out=out.getvalue(), err=err.getvalue(), workdir=workdir,
                                 uri=f"sqlite:///{workdir / 'mlflow.db'}")


def test_quick_demo_runs_end_to_end_and_the_champion_has_learned(quick_demo):
    out, err = quick_demo.out, quick_demo.err
    assert quick_demo.code == 0, err[-3000:]
    assert "test BLEU" in out and "*best*" in out and "mlflow ui --backend-store-uri" in out
    # The sweep reports each trial in one line when it ends, not in Tune's periodic status tables.
    assert err.count("[tune] trial ") >= 4 and err.count(" ended at update 200: val_bleu ") == 2, err[-3000:]
    assert "Trial status" not in out + err
    # Ray's C++ log lines from workers ("[... E 123 456] core_worker.cc:2465: ...") stay in Ray's log files.
    assert not re.search(r"\] \w+\.cc:\d+: ", out + err), err[-3000:]
    # The workers' own lines print without Ray's "(RayTrainWorker pid=...)" prefix, and the whole
    # demo reads on one screen or two: no library warnings, a progress line per 50 updates.
    assert "[train] step 50/200 " in err and "pid=" not in out + err, err[-3000:]
    assert len((out + err).splitlines()) <= 80, out + err
    assert not re.search(r"warning", out + err, re.IGNORECASE), out + err
    # The README's transcript (a real `make demo` capture) shows the same steps.
    transcript = next(block for block in README.read_text().split("```") if "=== [1/4]" in block)
    assert structure(transcript) == structure(out), (structure(transcript), structure(out))
    test_bleu = float(re.search(r"^test BLEU ([0-9.]+),", out, re.MULTILINE).group(1))
    assert test_bleu >= 5.0, out[-3000:]  # an untrained model scores ~0; 10-13 over three seeds
    client = MlflowClient(quick_demo.uri)
    champion = client.get_model_version_by_alias("transformer-nmt-demo-en-de", "champion")
    assert str(champion.version) == "1"
    # A second run reuses the data and the finished sweep: nothing new to register.
    assert main(["demo", "--quick", "--workdir", str(quick_demo.workdir)]) == 0
    assert len(client.search_model_versions("name = 'transformer-nmt-demo-en-de'")) == 1


def test_the_demo_champion_fine_tuned_on_a_shifted_corpus_beats_it_with_fewer_updates(quick_demo):
    from pipeline.config import load_config
    from pipeline.launch.demo import CONFIG, QUICK
    from pipeline.text.metrics import score
    from pipeline.text.translator import Translator
    from pipeline.track import registry
    from pipeline.train.driver import train

    assert quick_demo.code == 0
    work = quick_demo.workdir
    parent = registry.load(quick_demo.uri, CHAMPION, device="cpu").unwrap_python_model().translator
    # The demo generator with another seed: new sentences of the same languages. The demo trained
    # its champion for 200 updates from scratch; this gives it half as many.
    cfg = load_config(CONFIG, [*QUICK, f"data.output_dir={work / 'data' / 'prepared'}",
                               f"train.storage_path={work / 'runs'}", f"tracking.tracking_uri={quick_demo.uri}",
                               "data.seed=1", f"train.init_from={CHAMPION}", "train.max_steps=100",
                               f"model.num_heads={parent.model.cfg.num_heads}", "tracking.register=false"])
    outcome = train(cfg)
    tags = MlflowClient(quick_demo.uri).get_run(outcome.run_id).data.tags
    assert tags["init_from"] == CHAMPION
    assert tags["parent_model"].startswith("transformer-nmt-demo-en-de version 1 (run ")
    test = outcome.manifest.read_split("test", ["src", "tgt"])
    sources, references = test.column("src").to_pylist(), test.column("tgt").to_pylist()
    child = Translator.from_checkpoint(outcome.checkpoint_path, outcome.manifest.tokenizer(), beam_size=2)
    before = score(parent.translate(sources, beam_size=2), references)["bleu"]
    after = score(child.translate(sources), references)["bleu"]
    assert outcome.metrics["step"] <= 100 and after > before + 1.0, (outcome.metrics, before, after)
