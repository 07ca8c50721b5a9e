"""`nmt prepare` end to end on Ray Data: Multi30k counts, round trips, cache reuse, nothing half-written."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import ray

from pipeline.common.errors import CorpusError
from pipeline.config import DataConfig, load_config
from pipeline.data.encode import EncodeBatch, encode_table, length_counts, normalize
from pipeline.data.kinds.files import LineFiles
from pipeline.data.manifest import load_manifest
from pipeline.data.prepare import prepare, split_entries
from pipeline.data.sources import BLOCK_PAIRS, TableSource, labeled, plan_blocks, ray_tasks
from pipeline.text.tokenizer import train_tokenizer

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def multi30k(ray_session, multi30k_dir, tmp_path_factory):
    """Multi30k en-de prepared once for this module with the shipped config's defaults."""
    out = tmp_path_factory.mktemp("prepared")
    cfg = load_config(ROOT / "configs" / "multi30k_en_de.yaml",
                      [f"data.path={multi30k_dir}", f"data.output_dir={out}"]).data
    return cfg, prepare(cfg)


@pytest.mark.slow
def test_multi30k_is_prepared_end_to_end(multi30k):
    cfg, manifest = multi30k
    splits = manifest.content["splits"]
    assert splits["train"]["pairs"] >= 28_900
    assert splits["train"]["read"] == 29_000
    assert sum(splits["train"]["dropped"].values()) == 29_000 - splits["train"]["pairs"]
    assert (splits["validation"]["pairs"], splits["test"]["pairs"]) == (1014, 1000)
    tok = manifest.content["tokenizer"]
    assert tok["joint"] and tok["src_vocab_size"] == 8000 and tok["sha256"] == manifest.tokenizer().sha256()
    assert manifest.content["source_sha256"] and manifest.content["config_sha256"]
    train = pq.read_table(manifest.split_dir("train"))
    assert train.num_rows == splits["train"]["pairs"]
    assert set(train.column_names) >= {"src", "tgt", "src_ids", "tgt_ids", "src_len", "tgt_len"}
    assert max(train.column("tgt_len").to_pylist()) <= cfg.max_len
    # The statistics come back from the tasks as length counts; they match the pairs written.
    assert splits["train"]["tgt_tokens"] == pc.sum(train["tgt_len"]).as_py()
    assert splits["train"]["src_tokens_max"] == pc.max(train["src_len"]).as_py()


@pytest.mark.slow
def test_decoding_the_ids_gives_back_the_normalized_text(multi30k, multi30k_dir):
    _, manifest = multi30k
    tokenizer = manifest.tokenizer()
    test = pq.read_table(manifest.split_dir("test")).to_pydict()
    raw = (multi30k_dir / "test_2016_flickr.de").read_text(encoding="utf-8").split("\n")[:1000]
    assert test["tgt"] == [normalize(line) for line in raw]  # order kept, nothing dropped
    assert tokenizer.decode_tgt(test["tgt_ids"]) == test["tgt"]
    assert [tokenizer.src.decode(ids) for ids in test["src_ids"][:200]] == test["src"][:200]
    assert all(3 not in ids and 2 not in ids for ids in test["tgt_ids"])  # no bos/eos stored


@pytest.mark.slow
def test_identical_inputs_reuse_the_prepared_data_and_changes_prepare_anew(multi30k, capfd):
    cfg, manifest = multi30k
    again = prepare(cfg)
    assert again.path == manifest.path and "reusing" in capfd.readouterr().err
    changed = prepare(DataConfig(**{**cfg.__dict__, "max_len": 40}))
    assert changed.path != manifest.path
    assert changed.content["splits"]["train"]["dropped"]["too_long"] > 0
    assert changed.content["splits"]["validation"]["pairs"] == 1014  # filters touch train only


@pytest.mark.slow
def test_a_split_empty_after_cleaning_fails_and_leaves_nothing_behind(ray_session, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for stem in ("train", "val"):
        (corpus / f"{stem}.en").write_text("a b c d e f g h i j k l\n   \n", encoding="utf-8")
        (corpus / f"{stem}.de").write_text("x\nnot empty\n", encoding="utf-8")
    out = tmp_path / "out"
    cfg = DataConfig(source="files", path=str(corpus), output_dir=str(out), vocab_size=60, max_len_ratio=2.0,
                     splits={"train": "train", "validation": "val"})
    with pytest.raises(CorpusError, match=r"split 'train' is empty after cleaning .*'empty': 1.*'ratio': 1"):
        prepare(cfg)
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("train_en, train_de, expected", [
    ("", "", r"split 'train' of the corpus is empty: read .*train\.en, .*train\.de \(0 lines each\)"),
    ("\n  \n", "a\n\n", r"cannot train the tokenizer: no training pair sampled from .*train\.en, .*train\.de "
                          r"\(2 lines each\) has text on both sides"),
])
@pytest.mark.slow
def test_an_empty_or_blank_training_split_names_its_files_and_their_lines(ray_session, tmp_path, train_en, train_de,
                                                                           expected):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.en").write_text(train_en, encoding="utf-8")
    (corpus / "train.de").write_text(train_de, encoding="utf-8")
    (corpus / "val.en").write_text("a b\n", encoding="utf-8")
    (corpus / "val.de").write_text("x y\n", encoding="utf-8")
    cfg = DataConfig(source="files", path=str(corpus), output_dir=str(tmp_path / "out"), vocab_size=60,
                     splits={"train": "train", "validation": "val"})
    with pytest.raises(CorpusError, match=expected):
        prepare(cfg)


@pytest.mark.slow
def test_demo_corpus_is_prepared_with_its_statistics(ray_session, tmp_path):
    cfg = DataConfig(output_dir=str(tmp_path), vocab_size=1000,
                     demo_sizes={"train": 3000, "validation": 200, "test": 200})
    manifest = prepare(cfg)
    splits = manifest.content["splits"]
    assert splits["train"]["read"] == 3000 and splits["validation"]["pairs"] == 200
    assert 10 < splits["train"]["tgt_tokens_mean"] < 40
    written = tmp_path / manifest.path.rsplit("/", 1)[-1] / "manifest.json"
    assert json.loads(written.read_text())["source"] == "demo"
    assert load_manifest(manifest.path).sha256 == manifest.sha256


def _shards(manifest, split: str) -> dict[str, object]:
    """File name -> table of each Parquet shard of a split."""
    directory = Path(manifest.split_dir(split))
    return {f.name: pq.read_table(f) for f in sorted(directory.glob("*.parquet"))}


@pytest.mark.slow
def test_num_shards_sets_the_files_per_split_and_the_same_inputs_write_the_same_files(ray_session, tmp_path):
    cfg = DataConfig(output_dir=str(tmp_path), vocab_size=1000, num_shards=3,
                     demo_sizes={"train": 3000, "validation": 200, "test": 200})
    first = {split: _shards(prepare(cfg), split) for split in ("train", "validation", "test")}
    again = prepare(cfg, force=True)
    for split, shards in first.items():
        assert len(shards) == 3
        rows = sorted(row for table in shards.values() for row in table.column("row").to_pylist())
        assert rows == list(range(again.content["splits"][split]["read"]))  # every pair once, none dropped
        second = _shards(again, split)
        assert list(second) == list(shards)  # names do not depend on scheduling
        assert all(second[name].equals(table) for name, table in shards.items())


@pytest.mark.slow
def test_force_replaces_the_data_and_shards_that_differ_from_the_manifest_are_refused(ray_session, tmp_path):
    cfg = DataConfig(output_dir=str(tmp_path), vocab_size=1000, num_shards=2,
                     demo_sizes={"train": 3000, "validation": 200, "test": 200})
    first = prepare(cfg)
    listed = first.content["splits"]["train"]["files"]
    assert len(listed) == 2 and sum(f["rows"] for f in listed.values()) == first.content["splits"]["train"]["pairs"]
    again = prepare(cfg, force=True)
    assert again.content["created_s"] > first.content["created_s"]  # the new preparation, not the old one kept
    assert sorted(p.name for p in tmp_path.iterdir()) == [Path(again.path).name]  # nothing left beside it
    train = Path(again.split_dir("train"))
    shard = sorted(train.glob("*.parquet"))[0]
    data = shard.read_bytes()
    (train / "extra.parquet").write_bytes(data)  # e.g. left by an earlier preparation cut for more workers
    with pytest.raises(CorpusError, match="extra.parquet is not in the manifest"):
        prepare(cfg)
    (train / "extra.parquet").unlink()
    shard.write_bytes(data[: len(data) // 2])  # cut short
    with pytest.raises(CorpusError, match=f"{shard.name} has {len(data) // 2:,} bytes"):
        prepare(cfg)
    assert prepare(cfg, force=True).content["splits"]["train"]["files"] == again.content["splits"]["train"]["files"]


@pytest.mark.slow
def test_a_file_uri_output_dir_prepares_and_publishes_on_that_volume(ray_session, tmp_path, monkeypatch):
    """data.output_dir=file://PATH (a volume every node mounts, as the cluster guides name it) is that directory."""
    monkeypatch.chdir(tmp_path)  # nothing may land in a relative "file:" directory here
    cfg = DataConfig(output_dir=f"file://{tmp_path / 'shared'}", vocab_size=600,
                     demo_sizes={"train": 2000, "validation": 100, "test": 100})
    manifest = prepare(cfg)
    published = [p.name for p in (tmp_path / "shared").iterdir()]
    assert len(published) == 1 and not published[0].startswith(".tmp-") and not (tmp_path / "file:").exists()
    assert (tmp_path / "shared" / published[0] / "manifest.json").is_file()
    assert prepare(cfg).content["created_s"] == manifest.content["created_s"]  # found again, not redone


def _pairs(n: int) -> pa.Table:
    return pa.table({"src": pa.array(["ein satz"] * n), "tgt": pa.array(["a sentence"] * n)})


def test_blocks_run_over_all_splits_in_whole_waves_and_hold_every_pair_once():
    counts = {"train": 2 * BLOCK_PAIRS + 5, "validation": 1014, "test": 1000}
    plan = plan_blocks(counts, None, num_cpus=2)
    sizes = [sum(rows for _, _, rows in block) for block in plan]
    assert len(plan) == 4 and max(sizes) <= BLOCK_PAIRS and max(sizes) - min(sizes) <= 3  # equal tasks
    labels = [(split, row) for block in plan for split, first, rows in block for row in range(first, first + rows)]
    assert labels == [(split, row) for split, n in counts.items() for row in range(n)]
    assert {"validation", "test"} <= {split for split, _, _ in plan[-1]}  # the small splits share a task
    per_split = plan_blocks(counts, 3, num_cpus=2)  # num_shards: each split cut on its own
    assert [[split for split, _, _ in block] for block in per_split] == \
        [["train"]] * 3 + [["validation"]] * 3 + [["test"]] * 3


@pytest.mark.slow
def test_line_files_read_on_ray_by_line_ranges_give_the_pairs_read_in_one_piece(ray_session, tmp_path):
    # Tiny scan ranges and a sparse index every 7 lines: blocks start and end inside ranges.
    lines = [f"satz {i} \u00e4\u2028x" if i % 5 else f"satz {i}" for i in range(500)]
    (tmp_path / "train.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "train.de").write_bytes("\r\n".join(line.upper() for line in lines).encode())  # CRLF, no last \n
    for lang in ("en", "de"):
        (tmp_path / f"val.{lang}").write_text("a\nb\n", encoding="utf-8")
    cfg = DataConfig(source="files", path=str(tmp_path), splits={"train": "train", "validation": "val"})
    source = LineFiles().opened(cfg, *ray_tasks(here=True), chunk_bytes=100, stride=7)
    assert source.counts == {"train": 500, "validation": 2}
    plan = [[("train", 0, 13)], [("train", 13, 300), ("validation", 0, 2)], [("train", 313, 187)]]
    rows = pa.concat_tables(ray.get(source.dataset(plan).to_arrow_refs()))
    whole = pa.concat_tables([labeled(pa.table({"src": lines, "tgt": [line.upper() for line in lines]}), "train", 0),
                              labeled(pa.table({"src": ["a", "b"], "tgt": ["a", "b"]}), "validation", 0)])
    assert rows.sort_by([("split", "ascending"), ("row", "ascending")]).equals(whole.select(rows.column_names))
    sample = source.sample([0, 6, 7, 250, 499])
    assert sample.column("src").to_pylist() == [lines[i] for i in (0, 6, 7, 250, 499)]
    table = TableSource({"train": whole.slice(0, 500).select(["src", "tgt"])})
    assert table.sample([0, 6, 7, 250, 499]).equals(sample)


def test_manifest_statistics_from_length_counts_equal_those_of_the_pairs():
    rng = np.random.default_rng(0)
    n = 5000
    encoded = pa.table({
        "split": rng.choice(["train", "validation"], n), "drop": rng.choice(["", "", "", "too_long", "ratio"], n),
        "src_len": rng.integers(1, 80, n).astype(np.int32), "tgt_len": rng.integers(1, 90, n).astype(np.int32),
    })
    counts = pa.concat_tables([length_counts(encoded.slice(0, 2000)), length_counts(encoded.slice(2000))])
    assert counts.num_rows < n  # counted, not one row per pair
    read = {split: int((encoded["split"].to_numpy(zero_copy_only=False) == split).sum())
            for split in ("train", "validation")}
    entries = split_entries(read, counts)
    for split, entry in entries.items():
        mine = encoded.filter(pc.equal(encoded["split"], split))
        drops = mine["drop"].to_numpy(zero_copy_only=False)
        tgt = mine["tgt_len"].to_numpy()[drops == ""]
        assert entry.pairs == len(tgt) and entry.dropped["ratio"] == int((drops == "ratio").sum())
        assert entry.tgt_tokens == tgt.sum() and entry.tgt_tokens_max == tgt.max()
        assert entry.tgt_tokens_p99 == np.percentile(tgt, 99)
        assert entry.src_tokens_mean == mine["src_len"].to_numpy()[drops == ""].mean()


def test_a_block_is_encoded_in_slices_and_an_empty_block_counts_nothing():
    tok = train_tokenizer(["ein kleiner satz"] * 20, ["a small sentence"] * 20, vocab_size=40, model_type="bpe")
    encoder = EncodeBatch(tok.src_proto, tok.tgt_proto, max_len=100, max_ratio=3.0, filter_split="train")
    block = pa.concat_tables([labeled(_pairs(10_000), "train", 0), labeled(_pairs(3), "validation", 0)])
    encoded = encode_table(block, encoder)  # 4096 pairs per call
    assert encoded["row"].to_pylist() == block["row"].to_pylist()
    assert encoded["src_ids"].to_pylist() == [tok.src.encode("ein satz")] * 10_003
    empty = length_counts(encode_table(block.slice(0, 0), encoder))
    counts = pa.concat_tables([length_counts(encoded), empty], promote_options="default")
    assert counts.num_rows == 2 and pc.sum(counts["count_all"]).as_py() == 10_003


@pytest.mark.slow
def test_dedup_drops_exact_duplicates_of_the_training_split_only(ray_session, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # Three copies of one pair once cleaned (the second differs only in spacing), two of another.
    en = ["a cat sat here", "a  cat sat here", "a dog ran far", "a cat sat here", "a dog ran far", "the end"]
    de = ["eine katze sass", "eine katze sass ", "ein hund lief", "eine katze sass", "ein hund lief", "das ende"]
    for stem, n in (("train", 6), ("val", 4)):
        (corpus / f"{stem}.en").write_text("\n".join(en[:n]) + "\n", encoding="utf-8")
        (corpus / f"{stem}.de").write_text("\n".join(de[:n]) + "\n", encoding="utf-8")
    cfg = DataConfig(source="files", path=str(corpus), output_dir=str(tmp_path / "out"), vocab_size=60,
                     dedup=True, num_shards=2, splits={"train": "train", "validation": "val"})
    manifest = prepare(cfg)
    splits = manifest.content["splits"]
    assert splits["train"]["dropped"]["duplicate"] == 3 and splits["train"]["pairs"] == 3
    train = pq.read_table(manifest.split_dir("train")).sort_by("row")
    assert train.column("src").to_pylist() == ["a cat sat here", "a dog ran far", "the end"]
    assert train.column("row").to_pylist() == [0, 2, 5]  # the earliest line of each group is kept
    assert splits["train"]["src_tokens"] == pc.sum(train["src_len"]).as_py()  # statistics of what is written
    assert len(list(Path(manifest.split_dir("train")).glob("*.parquet"))) <= 2
    assert splits["validation"]["pairs"] == 4 and splits["validation"]["dropped"]["duplicate"] == 0
    assert pq.read_table(manifest.split_dir("validation")).num_rows == 4


@pytest.mark.slow
def test_a_parquet_corpus_is_prepared_by_row_groups_in_order(ray_session, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    pairs = [{"en": f"a cat number {i} sat here", "de": f"eine katze nummer {i} sass"} for i in range(300)]
    pq.write_table(pa.table({"translation": pairs}), corpus / "train.parquet", row_group_size=37)
    pq.write_table(pa.table({"translation": pairs[:20]}), corpus / "val.parquet", row_group_size=7)
    cfg = DataConfig(source="files", format="parquet", path=str(corpus), output_dir=str(tmp_path / "out"),
                     src_field="translation.en", tgt_field="translation.de", vocab_size=80, num_shards=3,
                     splits={"train": "train", "validation": "val"})
    manifest = prepare(cfg)
    assert manifest.content["splits"]["train"]["read"] == 300
    train = pq.read_table(manifest.split_dir("train")).sort_by("row")
    assert train.column("row").to_pylist() == list(range(300))
    assert train.column("tgt").to_pylist() == [p["de"] for p in pairs]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "data.vocab_sise=8000"], "unknown key 'data.vocab_sise'; did you mean 'data.vocab_size'?"),
        (["--set", "data.source=web"], "data.source must be one of"),
        (["--set", "data.source=files", "--set", "data.path=/no/such/dir"], "is not a directory"),
        (["--config", "/no/such.yaml"], "config file /no/such.yaml does not exist"),
    ],
)
def test_cli_reports_user_mistakes_in_one_line_without_a_traceback(args, message, tmp_path):
    result = subprocess.run([sys.executable, "-m", "pipeline", "prepare", *args], capture_output=True,
                            text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
