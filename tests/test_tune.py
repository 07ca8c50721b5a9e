"""Ray Tune sweeps: bad spaces fail early, ASHA stops trials, MLflow parent/child runs, the best trial registered."""

import types

import pytest
from mlflow.tracking import MlflowClient
from small import ROOT, small_config
from stores import sqlite_uri

from pipeline.cli import main
from pipeline.common.errors import UserError
from pipeline.config import Config, ConfigError, load_config
from pipeline.tune.search_space import apply, load_space
from pipeline.tune.sweep import sweep

BAD_SPACES = [
    ("model.num_head: {choice: [2, 4]}\n", "unknown key 'model.num_head'; did you mean 'model.num_heads'?"),
    ("model.num_heads: {normal: [2, 4]}\n", "unknown distribution 'normal'"),
    ("model.d_model: {choice: [64, 128]}\nmodel.num_heads: {choice: [3, 4]}\n",
     "space.yaml:2: model.num_heads 3 divides no d_model in [64, 128]"),
    ("train.lr_scale: {loguniform: [0, 1]}\n", "loguniform needs low < high and low > 0"),
    ("train.warmup_steps: {choice: [-5, 100]}\n", "train.warmup_steps must be positive"),
    ("train.amp: {choice: [bf16, fp8]}\n", "train.amp must be one of"),
    ("model.num_layers: 4\n", "needs exactly one distribution"),
]


@pytest.mark.parametrize("text,message", BAD_SPACES)
def test_bad_search_spaces_fail_before_anything_starts(tmp_path, capsys, text, message):
    (tmp_path / "space.yaml").write_text(text)
    with pytest.raises(ConfigError, match=None) as info:
        load_space(tmp_path / "space.yaml", load_config(None, ["model.d_model=64"]))
    assert message in str(info.value)
    assert main(["tune", "--space", str(tmp_path / "space.yaml"), "--set", "model.d_model=64",
                 "--set", f"tracking.tracking_uri=sqlite:///{tmp_path / 'm.db'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_shipped_spaces_parse_and_an_invalid_combination_is_reported_not_raised():
    base = load_config("configs/demo.yaml")
    for name in ("demo", "multi30k", "wmt14_base"):
        assert load_space(f"tune_spaces/{name}.yaml", base)
    cfg, problem = apply(base, {"model.num_heads": 3})
    assert problem and "divisible by num_heads" in problem


@pytest.mark.slow
def test_an_invalid_sampled_combination_is_a_rejected_trial_not_a_crash(ray_session, tmp_path):
    # randint heads pass the space check; the sampled 3 cannot split d_model=64.
    (tmp_path / "space.yaml").write_text("model.num_heads: {randint: [3, 4]}\n")
    cfg = small_config(tmp_path, "tune.num_samples=1", "tune.name=rejects", "tracking.experiment=tune-rejects")
    outcome = sweep(cfg, str(tmp_path / "space.yaml"))
    (trial,) = outcome.trials
    assert trial["status"] == "REJECTED" and outcome.best is None and outcome.registered is None
    run = MlflowClient(cfg.tracking.tracking_uri).get_run(trial["run_id"])
    assert run.info.status == "KILLED" and "divisible by num_heads" in run.data.tags["rejected"]


@pytest.mark.parametrize("space_text, settings, rung, warning", [
    # the default: the longest warmup any trial of the space can have
    ("train.warmup_steps: {choice: [1000, 2000, 4000]}\n", [], 4000, None),
    ("train.warmup_steps: {randint: [100, 500]}\n", [], 499, None),
    ("model.num_heads: {choice: [2, 4]}\n", ["train.warmup_steps=300"], 300, None),
    # a grace period set by hand is kept, with a warning when it falls inside a warmup
    ("train.warmup_steps: {grid: [50, 100]}\n", ["tune.grace_period=120"], 120, None),
    ("train.warmup_steps: {choice: [1000, 4000]}\n", ["tune.grace_period=1000"], 1000, "still warming up"),
    # a first rung at or past the end of every trial can stop nothing
    ("train.warmup_steps: {choice: [200]}\n", ["train.max_steps=200"], 200, "ASHA can stop no trial"),
])
def test_asha_never_judges_a_trial_before_the_longest_warmup_unless_told(tmp_path, caplog, space_text, settings,
                                                                          rung, warning):
    import logging

    from pipeline.tune.sweep import first_rung

    (tmp_path / "space.yaml").write_text(space_text)
    cfg = load_config("configs/demo.yaml", settings)
    with caplog.at_level(logging.INFO, logger="pipeline"):
        assert first_rung(cfg, load_space(tmp_path / "space.yaml", cfg)) == rung
    assert f"ASHA: first rung at update {rung} " in caplog.text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (warning is None and not warnings) or (len(warnings) == 1 and warning in warnings[0]), warnings


def _draw(search: str, settings: list[str]) -> tuple[list[dict], Config]:
    """The trials a search of the demo space proposes first, without running them; and its config."""
    from ray.tune.experiment import Experiment

    from pipeline.tune.sweep import search_algorithm

    cfg = load_config(ROOT / "configs" / "demo.yaml", [f"tune.search={search}", *settings])
    space = load_space(str(ROOT / "tune_spaces" / "demo.yaml"), cfg)
    algorithm, param_space, samples = search_algorithm(cfg, space, 4)
    if search == "optuna":
        algorithm.set_search_properties(cfg.tune.metric, cfg.tune.mode, param_space)
        return [algorithm.suggest(f"t{i}") for i in range(samples)], cfg
    algorithm.add_configurations([Experiment("x", run=lambda config: None, config=param_space, num_samples=samples)])
    return [algorithm.next_trial().config for _ in range(samples)], cfg


@pytest.mark.parametrize("search", ["random", "optuna"])
def test_the_same_space_and_seed_sample_the_same_trials(search):
    first = _draw(search, ["tune.seed=0"])[0]
    assert len(first) == 4 and _draw(search, ["tune.seed=0"])[0] == first and _draw(search, ["tune.seed=1"])[0] != first


@pytest.mark.parametrize("search", ["random", "optuna"])
def test_start_with_base_makes_the_config_itself_the_first_trial(search):
    inside = ["tune.start_with_base=true", "train.warmup_steps=200", "train.lr_scale=1.5"]
    trials, cfg = _draw(search, inside)
    base = {key: cfg.flat()[key] for key in trials[0]}
    assert len(trials) == cfg.tune.num_samples == 4  # the baseline is one of num_samples
    assert trials[0] == base and all(t != base for t in trials[1:])
    with pytest.raises(UserError, match="tune.start_with_base needs"):
        _draw("grid", inside)
    # The demo config's warmup (400) is not among the space's choices (100, 200).
    with pytest.raises(ConfigError, match=r"train.warmup_steps is 400 in the config, outside the space's choice"):
        _draw(search, ["tune.start_with_base=true"])


def test_the_sweep_plot_shows_every_choice_marks_stopped_trials_and_stars_the_best():
    from matplotlib.colors import to_rgba

    from pipeline.track.plots import sweep_plot

    trials = [{"params": {"model.num_heads": heads}, "val_bleu": bleu, "status": status}
              for heads, bleu, status in ((2, 30.0, "OK"), (2, 12.0, "STOPPED_EARLY"), (8, 31.5, "OK"),
                                          (8, float("nan"), "ERROR"))]
    ax = sweep_plot("model.num_heads", ("choice", [2, 4, 8]), trials).axes[0]
    assert [label.get_text() for label in ax.get_xticklabels()] == ["2", "4", "8"]  # 4: no trial, still a column
    finished, stopped, best = ax.collections
    assert len(finished.get_offsets()) == 2 and len(stopped.get_offsets()) == 1
    hollow = not len(stopped.get_facecolors()) or stopped.get_facecolors()[0][3] == 0
    assert hollow and tuple(stopped.get_edgecolors()[0]) == to_rgba("tab:orange")
    assert list(best.get_offsets()[0]) == [2.0, 31.5] and "best: 31.50" in [t.get_text() for t in
                                                                             ax.get_legend().get_texts()]


def test_a_trial_tune_stopped_without_error_is_stopped_early_whether_its_run_was_left_running_or_failed(tmp_path):
    import pandas as pd

    from pipeline.track import tracking
    from pipeline.tune.summary import summarize

    uri = sqlite_uri(tmp_path)
    cfg = load_config("configs/demo.yaml", [f"tracking.tracking_uri={uri}", "tracking.experiment=stops"])
    results = []
    for trial, status, error in (("t1", "RUNNING", None), ("t2", "FAILED", None), ("t3", "FINISHED", None),
                                 ("t4", "FAILED", RuntimeError("the trial broke"))):
        run = tracking.open_run(uri, "stops", f"sweep-{trial}", {}, {tracking.TRIAL_TAG: trial})
        if status != "RUNNING":
            run.end(status)
        history = pd.DataFrame({"trial_id": [trial], "step": [100], "val_bleu": [5.0]})
        results.append(types.SimpleNamespace(metrics={"trial_id": trial}, metrics_dataframe=history,
                                             config={"model.num_heads": 4}, error=error))
    rows = summarize(uri, cfg, results, {"model.num_heads": ("choice", [4])})
    assert [row["status"] for row in rows] == ["STOPPED_EARLY", "STOPPED_EARLY", "OK", "ERROR"]
    runs = [MlflowClient(uri).get_run(row["run_id"]) for row in rows]
    assert [run.info.status for run in runs] == ["FINISHED", "FINISHED", "FINISHED", "FAILED"]
    assert [run.data.tags.get("stopped_early") for run in runs] == ["asha", "asha", None, None]
