"""Ray Tune: `nmt tune` sweeps in which each trial fits the same TorchTrainer as `nmt train`."""
