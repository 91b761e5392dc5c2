"""`polnet dataset pack {digits,text} OUT`: build a content-addressed dataset file."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class Builtin(StrEnum):
    digits = "digits"
    text = "text"


def register(app: typer.Typer) -> None:
    ds_app = typer.Typer(help="Content-addressed datasets (safetensors, hash = sha256 of bytes).",
                         no_args_is_help=True)

    @ds_app.command("pack")
    def pack(
        kind: Annotated[Builtin, typer.Argument(
            help="digits: scikit-learn's 8x8 digits; text: a char-level corpus.")],
        out: Annotated[Path, typer.Argument(help="Output file (.safetensors).")],
        source: Annotated[Path | None, typer.Option(
            "--source", help="text only: a UTF-8 file "
                             "(default: CPython's pydoc_data/topics.py).")] = None,
    ) -> None:
        """Pack a built-in dataset and print its hash (put it in a spec's dataset_hash)."""
        from node import datasets  # noqa: PLC0415 - torch is heavy

        data = datasets.pack_digits() if kind is Builtin.digits else datasets.pack_text(source)
        digest = datasets.write_dataset(data, out)
        typer.echo(f"{digest}  {out} ({len(data):,} bytes)")

    @ds_app.command("hash")
    def hash_(path: Annotated[Path, typer.Argument(exists=True, dir_okay=False)]) -> None:
        """Print a dataset file's content hash."""
        from node import datasets  # noqa: PLC0415

        typer.echo(datasets.dataset_hash(path))

    app.add_typer(ds_app, name="dataset")
