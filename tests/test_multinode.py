"""Two Ray nodes of 1 CPU each, one DDP worker on each: replicas stay identical and learn like one worker,
and a run that loses a whole node goes on from its last checkpoint on a replacement node.

The nodes share no local path: the prepared data and the checkpoints are on the session's S3 server.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

# Runs in its own process: a ray.cluster_utils.Cluster cannot share a process with the
# session's local Ray instance.
SCRIPT = textwrap.dedent("""
    import json, sys, threading
    import psutil
    import pyarrow.fs as pafs
    import ray
    from ray.cluster_utils import Cluster
    from mlflow.tracking import MlflowClient
    from pipeline.common import log
    from pipeline.common.checkpoint import MODEL_FILE
    from pipeline.config import load_config
    from pipeline.train.driver import train

    def checkpoints(uri):
        # Checkpoints on S3 (the directories that hold a model file), and whether Ray Train has registered
        # one: its snapshot file. A report still queued on a worker is lost with the worker group, and a
        # restart before the first registration would start from scratch.
        fs, path = pafs.FileSystem.from_uri(uri)
        files = [f.path for f in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))]
        registered = any(f.endswith("/checkpoint_manager_snapshot.json") for f in files)
        return {f.rsplit("/", 1)[0] for f in files if f.endswith("/" + MODEL_FILE)}, registered

    def lose(node):
        # A machine that dies takes all its processes along, with no time to clean up: SIGKILL the node's
        # Ray workers, then remove the node.
        raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
        started = raylet.children(recursive=True)  # the Ray workers of this node, the training rank among them
        for proc in started:
            proc.kill()
        cluster.remove_node(node)  # the raylet tells the GCS at once: no health-check timeout to wait out
        return len(started)

    def replace_a_node_after(runs, count, done, lost):
        # The node that holds rank 1 (STRICT_SPREAD) goes away with its worker; a fresh one joins.
        while not done.wait(0.5):
            stored, registered = checkpoints(runs)
            if registered and len(stored) >= count:
                lost["killed"] = lose(next(iter(cluster.worker_nodes)))
                lost["after_checkpoints"] = len(checkpoints(runs)[0])
                cluster.add_node(num_cpus=1)
                return

    out, storage = sys.argv[1], sys.argv[3]
    log.setup()  # progress lines on stderr, the workers' too


    def run():
        common = ["data.demo_sizes={train: 2000, validation: 60, test: 60}", "data.vocab_size=500",
                  "model.d_model=64", "model.d_ff=128", "model.num_heads=4", "model.num_layers=1", "model.dropout=0.0",
                  "train.max_tokens=1024", "train.warmup_steps=30", "train.max_steps=60", "train.val_interval=10",
                  "train.log_every=5", "train.beam_size=1", "train.average_last=1", "train.resource_wait_s=20",
                  f"data.output_dir={storage}/data", f"tracking.tracking_uri=sqlite:///{out}/mlflow.db"]
        results = {"nodes": len([n for n in ray.nodes() if n["Alive"]])}
        # One worker that accumulates two batches per update: what the two nodes' DDP must reproduce over
        # their first 40 updates (later, as the loss falls fast, rounding differences grow past 10%).
        cfg = load_config(sys.argv[2], common + ["train.num_workers=1", "train.update_freq=2", "train.max_steps=40",
                                                 "train.val_interval=20", f"train.storage_path={storage}/runs-one"])
        results["one_worker"] = {"loss": losses(cfg, train(cfg).run_id, "train_loss")}
        # Two nodes, one worker each, and one of them lost once two checkpoints are registered. A resumed
        # run logs the updates after its checkpoint again; the last value of each step counts.
        lost, done = {}, threading.Event()
        replacer = threading.Thread(target=replace_a_node_after, args=(f"{storage}/runs-lost", 2, done, lost))
        replacer.start()
        cfg = load_config(sys.argv[2], common + ["train.num_workers=2", "train.placement_strategy=STRICT_SPREAD",
                                                 "train.max_failures=2", f"train.storage_path={storage}/runs-lost"])
        try:
            outcome = train(cfg)
        finally:
            done.set()
            replacer.join()
        results["two_nodes"] = {"loss": losses(cfg, outcome.run_id, "train_loss"),
                                "checksum": outcome.metrics["param_checksum"], "checkpoint": outcome.checkpoint_path}
        resumed = losses(cfg, outcome.run_id, "resumed_from_step")
        results["lost_node"] = {**lost, "val_steps": [step for step, _ in losses(cfg, outcome.run_id, "val_loss")],
                                "resumed_from": [value for _, value in resumed]}
        json.dump(results, open(f"{out}/result.json", "w"))

    def losses(cfg, run_id, key):
        history = MlflowClient(cfg.tracking.tracking_uri).get_metric_history(run_id, key)
        return [(m.step, m.value) for m in sorted(history, key=lambda m: (m.timestamp, m.step))]  # as logged

    # shutdown_at_exit=False: nodes added from a thread cannot install signal handlers; the
    # script shuts the cluster down itself.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False},
                      shutdown_at_exit=False)
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address)
        run()
    finally:
        ray.shutdown()
        cluster.shutdown()
""")


def test_ddp_across_two_nodes_matches_one_worker_and_survives_losing_a_node(tmp_path, s3_bucket):
    storage = f"{s3_bucket}/multinode-{tmp_path.name}"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(ROOT / "configs" / "demo.yaml"), storage],
                          capture_output=True, text=True, timeout=900)
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
    lost = result["lost_node"]
    assert lost.get("after_checkpoints", 0) >= 2, "the node was not removed during the run"
    # From a checkpoint on S3, not from scratch: the run's metrics record the restart.
    assert lost["resumed_from"] and min(lost["resumed_from"]) >= 10, (lost, [
        line for line in (proc.stdout + proc.stderr).splitlines() if "resumed" in line or "died" in line])
    # Every validation logged once, the last one at the end of the run.
    assert len(lost["val_steps"]) == len(set(lost["val_steps"])) and max(lost["val_steps"]) == 60
