"""Download Multi30k (task 1, raw text) into data/multi30k/ for the tests and benchmarks: `make data`.

The files come from the public multi30k/dataset repository (data/task1/raw/*.gz) and are checked
against tools/multi30k.sha256 before they are renamed into place, so a partial or altered download
never looks like the corpus. Tests find the folder on their own (see tests/conftest.py).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
CHECKSUMS = Path(__file__).with_name("multi30k.sha256")


def expected() -> dict[str, str]:
    """File name -> SHA-256 of the uncompressed file."""
    pairs = (line.split() for line in CHECKSUMS.read_text().splitlines() if line.strip())
    return {name: digest for digest, name in pairs}


def fetch(name: str, digest: str, base_url: str, target: Path) -> None:
    """Download name.gz, check the uncompressed bytes, and rename them to target/name."""
    url = f"{base_url}/{name}.gz"
    with urllib.request.urlopen(url, timeout=60) as response:
        text = gzip.decompress(response.read())
    actual = hashlib.sha256(text).hexdigest()
    if actual != digest:
        raise ValueError(f"{url}: SHA-256 {actual} is not the expected {digest} (tools/multi30k.sha256)")
    with tempfile.NamedTemporaryFile(dir=target, prefix=f".{name}.", delete=False) as tmp:
        tmp.write(text)
    Path(tmp.name).replace(target / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "multi30k", help="target folder")
    parser.add_argument("--base-url", default=BASE_URL, help="where the *.gz files are (default: %(default)s)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, digest in expected().items():
        path = args.out / name
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == digest:
            continue
        try:
            fetch(name, digest, args.base_url, args.out)
        except (OSError, ValueError) as err:
            print(f"get_multi30k: cannot get {name}: {err}\n  without network access, copy the corpus into "
                  f"{args.out} by hand or point NMT_MULTI30K_DIR at a copy", file=sys.stderr)
            return 1
        print(f"get_multi30k: {path}", file=sys.stderr)
    print(f"get_multi30k: Multi30k is in {args.out} (checked against {CHECKSUMS.name})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
