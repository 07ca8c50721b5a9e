"""Two Ray nodes of 1 CPU each, one DDP worker on each: replicas stay identical and learn like one worker.

The nodes share no local path: the prepared data and the checkpoints are on the session's S3 server.
Losing a node is tested where it is the point: a killed worker node in test_cluster_rehearsal.py,
a preempted one in test_spot.py.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]

# Runs in its own process: a ray.cluster_utils.Cluster cannot share a process with the
# session's local Ray instance.
SCRIPT = textwrap.dedent("""
    import json, sys
    import ray
    from ray.cluster_utils import Cluster
    from mlflow.tracking import MlflowClient
    from pipeline.common import log
    from pipeline.config import load_config
    from pipeline.data.prepare import prepare
    from pipeline.train.driver import train
    from pipeline.train.loop import train_loop
    from loop_runs import StopAfter

    out, storage = sys.argv[1], sys.argv[3]
    log.setup()  # progress lines on stderr, the workers' too


    def run():
        common = ["data.demo_sizes={train: 2000, validation: 60, test: 60}", "data.vocab_size=500",
                  "model.d_model=64", "model.d_ff=128", "model.num_heads=4", "model.num_layers=1", "model.dropout=0.0",
                  "train.max_tokens=1024", "train.warmup_steps=30", "train.max_steps=40", "train.val_interval=20",
                  "train.log_every=5", "train.beam_size=1", "train.average_last=1", "train.resource_wait_s=20",
                  f"data.output_dir={storage}/data", f"tracking.tracking_uri=sqlite:///{out}/mlflow.db",
                  "tracking.register=false"]
        results = {"nodes": len([n for n in ray.nodes() if n["Alive"]])}
        # The reference: the same loop as one worker in this process, accumulating two batches per update. The
        # two nodes' DDP must reproduce its first 40 updates (later, as the loss falls fast, rounding differences
        # grow past 10%).
        cfg = load_config(sys.argv[2], common + ["train.num_workers=1", "train.update_freq=2"])
        one = StopAfter(f"{out}/one-worker")
        train_loop({"config": cfg.to_dict(), "data_path": prepare(cfg.data).path}, one)
        results["one_worker"] = {"loss": [(row["step"], row["train_loss"]) for row in one.rows()
                                          if "train_loss" in row]}
        # Two nodes, one worker each (STRICT_SPREAD), on Ray Train as `nmt train` runs: the same updates over DDP.
        cfg = load_config(sys.argv[2], common + ["train.num_workers=2", "train.placement_strategy=STRICT_SPREAD",
                                                 f"train.storage_path={storage}/runs-two"])
        outcome = train(cfg)
        results["two_nodes"] = {"loss": losses(cfg, outcome.run_id, "train_loss"),
                                "checksum": outcome.metrics["param_checksum"], "checkpoint": outcome.checkpoint_path,
                                "val_steps": [step for step, _ in losses(cfg, outcome.run_id, "val_loss")]}
        json.dump(results, open(f"{out}/result.json", "w"))

    def losses(cfg, run_id, key):
        history = MlflowClient(cfg.tracking.tracking_uri).get_metric_history(run_id, key)
        return [(m.step, m.value) for m in sorted(history, key=lambda m: (m.timestamp, m.step))]  # as logged

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False},
                      shutdown_at_exit=False)  # the script shuts the cluster down itself
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address)
        run()
    finally:
        ray.shutdown()
        cluster.shutdown()
""")


def test_ddp_across_two_nodes_matches_one_worker(tmp_path, s3_bucket):
    storage = f"{s3_bucket}/multinode-{tmp_path.name}"
    path = [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]  # the script imports loop_runs
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(ROOT / "configs" / "demo.yaml"), storage],
                          capture_output=True, text=True, timeout=900, env=env)
    (tmp_path / "output.log").write_text(proc.stdout + proc.stderr)  # for a failure's post-mortem
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["nodes"] == 2
    assert result["two_nodes"]["checkpoint"].removeprefix("s3://").startswith(storage.removeprefix("s3://"))
    # The run would have failed at validation if the replicas' parameters differed.
    assert result["two_nodes"]["checksum"] != 0
    one = dict(result["one_worker"]["loss"])
    two = {step: loss for step, loss in result["two_nodes"]["loss"] if step <= max(one)}  # a step's last value
    assert sorted(two) == sorted(one) and len(two) >= 8
    for step in two:
        assert abs(two[step] - one[step]) <= 0.1 * one[step], (step, two[step], one[step])
    assert two[max(two)] < two[min(two)] - 0.5  # and both actually learn
    assert result["two_nodes"]["val_steps"] == [20, 40]
