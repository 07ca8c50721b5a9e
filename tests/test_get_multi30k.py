"""`make data`: Multi30k downloaded, checked against its checksums, and renamed into place only when it matches."""

import gzip
import shutil

import get_multi30k
from conftest import require_multi30k


def test_the_corpus_is_fetched_checked_and_a_bad_file_never_lands(tmp_path, capsys):
    corpus = require_multi30k()
    served = tmp_path / "served"  # the repository's data/task1/raw layout, as file:// URLs
    served.mkdir()
    for name in get_multi30k.expected():
        (served / f"{name}.gz").write_bytes(gzip.compress((corpus / name).read_bytes()))
    out = tmp_path / "data" / "multi30k"
    assert get_multi30k.main(["--out", str(out), "--base-url", served.as_uri()]) == 0
    for name in get_multi30k.expected():
        assert (out / name).read_bytes() == (corpus / name).read_bytes()

    (out / "val.de").unlink()
    (served / "val.de.gz").write_bytes(gzip.compress(b"altered\n"))
    assert get_multi30k.main(["--out", str(out), "--base-url", served.as_uri()]) == 1
    err = capsys.readouterr().err
    assert "cannot get val.de" in err and "is not the expected" in err
    assert not (out / "val.de").exists() and not list(out.glob(".val.de.*"))  # nothing half-written
    shutil.rmtree(served)
    assert get_multi30k.main(["--out", str(out), "--base-url", served.as_uri()]) == 1  # files there are kept
    assert "cannot get val.de" in capsys.readouterr().err
