"""Ray Train: the driver of `nmt train` (one run start-up shared with tune) and the per-worker DDP loop."""
