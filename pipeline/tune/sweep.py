"""`nmt tune`: a Ray Tune sweep in which every trial is a Ray Train run, tracked as nested MLflow runs.

Trials run `run_trial`, which applies the sampled values to the base config and fits the
same TorchTrainer as `nmt train` (build_trainer), reporting to Tune through
TuneReportCallback and to the trial's MLflow child run through our own callback.
"""

from __future__ import annotations

import math
import os
import posixpath
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common import log, storage
from ..common.errors import UserError
from ..common.messages import ParentInit, Report
from ..config import Config, config_from_dict
from ..track import reports, tracking
from ..track.provenance import person
from ..track.publish import dataset_inputs, publish
from ..track.target import TrackingTarget, resolve
from ..train.run import RunSetup, build_trainer, fit_interrupts, prepare_run, tracked_run
from .search_space import apply, base_point, grid_size, largest, load_space, to_tune
from .state_seal import sealed_filesystem
from .summary import SweepOutcome, best_trial, log_summary, summarize, trial_lines

logger = log.get("tune")


def default_sweep_name(cfg: Config, space_text: str, login_user: str = "") -> str:
    """A name from the person, the config and the space: the same command finds the same sweep again, and two
    people with the same config never share one (its storage directory, its MLflow run)."""
    return f"tune-{person(login_user)}-{cfg.digest(('data', 'model', 'train', 'tune'), extra=space_text)}"


def max_concurrent(cfg: Config) -> int:
    """tune.max_concurrent_trials, else as many whole trials as the cluster's CPUs (and GPUs) hold."""
    import ray

    if cfg.tune.max_concurrent_trials:
        return cfg.tune.max_concurrent_trials
    resources, train = ray.cluster_resources(), cfg.train
    fits = min(int(resources.get(name, 0) // (amount * train.num_workers))
               for name, amount in train.worker_bundle().items())
    return max(1, fits)


def _validation_reports():
    """TuneReportCallback for validation reports only: Tune schedules on val_bleu, progress lines go to MLflow."""
    from ray.tune.integration.ray_train import TuneReportCallback

    class ValidationReports(TuneReportCallback):
        def after_report(self, run_context, metrics, checkpoint):
            # Validations only: progress values went to MLflow, and a preemption checkpoint's val_bleu is NaN.
            if metrics and (report := Report.from_metrics(metrics[0])).validated():
                super().after_report(run_context, [report.values], checkpoint)

    return ValidationReports()


@dataclass(frozen=True)
class TrialSetup:
    """What every trial of a sweep starts from (pickled to the trial's actor, on any node)."""

    base: dict[str, Any]  # the sweep's config tree as a plain dict; a trial applies its sampled values to it
    data_path: str  # the prepared dataset
    target: TrackingTarget  # the driver's tracking URI and login: the trial's node has its own environment
    experiment: str
    parent_run_id: str  # the sweep's MLflow run, which each trial's run nests under
    sweep: str  # the sweep's name
    train_storage: str  # where the trials' Ray Train runs keep their checkpoints
    log_level: int
    init: ParentInit | None  # the parent model, when fine-tuning


def run_trial(params: dict[str, Any], setup: TrialSetup) -> None:
    """One trial: the base config plus the sampled values, trained by the same TorchTrainer as `nmt train`."""
    from ray import tune

    from ..data.manifest import load_manifest

    log.setup(setup.log_level)  # a Ray actor of its own: its trial's workers log at the driver's level
    log.configure_libraries()  # and MLflow's own lines kept out of the sweep's output, as in the driver
    log.quiet_exit_in_finalizers()  # Tune ends the actor with a SIGTERM once the trial is done
    target = setup.target
    target.activate()  # a Ray actor of its own, with its node's environment: the driver's login goes with it
    trial_id = tune.get_context().get_trial_id()
    cfg, problem = apply(config_from_dict(setup.base), params)
    tags = {tracking.TRIAL_TAG: trial_id, "nmt.kind": "trial", "nmt.sweep": setup.sweep,
            **{f"param.{k}": str(v) for k, v in params.items()}}
    # A trial ASHA stops leaves its run RUNNING or FAILED (whichever Tune's stop breaks first): summarize(),
    # which sees Tune found no error in it, marks it stopped early.
    with tracking.mlflow_run(target.uri, setup.experiment, f"{setup.sweep}-{trial_id}", cfg.flat(), tags,
                             parent_run_id=setup.parent_run_id, source="nmt tune (trial)",
                             user=target.username) as child:
        if problem:  # e.g. heads that do not divide d_model: a clean rejection, not a crashed trial
            child.end_status, child.end_tags = "KILLED", {"rejected": problem}
        else:
            manifest = load_manifest(setup.data_path)
            child.log_datasets(dataset_inputs(manifest))  # what the compare view lists per trial
            trainer = build_trainer(cfg, manifest, trial_id, setup.train_storage,
                                    callbacks=[_validation_reports(),
                                               reports.report_callback(child, target, cfg.tracking.system_metrics_s)],
                                    init=setup.init)
            _report_last(trainer.fit(), cfg.tune.metric)
    if problem:  # after the run has ended: Tune may stop the trial inside this report
        tune.report({"val_bleu": 0.0, "step": 0, "rejected": problem})


def _report_last(result, metric: str) -> None:
    """The trial's last kept checkpoint, told Tune once more as its trial ends.

    A trial resumed after its sweep's driver was lost may have finished training before Tune saved its
    last results: its Train run, restored finished, reports nothing new, and Tune would know no score.
    The last one, so that the trial ends where it did (the best is among the results it reported).
    """
    from ray import tune
    from ray.tune.integration.ray_train import CHECKPOINT_PATH_KEY

    scored = [(c, m) for c, m in (result.best_checkpoints or []) if math.isfinite(m.get(metric, math.nan))]
    if scored:
        checkpoint, metrics = max(scored, key=lambda cm: cm[1].get("step", 0))
        tune.report({**Report.from_metrics(metrics).values, CHECKPOINT_PATH_KEY: checkpoint.path})


def _check_state_api(cfg: Config) -> None:
    """Warn when ASHA's early stops could not give their CPUs back (Ray's State API is unreachable)."""
    from ..common.cluster import state_api_problem

    if cfg.tune.scheduler == "asha" and (problem := state_api_problem()):
        logger.warning(f"Ray's State API is unavailable ({problem}); trials ASHA stops early may keep their CPUs "
                       "and stall the sweep. Start Ray with its dashboard (the default of `ray start` and ray.init).")


def first_rung(cfg: Config, space: dict) -> int:
    """ASHA's grace period in updates: tune.grace_period, else the longest warmup a trial of the space can have.

    A trial still warming up has a low learning rate and looks worse than it is: judged there, the
    long-warmup configs that often win lose first.
    """
    warmup = int(largest(space, "train.warmup_steps", cfg.train.warmup_steps))
    rung = cfg.tune.grace_period or warmup
    origin = "tune.grace_period" if cfg.tune.grace_period else "the longest warmup in the space"
    logger.info(f"ASHA: first rung at update {rung} ({origin}), judged at the first validation from then on; "
                f"each later rung {cfg.tune.reduction_factor}x further")
    if rung < warmup:
        logger.warning(f"tune.grace_period {rung} is shorter than the longest warmup ({warmup} updates): ASHA may "
                       "stop trials that are still warming up; leave tune.grace_period at 0 to start after it")
    if cfg.train.max_steps and rung >= cfg.train.max_steps:
        logger.warning(f"ASHA can stop no trial: its first rung (update {rung}) is not before train.max_steps "
                       f"({cfg.train.max_steps}); train longer, or use tune.scheduler=fifo")
    return rung


def _scheduler(cfg: Config, space: dict):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if cfg.tune.scheduler == "fifo":
        return FIFOScheduler()
    # time_attr "step": rungs are counted in optimizer updates, whatever the epoch size. max_t lies
    # beyond the last update, so a trial that reaches it ends on its own (checkpoint averaging,
    # a clean Train shutdown) instead of being stopped by ASHA at its final report.
    return ASHAScheduler(time_attr="step", max_t=(cfg.train.max_steps or 10**9) + 1,
                         grace_period=first_rung(cfg, space), reduction_factor=cfg.tune.reduction_factor)


def search_algorithm(cfg: Config, space: dict, concurrent: int) -> tuple[Any, dict, int]:
    """(search algorithm, param_space, num_samples) for tune.search, seeded by tune.seed.

    The algorithm runs at most `concurrent` trials at once itself: Tune's max_concurrent_trials
    would be ignored for a seeded BasicVariantGenerator.
    """
    from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter

    param_space, samples = to_tune(space), cfg.tune.num_samples
    # The base config as the first trial: a baseline under the sweep's own budget and scheduler.
    base = [base_point(space, cfg)] if cfg.tune.start_with_base else None
    if cfg.tune.search == "grid":
        if base:
            raise UserError("tune.start_with_base needs tune.search=random or optuna (a grid has its own points)")
        param_space = to_tune({k: ("grid", args) if name == "choice" else (name, args)
                               for k, (name, args) in space.items()})
        samples = 1 if all(n in ("choice", "grid") for n, _ in space.values()) else samples
    elif cfg.tune.search == "optuna":
        try:
            from ray.tune.search.optuna import OptunaSearch
        except ImportError:
            raise UserError("tune.search=optuna needs Optuna: pip install optuna (or the project's .[optuna] extra)") \
                from None
        if grid_size(space) > 1:
            raise UserError("tune.search=optuna cannot sample grid keys; use choice instead of grid")
        optuna = OptunaSearch(metric=cfg.tune.metric, mode=cfg.tune.mode, seed=cfg.tune.seed,
                              points_to_evaluate=base)
        return ConcurrencyLimiter(optuna, max_concurrent=concurrent), param_space, samples
    return (BasicVariantGenerator(random_state=cfg.tune.seed, max_concurrent=concurrent, points_to_evaluate=base),
            param_space, samples)


def sweep(cfg: Config, space_path: str, address: str | None = None, resume: bool | None = False,
          config_file: str | None = None, adopt_run_id: str | None = None) -> SweepOutcome:
    """Run (or resume) the sweep, then summarize it in the parent MLflow run and register the best model.

    resume: True continues an existing sweep, False refuses to touch one, None resumes one if it exists.
    """
    from ray import tune

    space = load_space(space_path, cfg)  # a bad space fails here, before MLflow, Ray or data
    space_text = Path(space_path).read_text(encoding="utf-8")
    name = cfg.tune.name or default_sweep_name(cfg, space_text, resolve(cfg.tracking.tracking_uri).username)
    path = storage.join(storage.absolute(cfg.train.storage_path), name)
    exists = tune.Tuner.can_restore(path)
    if resume is None:
        resume = exists
    if exists and not resume:
        raise UserError(f"sweep {name} already exists at {path}: add --resume to continue it, "
                        f"or --set tune.name=NEW for a new one")
    if resume and not exists:
        raise UserError(f"no sweep to resume at {path}; run it once without --resume")
    # Its state checked against this person's seal before anything is unpickled, or before any work.
    state_fs = sealed_filesystem(path, resume=exists)
    prepared = prepare_run(cfg, address, on_ray=lambda: _check_state_api(cfg), adopt_run_id=adopt_run_id)
    with tracked_run(prepared, cfg, "nmt tune", name, {**cfg.flat(), "space": space_text}, {"nmt.kind": "sweep"},
                     config_file, extra_files=(space_path,)) as parent:
        logger.info(f"sweep {name}: {len(space)} keys, MLflow parent run {parent.id}, results in {path}")
        trials, best, registered = _fit_and_publish(cfg, space, prepared, parent, name, path, exists, state_fs)
    return SweepOutcome(name, parent.id, trials, best, registered, path)


def _fit_and_publish(cfg: Config, space: dict, prepared: RunSetup, parent: tracking.Run, name: str, path: str,
                     exists: bool, state_fs: tuple[Any, str]) -> tuple[list[dict], dict | None, Any]:
    """Run (or restore) the Tuner under the parent run, summarize its trials, publish the best one."""
    from ray import tune

    setup = TrialSetup(cfg.to_dict(), prepared.manifest.path, prepared.target, cfg.tracking.experiment, parent.id,
                       name, f"{path}/train", log.level(), prepared.init())
    # The trial function only drives its Train run, whose workers hold the CPUs: it reserves no
    # CPU (a bundle cannot be empty, so a little memory stands in).
    trainable = tune.with_resources(tune.with_parameters(run_trial, setup=setup), {"cpu": 0, "memory": 2**26})
    search_alg, param_space, samples = search_algorithm(cfg, space, max_concurrent(cfg))
    # Tune reads and writes its state through the sealed filesystem (state_seal), at the directory's path in it.
    filesystem, directory = state_fs
    if exists:
        tuner = tune.Tuner.restore(directory, trainable=trainable, resume_errored=True, param_space=param_space,
                                   storage_filesystem=filesystem)
    else:
        tuner = tune.Tuner(
            trainable, param_space=param_space,
            tune_config=tune.TuneConfig(metric=cfg.tune.metric, mode=cfg.tune.mode, num_samples=samples,
                                        scheduler=_scheduler(cfg, space), search_alg=search_alg),
            # Tune's status tables only with `nmt -v`; by default one line per trial start and end.
            run_config=tune.RunConfig(name=name, storage_path=posixpath.dirname(directory),
                                      storage_filesystem=filesystem, verbose=int(log.verbose()),
                                      callbacks=[trial_lines(cfg.train.max_steps)]),
        )
    with fit_interrupts() as handler_before_fit:  # Ctrl-C: KILLED; `nmt tune --resume` continues it
        results = tuner.fit()
        if _interrupted(handler_before_fit):
            raise KeyboardInterrupt
    trials = summarize(prepared.uri, cfg, results, space)
    best = best_trial(trials, cfg.tune.mode)
    registered = None
    if best is not None:
        from ray.train import Checkpoint

        best_cfg = apply(cfg, best["params"])[0]
        registered = publish(best_cfg, tracking.Run(prepared.uri, best["run_id"]), Checkpoint(best["checkpoint_path"]),
                             {"val_bleu": best["val_bleu"]}, prepared.manifest, register=cfg.tracking.register,
                             create_model=prepared.target.login is None)
    log_summary(parent, cfg, trials, best, space)
    parent.end_tags.update({"best_trial": best["trial_id"] if best else "",
                            "best_val_bleu": f"{best['val_bleu']:.2f}" if best else ""})
    return trials, best, registered


def _interrupted(handler_before_fit) -> bool:
    """Whether Ctrl-C ended Tuner.fit early.

    Tune's Ctrl-C handler saves the sweep's state and makes fit() return its results as if the sweep
    were complete; it also puts back the handler it replaced, and that is the only trace it leaves.
    """
    return (threading.current_thread() is threading.main_thread()
            and os.environ.get("TUNE_DISABLE_SIGINT_HANDLER", "0") == "0"
            and signal.getsignal(signal.SIGINT) is handler_before_fit)


