"""`polnet dataset pack KIND OUT`: build a content-addressed dataset file from the
built-in data or your own (docs/datasets.md)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class Kind(StrEnum):
    digits = "digits"
    text = "text"
    images = "images"
    csv = "csv"
    arrays = "arrays"
    tokens = "tokens"


KIND_HELP = ("digits: scikit-learn's 8x8 digits (built in); text: a UTF-8 text file for the "
             "char-level LM (default: CPython's pydoc topics); images: a folder with one "
             "sub-folder of .npy images per class; csv: numeric features + a label column; "
             "arrays: a .npz with x and y, or a .npy with --labels; tokens: JSONL / Parquet / "
             "Arrow / text files or a folder of them, tokenized (BPE) into shards, OUT a "
             "folder. See docs/datasets.md.")


def register(app: typer.Typer) -> None:
    ds_app = typer.Typer(help="Content-addressed datasets (safetensors, hash = sha256 of bytes).",
                         no_args_is_help=True)

    @ds_app.command("pack")
    def pack(
        kind: Annotated[Kind, typer.Argument(help=KIND_HELP)],
        out: Annotated[Path, typer.Argument(help="Output file (.safetensors).")],
        source: Annotated[Path | None, typer.Option(
            "--source", help="The data: a text file, an images folder, a .csv, a .npz/.npy "
                             "(every kind but digits).")] = None,
        label: Annotated[str, typer.Option(
            "--label", help="csv: the label column's name.")] = "label",
        labels: Annotated[Path | None, typer.Option(
            "--labels", help="arrays with a .npy source: the labels .npy.")] = None,
        seq_len: Annotated[int, typer.Option(
            "--seq-len", help="tokens: ids per sequence (a transformer_lm's context + 1).")
        ] = 257,
        shard_sequences: Annotated[int, typer.Option(
            "--shard-sequences", help="tokens: sequences per shard (>= the batch size).")
        ] = 1024,
        exact_shards: Annotated[bool, typer.Option(
            "--exact-shards", help="tokens: every shard holds exactly --shard-sequences (the "
                                   "rest is dropped); with k x batch_size, each segment reads "
                                   "one shard and a verifier fetches only the sampled share.")
        ] = False,
        vocab_size: Annotated[int, typer.Option(
            "--vocab-size", help="tokens: size of the BPE tokenizer trained on the corpus.")
        ] = 8192,
        tokenizer: Annotated[Path | None, typer.Option(
            "--tokenizer", help="tokens: use this tokenizers JSON instead of training one.")
        ] = None,
        tokenizer_hash: Annotated[str | None, typer.Option(
            "--tokenizer-hash", help="tokens: the sha256 --tokenizer must have.")] = None,
        text_field: Annotated[str, typer.Option(
            "--text-field", help="tokens: the JSONL field / table column with the text.")
        ] = "text",
    ) -> None:
        """Pack a dataset, print its hash (a spec's dataset_hash) and the model fields a
        spec needs for it."""
        from node import dataset_formats as fmt  # noqa: PLC0415 - torch is heavy
        from node import datasets  # noqa: PLC0415
        from node.errors import DatasetError  # noqa: PLC0415

        if kind is Kind.tokens:
            from node.data.pack import pack_tokens  # noqa: PLC0415

            if source is None:
                raise DatasetError("`polnet dataset pack tokens OUT_DIR` needs --source PATH")
            packed = pack_tokens(source, out, seq_len, shard_sequences, vocab_size, tokenizer,
                                 tokenizer_hash, text_field, exact_shards=exact_shards)
            m = packed.manifest
            typer.echo(f"{packed.hash_hex}  {packed.manifest_path} ({len(m.shards)} shards, "
                       f"{m.total_sequences:,} sequences of {m.seq_len} tokens, "
                       f"{m.total_bytes:,} bytes; tokenizer {m.tokenizer})")
            typer.echo(f"spec: dataset_hash = \"{packed.hash_hex}\"; model: family = "
                       f"transformer_lm or hf_*, vocab_size >= {m.vocab_size}, context <= "
                       f"{m.seq_len - 1}; batch_size <= "
                       f"{min(e.sequences for e in m.shards)}")
            return
        if kind is Kind.digits:
            data = datasets.pack_digits()
        elif kind is Kind.text:
            data = datasets.pack_text() if source is None else fmt.pack_text_file(source)
        elif source is None:
            raise DatasetError(f"`polnet dataset pack {kind.value}` needs --source PATH "
                               "(docs/datasets.md shows each layout)")
        elif kind is Kind.images:
            data = fmt.pack_image_folder(source)
        elif kind is Kind.csv:
            data = fmt.pack_csv(source, label)
        else:
            data = fmt.pack_arrays(source, labels)
        digest = datasets.write_dataset(data, out)
        typer.echo(f"{digest}  {out} ({len(data):,} bytes)")
        hints = ", ".join(f"{k} = {v}" for k, v in fmt.spec_hints(data).items())
        typer.echo(f"spec: dataset_hash = \"{digest}\"; model: {hints}")

    @ds_app.command("hash")
    def hash_(path: Annotated[Path, typer.Argument(exists=True, dir_okay=False)]) -> None:
        """Print a dataset file's content hash."""
        from node import datasets  # noqa: PLC0415

        typer.echo(datasets.dataset_hash(path))

    app.add_typer(ds_app, name="dataset")
