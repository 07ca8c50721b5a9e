"""A replica's checkpoints: saved with every validation's report (and every train.checkpoint_every updates, and
on a preemption notice), the newest loadable one restored on a restart, and the last few validations' weights
kept for averaging (Sec. 6.1).

    checkpointer = Checkpointer(updater, tokenizer, model_cfg, cfg, ctx)
    restored = checkpointer.restore(attempt)          # None on a fresh start
    directory = checkpointer.save(progress, metrics, earlier)
    checkpointer.keep_snapshot(); checkpointer.average()
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model import TransformerConfig, average_checkpoints

from ..common import checkpoint, log, storage
from ..common.errors import UserError
from ..common.messages import Restart
from ..config import TrainConfig
from ..text.tokenizer import Tokenizer
from . import elastic
from .progress import Progress
from .updater import Updater
from .workers import WorkerContext

logger = log.get("train")


@dataclass(frozen=True)
class Restored:
    """What a restart brings back besides the weights: where training stood, why it restarted, and the values of
    the checkpoint's own report, sent again with the next one (a run killed after the checkpoint was saved but
    before Ray Train's controller logged its report would otherwise leave a gap; MLflow keeps a value once)."""

    progress: Progress
    restart: Restart
    replayed: list[dict]


class Checkpointer:
    """Saves and restores a replica's state; rank 0 writes the model and optimizer, every rank its RNG streams."""

    def __init__(self, updater: Updater, tokenizer: Tokenizer, model_cfg: TransformerConfig, cfg: TrainConfig,
                 ctx: WorkerContext):
        self.updater, self.tokenizer, self.model_cfg, self.cfg, self.ctx = updater, tokenizer, model_cfg, cfg, ctx
        self.snapshots: list[dict[str, torch.Tensor]] = []  # the last cfg.average_last weights, on the CPU

    def restore(self, attempt: str) -> Restored | None:
        """Resume from the newest checkpoint that loads (a corrupt or unsafe one is skipped with a warning)."""
        refused = []
        for directory in self.ctx.resume_candidates():
            try:  # every rank reads the same model file, so all ranks skip the same checkpoints
                state = checkpoint.load(directory, map_location=self.ctx.device)
            except UserError as err:
                refused.append(str(err))
                if self.ctx.is_main:
                    logger.warning(f"{err}; falling back to the checkpoint before it")
                continue
            return self._load(directory, state, attempt)
        if refused:
            raise UserError(f"none of this run's {len(refused)} checkpoints can be loaded ({refused[-1]}); "
                            "delete the run's directory under train.storage_path to start it over")
        return None

    def _load(self, directory: str, state: dict, attempt: str) -> Restored:
        """Weights, optimizer, schedule, progress and this rank's RNG streams from a loaded checkpoint."""
        self.updater.load(state)
        saved = state["progress"]
        progress = Progress.saved(saved)
        progress.resumed(attempt)
        restart = Restart(elastic.restart_cause(saved, self.ctx.world_size, attempt),
                          saved.get("world_size") or self.ctx.world_size, progress.step, progress.restarts)
        try:
            rng = checkpoint.load_rng(directory, self.ctx.world_rank)
        except Exception as err:  # a damaged RNG file only costs bit-exact resumption, not the run
            logger.warning(f"rank {self.ctx.world_rank}'s RNG state in {directory} cannot be loaded "
                           f"({type(err).__name__}); continuing with fresh random streams")
            rng = None
        if rng is not None:
            checkpoint.set_rng_state(rng)
        if self.ctx.is_main:
            logger.info(f"resumed from step {progress.step} (epoch {progress.epoch}, batch {progress.batch_in_epoch})"
                        f" after a {restart.cause}, on {self.ctx.world_size} worker(s) (was {restart.from_workers})")
        replayed = [*state.get("earlier", []), *([state["metrics"]] if "metrics" in state else [])]
        return Restored(progress, restart, replayed)

    def save(self, progress: Progress, metrics: dict, earlier: list[dict]) -> str:
        """A staged checkpoint of this state (every rank calls it); its directory, for Ray Train to keep."""
        directory = storage.staging_dir("nmt-ckpt-")
        state = None
        if self.ctx.is_main:
            state = {**self.updater.state(), "progress": progress.__dict__, "model_config": self.model_cfg.to_dict(),
                     "metrics": metrics, "earlier": earlier}
            self.tokenizer.save(directory)  # a checkpoint can be fine-tuned from on its own
        checkpoint.save(directory, self.ctx.world_rank, state)
        return directory

    def keep_snapshot(self) -> None:
        """Keep a copy of the current weights among the last cfg.average_last."""
        weights = {k: v.detach().to("cpu", copy=True) for k, v in self.updater.model.state_dict().items()}
        self.snapshots = [*self.snapshots, weights][-self.cfg.average_last:]

    def will_average(self) -> bool:
        """Whether average() will have two snapshots or more (the last update's is kept before its validation)."""
        return min(len(self.snapshots), self.cfg.average_last) >= 2

    def average(self) -> int:
        """Load the average of the kept snapshots into the model; how many it averaged (0: fewer than two)."""
        if len(self.snapshots) < 2:
            return 0
        self.updater.model.load_state_dict(average_checkpoints(self.snapshots))
        return len(self.snapshots)
