"""A trained HF-family model as a directory ``transformers`` loads as it is.

``export_hf(model_file, out_dir, vocab)`` turns a polnet model file (``polnet job
fetch``: weights + the job's spec) into ``config.json`` + ``model.safetensors``
(``save_pretrained``), so ``AutoModelForCausalLM.from_pretrained(out_dir)`` (or
``AutoModelForMaskedLM`` for ``hf_albert``) gives the solver's final weights. With
the dataset's character vocabulary it also writes a ``tokenizers`` character-level
tokenizer, so ``AutoTokenizer.from_pretrained(out_dir)`` encodes and decodes text
in the job's token ids. With a sharded dataset's tokenizer (the ``tokenizers`` JSON
file its manifest names by sha256, ``tokenizer_json``) it writes that tokenizer
instead, its ids unchanged.

Public API::

    export_hf(model_file, out_dir, vocab=None, tokenizer_json=None) -> Path
    char_tokenizer(vocab) -> PreTrainedTokenizerFast   # one token per character
    bpe_tokenizer(tokenizer_json, mask_token_id=None) -> PreTrainedTokenizerFast
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


EOS = "<|endoftext|>"  # node.data.pack's document separator


def bpe_tokenizer(tokenizer_json: bytes, mask_token_id: int | None = None) -> Any:
    """The packing's own tokenizer (node.data.pack: byte-level BPE, or a supplied
    file), as a fast tokenizer with ``<|endoftext|>`` as its end of text. An ALBERT
    mask id one past the tokenizer's ids becomes ``[MASK]``."""
    from tokenizers import Tokenizer  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    try:
        tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - whatever the library says about the file
        raise ConfigError(f"not a tokenizers JSON file ({str(exc)[:200]})") from None
    specials: dict[str, str] = {}
    if tok.token_to_id(EOS) is not None:
        specials.update(eos_token=EOS, bos_token=EOS, unk_token=EOS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **specials)
    if mask_token_id is not None and mask_token_id == tok.get_vocab_size(with_added_tokens=True):
        fast.add_special_tokens({"mask_token": "[MASK]"})
    return fast


def export_hf(model_file: str | Path, out_dir: str | Path,
              vocab: Sequence[str] | None = None, tokenizer_json: bytes | None = None) -> Path:
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
    mask = cfg.mask_token_id if isinstance(cfg, HFAlbertConfig) else None
    if tokenizer_json is not None:
        bpe_tokenizer(tokenizer_json, mask).save_pretrained(out)
    elif vocab:
        char_tokenizer(vocab, mask).save_pretrained(out)
    (out / "polnet_spec.json").write_bytes(spec.canonical_json())
    meta = {"family": cfg.family, "spec_hash": spec.spec_hash_hex(),
            "transformers_version": cfg.transformers_version}
    (out / "polnet.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out
