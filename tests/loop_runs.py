"""The training loop run in the test's own process: a context that keeps its reports and can stop it."""

from pipeline.common.messages import EARLIER_KEY
from pipeline.train.workers import TorchrunContext


class StopAfter(TorchrunContext):
    """A plain-process context that keeps every report and stops the run (like a SIGINT) after a number of
    checkpoints (never, by default)."""

    def __init__(self, root, stop_after=None):
        super().__init__(str(root))
        self.stop_after, self.checkpoints, self.reports, self.saved = stop_after, 0, [], []

    def report(self, metrics, checkpoint_dir=None):
        super().report(metrics, checkpoint_dir)
        self.reports.append(metrics)
        self.checkpoints += checkpoint_dir is not None
        if checkpoint_dir is not None:  # the reports that came with a checkpoint
            self.saved.append(metrics)
        if self.stop_after is not None and self.checkpoints >= self.stop_after:
            raise KeyboardInterrupt

    def rows(self) -> list[dict]:
        """Every progress row the loop reported, in order: those held back by a report come before it."""
        return [row for report in self.reports for row in [*report[EARLIER_KEY], report]]
