"""Reading corpora strictly: every bad input is a one-line error naming file and line, pairing never shifts."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.common.errors import CorpusError
from pipeline.config import DataConfig
from pipeline.data.kinds import registry
from pipeline.data.kinds.files import LineFiles, ParquetFiles
from pipeline.data.kinds.registry import read_corpus, source_fingerprint
from pipeline.data.textfiles import LineFormat, index_file, read_lines, read_lines_at, run_here


def files_config(tmp_path, **overrides):
    values = dict(source="files", path=str(tmp_path), splits={"train": "train", "validation": "val"})
    values.update(overrides)
    return DataConfig(**values)


def write_pair(tmp_path, stem, src: bytes, tgt: bytes):
    (tmp_path / f"{stem}.en").write_bytes(src)
    (tmp_path / f"{stem}.de").write_bytes(tgt)


def test_each_kind_a_config_can_name_is_registered_under_that_name_and_no_other_is():
    assert set(registry.registered()) == registry.configured_names() == {"demo", "hf", "text", "tsv", "jsonl",
                                                                          "parquet"}
    assert type(registry.kind_of(DataConfig(source="files", format="jsonl"))) is LineFiles
    assert type(registry.kind_of(DataConfig(source="files", format="parquet"))) is ParquetFiles
    assert type(registry.kind_of(DataConfig(source="demo", format="parquet"))).__name__ == "DemoCorpus"
    with pytest.raises(ValueError, match="'parquet' is registered twice"):
        registry.kind("parquet")(LineFiles)
    with pytest.raises(CorpusError, match=r"no kind of corpus is registered as 'csv' .* \['demo', 'hf', 'jsonl'"):
        registry.kind_of(DataConfig(source="files", format="csv"))  # a config built in code: no Literal check


def test_line_breaks_other_than_newline_never_shift_the_pairing(tmp_path):
    # CRLF, a BOM, and U+2028 / U+0085 inside lines: str.splitlines() would split on the last two.
    src = "\ufeffone\r\ntwo\u2028still two\r\nthree\x85still three\n".encode()
    tgt = b"eins\ntwo de\ndrei\n"
    write_pair(tmp_path, "train", src, tgt)
    assert read_lines(tmp_path / "train.en") == ["one", "two\u2028still two", "three\x85still three"]
    write_pair(tmp_path, "val", b"a\n", b"b\n")
    table = read_corpus(files_config(tmp_path))["train"]
    assert table.column("tgt").to_pylist() == ["eins", "two de", "drei"]
    assert table.num_rows == 3


@pytest.mark.parametrize(
    "src, tgt, expected",
    [
        (b"a\nb\nc\n", b"x\ny\n", r"train\.en has 3 lines, .*train\.de has 2"),
        (b"ok\nbad \xff byte\n", b"x\ny\n", r"train\.en:2: invalid UTF-8"),
        (b"ok\nfine\nnul\x00here\n", b"x\ny\nz\n", r"train\.en:3: NUL byte"),
    ],
    ids=["line-counts", "utf8", "nul"],
)
def test_bad_parallel_files_name_the_file_and_line(tmp_path, src, tgt, expected):
    write_pair(tmp_path, "train", src, tgt)
    write_pair(tmp_path, "val", b"a\n", b"b\n")
    with pytest.raises(CorpusError, match=expected):
        read_corpus(files_config(tmp_path))


def test_bad_utf8_can_be_replaced_instead(tmp_path):
    write_pair(tmp_path, "train", b"bad \xff byte\n", b"ok\n")
    write_pair(tmp_path, "val", b"a\n", b"b\n")
    table = read_corpus(files_config(tmp_path, on_bad_utf8="replace"))["train"]
    assert table.column("src").to_pylist() == ["bad \ufffd byte"]


def test_missing_files_and_unknown_languages_are_named(tmp_path):
    write_pair(tmp_path, "train", b"a\n", b"b\n")
    with pytest.raises(CorpusError, match=r"val\.en: file not found; files there: train\.de, train\.en"):
        read_corpus(files_config(tmp_path))
    write_pair(tmp_path, "val", b"a\n", b"b\n")
    with pytest.raises(CorpusError, match=r"train\.xx: file not found"):
        read_corpus(files_config(tmp_path, tgt_lang="xx"))
    with pytest.raises(CorpusError, match="not a directory"):
        read_corpus(files_config(tmp_path / "nowhere"))
    with pytest.raises(CorpusError, match="two languages"):
        read_corpus(files_config(tmp_path, tgt_lang="en"))
    with pytest.raises(CorpusError, match="unknown split"):
        read_corpus(files_config(tmp_path, splits={"train": "train", "validation": "val", "dev": "x"}))


def test_tsv_and_jsonl_errors_name_the_line(tmp_path):
    (tmp_path / "train.tsv").write_text("a\tb\nonly one column\n", encoding="utf-8")
    (tmp_path / "val.tsv").write_text("a\tb\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"train\.tsv:2: expected 2 tab-separated columns"):
        read_corpus(files_config(tmp_path, format="tsv"))
    (tmp_path / "train.jsonl").write_text('{"en": "a", "de": "b"}\n{"en": "c"\n', encoding="utf-8")
    (tmp_path / "val.jsonl").write_text('{"en": "a", "de": "b"}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"train\.jsonl:2: invalid JSON"):
        read_corpus(files_config(tmp_path, format="jsonl"))
    (tmp_path / "train.jsonl").write_text('{"en": "a", "de": "b"}\n{"en": "c", "fr": "d"}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"train\.jsonl:2: field 'de' is missing"):
        read_corpus(files_config(tmp_path, format="jsonl"))


def test_tsv_jsonl_and_parquet_sources_read_the_same_pairs(tmp_path):
    pairs = [("A dog runs.", "Ein Hund rennt."), ("Two cats.", "Zwei Katzen.")]
    for stem in ("train", "val"):
        (tmp_path / f"{stem}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
        (tmp_path / f"{stem}.jsonl").write_text(
            "".join(json.dumps({"translation": {"en": s, "de": t}}) + "\n" for s, t in pairs), encoding="utf-8")
        pq.write_table(pa.table({"translation": [{"en": s, "de": t} for s, t in pairs]}),
                       tmp_path / f"{stem}.parquet")
    nested = dict(src_field="translation.en", tgt_field="translation.de")
    for cfg in (files_config(tmp_path, format="tsv"), files_config(tmp_path, format="jsonl", **nested),
                files_config(tmp_path, format="parquet", **nested)):
        table = read_corpus(cfg)["train"]
        assert list(zip(table.column("src").to_pylist(), table.column("tgt").to_pylist())) == pairs


def test_hugging_face_saved_dataset_with_a_field_mapping(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"translation": [{"en": "A house.", "de": "Ein Haus."}, {"en": "A tree.", "de": "Ein Baum."}]}
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows),
                               "validation": datasets.Dataset.from_dict(rows)})
    dd.save_to_disk(str(tmp_path / "hf"))
    cfg = DataConfig(source="hf", path=str(tmp_path / "hf"), src_field="translation.en",
                     tgt_field="translation.de", splits={"train": "train", "validation": "validation"})
    table = read_corpus(cfg)["validation"]
    assert table.column("tgt").to_pylist() == ["Ein Haus.", "Ein Baum."]
    with pytest.raises(CorpusError, match="no split 'test'"):
        read_corpus(DataConfig(**{**cfg.__dict__, "splits": {"train": "train", "validation": "test"}}))


def test_source_fingerprint_follows_file_contents(tmp_path):
    write_pair(tmp_path, "train", b"a\n", b"b\n")
    write_pair(tmp_path, "val", b"a\n", b"b\n")
    cfg = files_config(tmp_path)
    first = source_fingerprint(cfg)
    assert source_fingerprint(cfg) == first
    write_pair(tmp_path, "train", b"a\n", b"c\n")
    assert source_fingerprint(cfg) != first


WMT14_CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "wmt14_en_de.yaml")


def test_the_wmt14_config_reads_the_hubs_parquet_shards(tmp_path):
    """configs/wmt14_en_de.yaml as shipped, pointed at a copy of wmt/wmt14's de-en Parquet files."""
    from pipeline.config import load_config

    schema = pa.schema([("translation", pa.struct([("de", pa.string()), ("en", pa.string())]))])
    files = {"train-00000-of-00002": range(0, 3), "train-00001-of-00002": range(3, 5),
             "validation-00000-of-00001": range(2), "test-00000-of-00001": range(4)}
    (tmp_path / "wmt14" / "de-en").mkdir(parents=True)
    for name, rows in files.items():
        pairs = [{"de": f"Ein Haus {i}.", "en": f"A house {i}."} for i in rows]
        pq.write_table(pa.table({"translation": pairs}, schema=schema), tmp_path / f"wmt14/de-en/{name}.parquet")
    cfg = load_config(WMT14_CONFIG, [f"data.path={tmp_path / 'wmt14'}"])
    corpus = read_corpus(cfg.data)
    assert corpus["train"].column("src").to_pylist() == [f"A house {i}." for i in range(5)]  # both shards, in order
    assert corpus["test"].column("tgt").to_pylist() == [f"Ein Haus {i}." for i in range(4)]
    assert parquet_rows(cfg.data, "train", 2, 2) == ["A house 2.", "A house 3."]  # a run across two shards
    wrong = load_config(WMT14_CONFIG, [f"data.path={tmp_path / 'wmt14'}", "data.src_field=translation.fr"])
    with pytest.raises(CorpusError, match=r"train-00000-of-00002\.parquet: column 'translation.fr' does not exist"):
        read_corpus(wrong.data)
    missing = load_config(WMT14_CONFIG, [f"data.path={tmp_path / 'wmt14'}", "data.splits={train: de-en/tr-*, "
                                         "validation: de-en/validation-*}"])
    with pytest.raises(CorpusError, match=r"de-en/tr-\*\.parquet: no file matches"):
        read_corpus(missing.data)


def parquet_rows(cfg, split: str, first: int, count: int) -> list[str]:
    return ParquetFiles().opened(cfg).pairs(split, first, count).column("src").to_pylist()


def test_a_hub_dataset_saved_with_save_to_disk_reads_as_arrow(tmp_path):
    """data.source=hf with a save_to_disk copy of wmt/wmt14 de-en's layout (the datasets library's own format)."""
    datasets = pytest.importorskip("datasets")
    from pipeline.config import load_config

    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})
    pairs = [{"de": f"Ein Haus {i}.", "en": f"A house {i}."} for i in range(5)]
    splits = {name: datasets.Dataset.from_dict({"translation": pairs}, features=features)
              for name in ("train", "validation", "test")}
    # A selection leaves an indices mapping over the Arrow table; only the selected rows count.
    splits["train"] = splits["train"].select([4, 0, 2])
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "wmt14"))
    hub = ["data.source=hf", "data.format=text", "data.hf_name=wmt/wmt14", "data.hf_config=de-en",
           "data.splits={train: train, validation: validation, test: test}", f"data.path={tmp_path / 'wmt14'}"]
    cfg = load_config(WMT14_CONFIG, hub)
    corpus = read_corpus(cfg.data)
    assert corpus["train"].column("src").to_pylist() == ["A house 4.", "A house 0.", "A house 2."]
    assert corpus["test"].column("tgt").to_pylist() == [p["de"] for p in pairs]
    wrong = load_config(WMT14_CONFIG, [*hub, "data.src_field=translation.fr"])
    with pytest.raises(CorpusError, match=r"wmt14\[train\]: column 'translation.fr' does not exist .*data.src_field"):
        read_corpus(wrong.data)


def test_a_missing_value_in_a_saved_dataset_names_its_row(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"en": ["A house.", None, "A tree."], "de": ["Ein Haus.", "Ein Hund.", "Ein Baum."]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows),
                          "validation": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "hf"))
    cfg = DataConfig(source="hf", path=str(tmp_path / "hf"), splits={"train": "train", "validation": "validation"})
    with pytest.raises(CorpusError, match=r"column 'en' has 1 missing values \(the first in row 1\)"):
        read_corpus(cfg)


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("stride", [1, 3, 50])
def test_any_run_of_lines_read_through_the_sparse_index_equals_the_whole_file_split(tmp_path, chunk_bytes, stride):
    lines = ["", "zwei\u2028x", "drei\r", "v\u00efer \x85", "", "f\u00fcnf " * 9, "6", "7\t7", "8"]
    path = tmp_path / "f.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines * 3).encode())  # BOM, CRLF, no final newline
    index = index_file(path, LineFormat("text"), run_here, chunk_bytes=chunk_bytes, stride=stride)
    assert index.lines == 27
    whole = lines * 3  # each CRLF loses its CR; a CR that belongs to a line stays
    for first in range(28):
        for count in range(28 - first):
            assert read_lines_at(index, first, count, "error") == whole[first:first + count], (first, count)


@pytest.mark.parametrize("fmt, bad, expected", [
    ("text", b"bad \xff\n", r"f:38: invalid UTF-8 \(invalid start byte at byte \d+\)"),
    ("text", b"nul\x00\n", r"f:38: NUL byte"),
    ("tsv", b"one column\n", r"f:38: expected 2 tab-separated columns"),
    ("jsonl", b'{"en": "a"}\n', r"f:38: field 'de' is missing"),
])
def test_a_problem_deep_in_a_file_scanned_in_many_ranges_names_its_global_line(tmp_path, fmt, bad, expected):
    good = {"text": b"a b c\n", "tsv": b"a\tb\n", "jsonl": b'{"en": "a", "de": "b"}\n'}[fmt]
    path = tmp_path / "f"
    path.write_bytes(good * 37 + bad + good * 20)
    with pytest.raises(CorpusError, match=expected):
        index_file(path, LineFormat(fmt, "en", "de"), run_here, chunk_bytes=16, stride=2)


def test_parquet_is_checked_from_its_footer_and_read_by_runs_of_rows_across_row_groups(tmp_path):
    pairs = [{"en": f"A house {i}.", "de": f"Ein Haus {i}."} for i in range(25)]
    pq.write_table(pa.table({"translation": pairs, "id": list(range(25))}), tmp_path / "train.parquet",
                   row_group_size=4)
    pq.write_table(pa.table({"translation": pairs[:3], "id": [0, 1, 2]}), tmp_path / "val.parquet")
    cfg = files_config(tmp_path, format="parquet", src_field="translation.en", tgt_field="translation.de")
    source = ParquetFiles().opened(cfg)
    assert source.counts == {"train": 25, "validation": 3}
    for first, count in [(0, 25), (3, 6), (4, 4), (21, 4), (24, 1), (7, 0)]:
        table = source.pairs("train", first, count)
        assert table.column("src").to_pylist() == [p["en"] for p in pairs[first:first + count]], (first, count)
    assert source.sample([1, 8, 23]).column("tgt").to_pylist() == ["Ein Haus 1.", "Ein Haus 8.", "Ein Haus 23."]


def test_a_missing_value_in_a_later_row_group_names_its_row_in_the_file(tmp_path):
    src = [f"s{i}" for i in range(20)]
    src[13] = None
    pq.write_table(pa.table({"en": src, "de": [f"t{i}" for i in range(20)]}), tmp_path / "train.parquet",
                   row_group_size=5)
    pq.write_table(pa.table({"en": ["a"], "de": ["b"]}), tmp_path / "val.parquet")
    with pytest.raises(CorpusError, match=r"train\.parquet: column 'en' has 1 missing values \(the first in row 13\)"):
        ParquetFiles().opened(files_config(tmp_path, format="parquet"))
