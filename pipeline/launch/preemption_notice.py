"""Tell Ray that a node is about to be reclaimed: a drain with reason PREEMPTION and the notice as its deadline.

A spot node's notice reaches the machine (a Kubernetes preStop hook, a cloud's metadata endpoint), not Ray.
This passes it on, so that Ray Train tells the training loop, which checkpoints before the deadline:

    python -m pipeline.launch.preemption_notice --deadline-s 25     # this node, then wait out the notice

Ray schedules nothing new on a draining node; killing it at the deadline is the cloud's part.
"""

from __future__ import annotations

import argparse
import sys
import time


def drain_for_preemption(address: str, node_id: str, deadline_s: float, why: str = "spot node reclaimed") -> float:
    """Drain node_id (hex) of the cluster at address for preemption; returns the deadline (UNIX seconds)."""
    import ray
    from ray.core.generated import autoscaler_pb2

    deadline = time.time() + deadline_s
    accepted, refusal = ray._raylet.GcsClient(address=address).drain_node(
        node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"), why, int(deadline * 1000))
    if not accepted:
        raise RuntimeError(f"Ray refused to drain node {node_id[:8]}: {refusal}")
    return deadline


def main(argv: list[str] | None = None) -> int:
    """Drain the node this process runs on (or --node-id) and wait until the deadline."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.launch.preemption_notice", description=main.__doc__)
    parser.add_argument("--deadline-s", type=float, required=True, help="seconds until the node is reclaimed")
    parser.add_argument("--address", default="auto", help="the Ray cluster (default: the one this node is in)")
    parser.add_argument("--node-id", help="hex id of the node to drain (default: this one)")
    parser.add_argument("--no-wait", action="store_true", help="return at once instead of at the deadline")
    args = parser.parse_args(argv)
    import ray

    ray.init(address=args.address, log_to_driver=False, logging_level="ERROR")
    try:
        node_id = args.node_id or ray.get_runtime_context().get_node_id()
        gcs_address = ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
    try:
        deadline = drain_for_preemption(gcs_address, node_id, args.deadline_s)
    except RuntimeError as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 1
    print(f"node {node_id[:8]} drained for preemption; deadline in {args.deadline_s:g}s", file=sys.stderr)
    if not args.no_wait:  # a preStop hook that returns lets Kubernetes stop the pod before the checkpoint
        time.sleep(max(0.0, deadline - time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
