"""The attention maps a run logs: one figure per kind, layers as rows, heads as columns, pieces on the outer maps."""

import matplotlib.pyplot as plt
import torch
from registry_files import small_tokenizer

from model import Transformer, TransformerConfig
from pipeline.text.translator import Translator
from pipeline.track.plots import attention_maps


def test_attention_maps_show_every_layer_and_head_and_label_the_pieces_on_the_outer_maps_only():
    tokenizer = small_tokenizer()
    cfg = TransformerConfig(vocab_size=tokenizer.src_vocab_size, d_model=32, d_ff=64, num_heads=4,
                            num_encoder_layers=2, num_decoder_layers=3, dropout=0.0)
    torch.manual_seed(0)
    translator = Translator(Transformer(cfg).eval(), tokenizer, beam_size=1, device="cpu")
    source = "a small dog runs"
    pieces = [tokenizer.src.id_to_piece(i) for i in tokenizer.encode_src([source])[0]]
    figures = attention_maps(translator, source)
    try:
        assert set(figures) == {"encoder_self", "decoder_self", "cross"}
        for kind, layers in (("encoder_self", 2), ("decoder_self", 3), ("cross", 3)):
            axes = figures[kind].axes
            assert len(axes) == layers * 4, kind
            grid = [axes[row * 4: row * 4 + 4] for row in range(layers)]
            assert [ax.get_title() for ax in grid[0]] == ["head 1", "head 2", "head 3", "head 4"]
            assert [row[0].get_ylabel() for row in grid] == [f"layer {n + 1}" for n in range(layers)]
            for row, maps in enumerate(grid):
                for head, ax in enumerate(maps):
                    x_labels = [t.get_text() for t in ax.get_xticklabels()]
                    y_labels = [t.get_text() for t in ax.get_yticklabels()]
                    assert bool(x_labels) == (row == layers - 1) and bool(y_labels) == (head == 0), (kind, row, head)
                    if kind != "decoder_self" and x_labels:  # source pieces along the keys
                        assert x_labels == pieces
                    if kind == "encoder_self" and y_labels:
                        assert y_labels == pieces
        assert figures["cross"].axes[0].get_images()[0].get_array().shape[1] == len(pieces)
        # This untrained model repeats itself up to the decoder's limit (the source + 50 pieces): the maps
        # stop at 1.5 times the source + 5 (<s> first; the decoded text, encoded again, may take a piece more).
        rows, limit = figures["cross"].axes[0].get_images()[0].get_array().shape[0], len(pieces) * 3 // 2 + 5
        assert limit <= rows <= limit + 2, (rows, limit)
    finally:
        for figure in figures.values():
            plt.close(figure)
