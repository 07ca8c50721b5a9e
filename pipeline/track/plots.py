"""Pictures for MLflow: learning curves and per-layer, per-head attention maps (matplotlib, no display)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # workers and CI have no display

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ..text.tokenizer import BOS_ID  # noqa: E402
from ..text.translator import Translator  # noqa: E402

KINDS = {"encoder_self": "encoder self-attention", "decoder_self": "decoder self-attention",
         "cross": "encoder-decoder attention"}


def learning_curves(history: dict[str, list[tuple[int, float]]], title: str = "") -> Figure:
    """Train and validation loss (left) and validation BLEU (right) against the update step."""
    fig, (loss_ax, bleu_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key in ("train_loss", "val_loss"):
        if history.get(key):
            loss_ax.plot(*zip(*history[key]), label=key, marker="." if key == "val_loss" else None)
    loss_ax.set(xlabel="update", ylabel="label-smoothed loss per token")
    loss_ax.legend()
    if history.get("val_bleu"):
        bleu_ax.plot(*zip(*history["val_bleu"]), marker="o", color="tab:green")
    bleu_ax.set(xlabel="update", ylabel="validation BLEU")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def sweep_plot(key: str, distribution: tuple[str, list], trials: list[dict]) -> Figure:
    """Each trial's best val BLEU against one swept key: trials that ran to the end filled, those ASHA
    stopped hollow, the best starred; a choice key gets one column per value it could take."""
    name, args = distribution
    scored = [t for t in trials if t["val_bleu"] == t["val_bleu"]]  # NaN: a trial that never validated
    x: list[float] = []
    if name in ("choice", "grid"):
        columns, seen = {value: i for i, value in enumerate(args)}, {}
        for t in scored:  # trials sharing a column side by side, so that none hides another
            value = t["params"][key]
            seen[value] = seen.get(value, 0) + 1
            x.append(columns[value] + 0.08 * (seen[value] - 1))
        x = [at - 0.04 * (seen[t["params"][key]] - 1) for at, t in zip(x, scored)]  # centred on the column
    else:
        x = [t["params"][key] for t in scored]
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    for stopped, style in ((False, {"color": "tab:blue", "label": "ran to the end"}),
                           (True, {"facecolors": "none", "edgecolors": "tab:orange", "linewidths": 1.5,
                                   "label": "stopped early (ASHA)"})):
        group = [(at, t["val_bleu"]) for at, t in zip(x, scored) if (t["status"] == "STOPPED_EARLY") == stopped]
        if group:
            ax.scatter(*zip(*group), s=45, **style)
    if scored:
        best = max(range(len(scored)), key=lambda i: scored[i]["val_bleu"])
        ax.scatter([x[best]], [scored[best]["val_bleu"]], marker="*", s=220, color="tab:red", zorder=3,
                   label=f"best: {scored[best]['val_bleu']:.2f}")
    if name in ("choice", "grid"):
        ax.set_xticks(range(len(args)), [str(a) for a in args])
        ax.set_xlim(-0.6, len(args) - 0.4)
    elif name.endswith("loguniform") and args[1] / args[0] >= 10:
        ax.set_xscale("log")
    ax.set(xlabel=key, ylabel="best val BLEU of the trial", title=f"val_bleu vs {key}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    fig.tight_layout()
    return fig


def save_sweep_plots(space: dict[str, tuple[str, list]], trials: list[dict], directory: Path) -> list[Path]:
    """sweep_plot for every swept key, as val_bleu_vs_<key>.png files in directory."""
    files = []
    for key, distribution in space.items():
        fig = sweep_plot(key, distribution, trials)
        files.append(directory / f"val_bleu_vs_{key.replace('.', '_')}.png")
        fig.savefig(files[-1], dpi=100)
        plt.close(fig)
    return files


def _kind(name: str) -> str:
    if name.startswith("encoder"):
        return "encoder_self"
    return "cross" if name.endswith("cross_attn") else "decoder_self"


def _map_length(source_pieces: int) -> int:
    """The most target pieces a map shows: an early checkpoint repeats itself up to the decoder's limit (the
    source's length + 50), and maps of that many rows are unreadable and slow to draw (a label per row)."""
    return source_pieces * 3 // 2 + 5


@torch.no_grad()
def attention_maps(translator: Translator, source: str) -> dict[str, Figure]:
    """One figure per attention kind: layers as rows, heads as columns, for the model's own translation."""
    model, tokenizer = translator.model, translator.tokenizer
    src_ids = tokenizer.encode_src([source])[0]
    hyp = translator.translate([source], beam_size=1, max_len=_map_length(len(src_ids)))[0]
    tgt_ids = tokenizer.encode_tgt([hyp])[0]
    modules = model.attention_modules()
    for module in modules.values():
        module.store_attention = True
    try:
        model(torch.tensor([src_ids]), torch.tensor([[BOS_ID, *tgt_ids]]))
        weights = {name: m.last_attention[0].cpu() for name, m in modules.items()}  # [heads, q, k]
    finally:
        for module in modules.values():
            module.store_attention, module.last_attention = False, None
    src_pieces = [tokenizer.src.id_to_piece(i) for i in src_ids]
    tgt_in = ["<s>", *(tokenizer.tgt.id_to_piece(i) for i in tgt_ids)]
    figures = {}
    for kind, label in KINDS.items():
        names = [n for n in weights if _kind(n) == kind]
        heads = weights[names[0]].shape[0]
        rows, cols = (src_pieces, src_pieces) if kind == "encoder_self" else \
            (tgt_in, tgt_in) if kind == "decoder_self" else (tgt_in, src_pieces)
        # The pieces label the bottom row and the first column only: a base model has 48 maps per figure, and
        # ticks on every one of them took most of a minute to draw.
        fig, axes = plt.subplots(len(names), heads, figsize=(2.2 * heads + 1, 2.2 * len(names) + 1), squeeze=False,
                                 layout="constrained")
        for layer, name in enumerate(names):
            for head in range(heads):
                ax = axes[layer][head]
                ax.imshow(weights[name][head].numpy(), cmap="viridis", aspect="auto")
                bottom, left = layer == len(names) - 1, head == 0
                ax.set_xticks(range(len(cols)) if bottom else [], cols if bottom else [], rotation=90, fontsize=6)
                ax.set_yticks(range(len(rows)) if left else [], rows if left else [], fontsize=6)
            axes[layer][0].set_ylabel(f"layer {layer + 1}", fontsize=9)
        for head in range(heads):
            axes[0][head].set_title(f"head {head + 1}", fontsize=9)
        fig.suptitle(f"{label}: {source[:80]}")
        figures[kind] = fig
    return figures
