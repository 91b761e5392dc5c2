"""A trained HF-family model as a directory ``transformers`` loads as it is.

``export_hf(model_file, out_dir, vocab)`` turns a polnet model file (``polnet job
fetch``: weights + the job's spec) into ``config.json`` + ``model.safetensors``
(``save_pretrained``), so ``AutoModelForCausalLM.from_pretrained(out_dir)`` (or
``AutoModelForMaskedLM`` for ``hf_albert``) gives the solver's final weights. With
the dataset's character vocabulary it also writes a ``tokenizers`` character-level
tokenizer, so ``AutoTokenizer.from_pretrained(out_dir)`` encodes and decodes text
in the job's token ids.

Public API::

    export_hf(model_file, out_dir, vocab=None) -> Path
    char_tokenizer(vocab) -> PreTrainedTokenizerFast   # one token per character
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from node.errors import ConfigError
from node.spec_hf import HFAlbertConfig, HFConfig
from node.train.hf_models import hf_module
from node.train.models import load_model, model_spec


def char_tokenizer(vocab: Sequence[str], mask_token_id: int | None = None) -> Any:
    """A tokenizer whose ids are the vocabulary's indices, one per character (the
    packing of node.datasets.pack_text). ALBERT's mask id (beyond the characters)
    becomes ``[MASK]``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    ids = {c: i for i, c in enumerate(vocab)}
    specials: dict[str, str] = {}
    if mask_token_id is not None and mask_token_id >= len(vocab):
        ids["[MASK]"] = mask_token_id
        specials["mask_token"] = "[MASK]"
    unk = vocab[0]
    tok = Tokenizer(models.WordLevel(ids, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk, **specials)


def export_hf(model_file: str | Path, out_dir: str | Path,
              vocab: Sequence[str] | None = None) -> Path:
    spec = model_spec(model_file)
    cfg = spec.model
    if not isinstance(cfg, HFConfig):
        raise ConfigError(f"job's model is the built-in {cfg.family!r}, not a Hugging Face "
                          "family: fetch it without --format hf and load it with "
                          "node.train.models.load_model")
    model = load_model(model_file)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf = hf_module(model)
    hf.config.use_cache = True  # generation wants the cache; training ran without
    hf.save_pretrained(out)
    if vocab:
        mask = cfg.mask_token_id if isinstance(cfg, HFAlbertConfig) else None
        char_tokenizer(vocab, mask).save_pretrained(out)
    (out / "polnet_spec.json").write_bytes(spec.canonical_json())
    meta = {"family": cfg.family, "spec_hash": spec.spec_hash_hex(),
            "transformers_version": cfg.transformers_version}
    (out / "polnet.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out
