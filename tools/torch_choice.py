"""Say which build of torch `make setup` is about to install, and how to choose another, before it downloads.

    python tools/torch_choice.py "torch==2.13.0" [INDEX_URL]

PyPI's torch for Linux x86_64 is the CUDA build, several GB with its nvidia-* packages; PyTorch's own
CPU index has a build of about 200 MB. pip is asked what it would install (--dry-run), nothing more.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def planned(spec: str, index: str | None) -> list[dict]:
    """What pip would install for the spec: the report's entries (name, version, where from)."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", spec]
    if index:
        command += ["--index-url", index]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return []
    return json.loads(done.stdout or "{}").get("install", [])


def main(argv: list[str]) -> int:
    spec, index = argv[0], (argv[1] if len(argv) > 1 and argv[1] else None)
    entries = planned(spec, index)
    torch = next((e for e in entries if e["metadata"]["name"].lower() == "torch"), None)
    if torch is None:
        print(f"make setup: {spec} is installed already, or pip could not say where from; installing it")
        return 0
    url = torch.get("download_info", {}).get("url", "")
    cuda = [e["metadata"]["name"] for e in entries if e["metadata"]["name"].lower().startswith("nvidia-")]
    where = "a wheel on this machine" if url.startswith("file:") else url.split("/")[2] if "//" in url else url
    build = f"the CUDA build with {len(cuda)} nvidia-* packages (several GB)" if cuda else "a build without CUDA"
    print(f"make setup: torch {torch['metadata']['version']} from {where}: {build}")
    no_gpu = platform.system() == "Linux" and shutil.which("nvidia-smi") is None
    if cuda and no_gpu:
        print(f"make setup: this machine has no NVIDIA GPU; for the CPU build (about 200 MB) stop here (Ctrl-C) and "
              f"run: make setup TORCH_INDEX={CPU_INDEX}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
