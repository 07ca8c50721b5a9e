"""WMT14 at full size on this machine: 4.5M hub-format pairs on S3, prepared as shipped, the base model trained,
killed and resumed; prints one JSON line of figures per stage.

The corpus: WMT14 En-De's size (4,508,785 training pairs) in the exact schema of the hub's `wmt/wmt14`
de-en Parquet files (one `translation` struct with `de` and `en` strings, three training shards),
each pair two or three Multi30k pairs joined (about 27 words a side, as WMT14's), so that almost every
pair is distinct and real words fill the 37k BPE vocabulary. It lives on a local S3 server (moto).

- generate: seconds, Parquet bytes on S3, words per side.
- prepare (at 450k training pairs, then 4.5M): `nmt prepare --config configs/wmt14_en_de.yaml` as
  shipped but for data.path and data.output_dir (37k joint BPE from a 2M-pair sample, dedup,
  max_len 256), in a subprocess on a local Ray of 2 CPUs: wall seconds, the driver's peak RSS
  (os.wait4), the largest Ray worker's peak RSS and all workers' summed, /dev/shm's peak use
  (Ray's object store), bytes written to S3; the driver's 4.5M-to-450k peak ratio.
- train: the base preset (63M parameters) on 2 CPU workers with max_tokens lowered so an update
  takes seconds, validation every 10 updates on 500 pairs; SIGKILLed once its first checkpoint is
  registered on S3, then the same command again, which resumes from it to update 20.
- checkpoint: its bytes on S3, the seconds to upload and download it (pyarrow's S3 client, as
  Ray Train uses) and to torch.load it.

    python benchmarks/wmt14_rehearsal.py --out benchmarks/wmt14_rehearsal.json   # about an hour on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import ray_workers  # noqa: E402

sys.path.insert(0, str(REPO_ROOT))
from pipeline.data.manifest import load_manifest  # noqa: E402

WMT14_TRAIN_PAIRS = 4_508_785
EVAL_PAIRS = 500  # validation and test (newstest's 3,000 would take most of the run to decode on a CPU)
# Progress lines whose first appearance times a stage (seconds since the command started).
MARKS = {"pairs_read": r"pairs read", "tokenizer_trained": r"SentencePiece \w+: vocabulary",
         "prepared": r"\] done in ", "first_update": r"step 1/", "resumed": r"resumed from step",
         "checkpoint_reported": r"validation at step"}
SCHEMA = pa.schema([("translation", pa.struct([("de", pa.string()), ("en", pa.string())]))])


def multi30k_dir() -> Path:
    return Path(os.environ.get("NMT_MULTI30K_DIR", REPO_ROOT.parent / "shared" / "data" / "multi30k"))


def hub_pairs(en: pa.Array, de: pa.Array, count: int, seed: int) -> pa.Table:
    """`count` pairs in the hub's schema, each 2 or 3 random Multi30k pairs joined (about 27 words a side)."""
    rng = np.random.default_rng(seed)
    picks = [rng.integers(0, len(en), count) for _ in range(3)]
    third = rng.random(count) < 0.3

    def side(column: pa.Array) -> pa.Array:
        joined = pc.binary_join_element_wise(column.take(picks[0]), column.take(picks[1]), " ")
        longer = pc.binary_join_element_wise(joined, column.take(picks[2]), " ")
        return pc.if_else(pa.array(third), longer, joined)

    translation = pa.StructArray.from_arrays([side(de), side(en)], ["de", "en"])
    return pa.table({"translation": translation}, schema=SCHEMA)


def generate(root: str, train_pairs: int, shards: int, seed: int) -> dict:
    """The corpus under root (a storage URI) as de-en/{train-0000i-of-0000n,validation-...,test-...}.parquet."""
    fs, base = pafs.FileSystem.from_uri(root)
    data = multi30k_dir()
    en = pa.array((data / "train.en").read_text(encoding="utf-8").splitlines())
    de = pa.array((data / "train.de").read_text(encoding="utf-8").splitlines())
    started, words = time.perf_counter(), {}
    files = [(f"train-{i:05d}-of-{shards:05d}", train_pairs // shards + (i < train_pairs % shards))
             for i in range(shards)]
    files += [("validation-00000-of-00001", EVAL_PAIRS), ("test-00000-of-00001", EVAL_PAIRS)]
    fs.create_dir(f"{base}/de-en", recursive=True)  # a no-op on object stores
    for number, (name, count) in enumerate(files):
        table = hub_pairs(en, de, count, seed + number)
        if number == 0:
            for lang in ("en", "de"):
                text = pc.struct_field(table["translation"], lang)
                words[lang] = round(float(pc.mean(pc.list_value_length(pc.split_pattern(text, " "))).as_py()), 1)
        pq.write_table(table, f"{base}/de-en/{name}.parquet", filesystem=fs, row_group_size=100_000)
    return {"seconds": round(time.perf_counter() - started, 1), "train_pairs": train_pairs,
            "parquet_mib": round(s3_bytes(root) / 2**20, 1), "words_per_side": words}


def s3_bytes(uri: str) -> int:
    """Bytes of every object under a storage URI."""
    fs, path = pafs.FileSystem.from_uri(uri)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sum(info.size for info in infos if info.type == pafs.FileType.File)


def run_measured(command: list[str], stop_when=None, log: Path | None = None) -> dict:
    """Run a command: wall seconds, its peak RSS, Ray workers' peak RSS (largest one, summed), /dev/shm's peak use.

    stop_when: polled every 0.5 s; once true the command's process group is SIGKILLed (a lost driver).
    """
    peaks = {"worker": 0, "workers": 0, "shm": 0}
    shm_before = shutil.disk_usage("/dev/shm").used
    done = threading.Event()

    def sample():
        while not done.wait(0.5):
            rss = []
            for proc in ray_workers():
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    rss.append(proc.memory_info().rss)
            peaks["worker"] = max(peaks["worker"], max(rss, default=0))
            peaks["workers"] = max(peaks["workers"], sum(rss))
            peaks["shm"] = max(peaks["shm"], shutil.disk_usage("/dev/shm").used - shm_before)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    marks: dict[str, float] = {}

    def copy_output():  # each line with its time since the start, and when each MARKS line first came
        with open(log or os.devnull, "w") as sink:
            for line in proc.stdout:
                elapsed = time.perf_counter() - started
                sink.write(f"[{elapsed:7.1f}s] {line}")
                sink.flush()
                for name, pattern in MARKS.items():
                    if name not in marks and re.search(pattern, line):
                        marks[name] = round(elapsed, 1)

    copier = threading.Thread(target=copy_output, daemon=True)
    copier.start()
    sampler.start()
    killed = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if stop_when is not None and not killed and stop_when():
            # A lost machine: the driver and the local Ray it started (raylet, GCS, workers) die at once.
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            for victim in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    victim.kill()
            killed = True
        time.sleep(0.5)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    copier.join(30)
    if status and not killed:
        tail = log.read_text()[-3000:] if log else ""
        raise SystemExit(f"{' '.join(command)} failed:\n{tail}")
    return {"seconds": round(seconds, 1), "driver_peak_rss_mib": round(usage.ru_maxrss / 1024),
            "worker_peak_rss_mib": round(peaks["worker"] / 2**20),
            "workers_peak_rss_mib": round(peaks["workers"] / 2**20),
            "object_store_peak_mib": round(peaks["shm"] / 2**20), "killed": killed, "seconds_at": marks}


def nmt(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", *args]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=WMT14_TRAIN_PAIRS, help="training pairs of the large corpus")
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=1024, help="tokens per batch per worker (CPU-sized)")
    parser.add_argument("--out", help="also write the JSON, indented, here")
    args = parser.parse_args(argv)
    if not (multi30k_dir() / "train.en").is_file():
        raise SystemExit(f"Multi30k not found at {multi30k_dir()}; set NMT_MULTI30K_DIR")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="wmt14", AWS_SECRET_ACCESS_KEY="wmt14",
                      AWS_DEFAULT_REGION="us-east-1", AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    os.environ.pop("RAY_ADDRESS", None)  # each command starts a local Ray of its own
    tmp = Path(tempfile.mkdtemp(prefix="wmt14-rehearsal-"))
    s3 = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, start_new_session=True)
    result: dict = {"benchmark": "wmt14_rehearsal", "cpu_count": os.cpu_count()}

    def stage(name: str, figures: dict) -> None:
        """Record a stage's figures, on stderr and (so that a run cut short keeps them) in --out."""
        result[name] = figures
        print(f"{name}: {figures}", file=sys.stderr, flush=True)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    try:
        time.sleep(3)
        import boto3

        boto3.client("s3").create_bucket(Bucket="wmt")
        for name, pairs, shards in (("small", args.pairs // 10, 1), ("large", args.pairs, 3)):
            stage(f"generate_{name}", generate(f"s3://wmt/{name}", pairs, shards, seed=14))
        for name in ("small", "large"):
            out = f"s3://wmt/prepared-{name}"
            figures = run_measured(nmt("prepare", "--config", "configs/wmt14_en_de.yaml", "--set",
                                       f"data.path=s3://wmt/{name}", "--set", f"data.output_dir={out}"),
                                   log=tmp / f"prepare-{name}.log")
            figures["s3_written_mib"] = round(s3_bytes(out) / 2**20, 1)
            manifest = load_manifest(_dataset_dir(out)).content  # the published version, through the pointer
            figures["train_pairs_kept"] = manifest["splits"]["train"]["pairs"]
            figures["dropped"] = manifest["splits"]["train"]["dropped"]
            figures["vocab_size"] = manifest["tokenizer"]["src_vocab_size"]
            figures["tgt_tokens_mean"] = round(manifest["splits"]["train"]["tgt_tokens_mean"], 1)
            stage(f"prepare_{name}", figures)
        result["driver_rss_ratio_large_to_small"] = round(
            result["prepare_large"]["driver_peak_rss_mib"] / result["prepare_small"]["driver_peak_rss_mib"], 2)

        runs = "s3://wmt/runs"
        train = nmt("train", "--config", "configs/wmt14_en_de.yaml", "--set", "data.path=s3://wmt/large",
                    "--set", "data.output_dir=s3://wmt/prepared-large", "--set", "train.use_gpu=false",
                    "--set", "train.num_workers=2", "--set", f"train.max_tokens={args.max_tokens}",
                    "--set", f"train.max_steps={args.train_steps}",
                    "--set", "train.val_interval=10", "--set", "train.log_every=1", "--set", "train.beam_size=1",
                    "--set", "train.average_last=1", "--set", f"train.storage_path={runs}",
                    "--set", "train.run_name=wmt14-base", "--set", "tracking.register=false",
                    "--set", "tracking.system_metrics_s=0",
                    "--set", f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}")

        def registered() -> bool:
            fs, path = pafs.FileSystem.from_uri(f"{runs}/wmt14-base")
            infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
            return any(i.path.endswith("checkpoint_manager_snapshot.json") for i in infos)

        stage("train_until_killed", run_measured(train, stop_when=registered, log=tmp / "train-1.log"))
        figures = run_measured(train, log=tmp / "train-2.log")
        log = (tmp / "train-2.log").read_text()
        resumed = re.search(r"resumed from step (\d+)", log)
        figures["resumed_from_step"] = int(resumed.group(1)) if resumed else None
        rates = [float(m.replace(",", "")) for m in re.findall(r"step \d+/\d+ .*? ([\d,]+) tok/s", log)]
        figures["tokens_per_s_median"] = float(np.median(rates)) if rates else None
        stage("train_resumed", figures)
        stage("checkpoint", checkpoint_figures(runs, tmp))
    finally:
        s3.terminate()
        s3.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(result))


def _dataset_dir(output_dir: str) -> str:
    """The one prepared dataset under data.output_dir (prepare names it after the corpus and settings)."""
    fs, path = pafs.FileSystem.from_uri(output_dir)
    (found,) = [i.path for i in fs.get_file_info(pafs.FileSelector(path)) if i.type == pafs.FileType.Directory]
    return f"{output_dir.split('://')[0]}://{found}"


def checkpoint_figures(runs: str, tmp: Path) -> dict:
    """The newest checkpoint's bytes on S3, and seconds to download, upload and torch.load it."""
    import torch

    fs, path = pafs.FileSystem.from_uri(f"{runs}/wmt14-base")
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    model = sorted(i.path for i in infos if i.path.endswith("/model.pt"))[-1]
    directory = model.rsplit("/", 1)[0]
    size = sum(i.size for i in infos if i.path.startswith(directory + "/") and i.type == pafs.FileType.File)
    local = tmp / "checkpoint"
    local.mkdir(parents=True)
    started = time.perf_counter()
    pafs.copy_files(directory, str(local), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    download = time.perf_counter() - started
    fs.create_dir(f"{path}/upload-check", recursive=True)  # a no-op on object stores
    started = time.perf_counter()
    pafs.copy_files(str(local), f"{path}/upload-check", source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)
    upload = time.perf_counter() - started
    started = time.perf_counter()
    torch.load(local / "model.pt", map_location="cpu", weights_only=True)
    return {"mib": round(size / 2**20, 1), "download_s": round(download, 1), "upload_s": round(upload, 1),
            "torch_load_s": round(time.perf_counter() - started, 1)}


if __name__ == "__main__":
    main()
