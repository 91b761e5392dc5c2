"""Hugging Face model families in a job spec: configurations, never code.

A spec names a whitelisted ``transformers`` architecture and the fields of its
configuration; nothing else of ``transformers`` is reachable from a spec (no hub
names, no remote code, no attention backend of the submitter's choice). Every
size has a bound so the spec budget (``JobSpec.estimated_memory_mb``) and the
solver's child-process probe apply as for the built-in families; each config
gives its analytic parameter count, activation floats and forward MACs.

* ``hf_llama``  - ``LlamaForCausalLM`` (next-token loss on text windows)
* ``hf_gpt2``   - ``GPT2LMHeadModel`` (next-token loss on text windows)
* ``hf_albert`` - ``AlbertForMaskedLM`` (masked-token loss; sahajBERT's family)

``transformers_version`` records the version the job was made for: a solver or
verifier whose installed version differs refuses to build the model
(:func:`check_installed_version`), since another version may compute the same
configuration differently and honest replays would fail.

Attention dropout is 0 by construction (the eager kernel would draw its mask
from the global RNG); residual/embedding dropout and MLM masking draw from the
per-step generator (node.train.hf_models).
"""

from __future__ import annotations

from importlib import metadata
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from node.errors import SpecError

MAX_HF_VOCAB = 262_144
MAX_HF_CONTEXT = 8192
MAX_HF_WIDTH = 16_384
MAX_HF_FF = 65_536
MAX_HF_LAYERS = 128
MAX_HF_HEADS = 256
VERSION_PATTERN = r"^[0-9]+\.[0-9]+\.[0-9]+$"
HF_FAMILIES = ("hf_llama", "hf_gpt2", "hf_albert")


def installed_transformers_version() -> str:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return "not installed"


def check_installed_version(cfg: HFConfig) -> None:
    """Refuse a job made for another ``transformers``: its model may compute differently."""
    have = installed_transformers_version()
    if cfg.transformers_version != have:
        raise SpecError(
            f"the job was made for transformers {cfg.transformers_version} but this node has "
            f"{have}: a replay on another version is not bit-for-bit, so this node refuses "
            f"the job (install transformers=={cfg.transformers_version} to take it)",
            field="model.transformers_version")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class _HFText(_Strict):
    """Fields every HF text family shares. ``context`` is the training window."""

    transformers_version: str = Field(pattern=VERSION_PATTERN, max_length=32)
    vocab_size: int = Field(ge=2, le=MAX_HF_VOCAB)
    context: int = Field(ge=2, le=MAX_HF_CONTEXT)
    initializer_range: float = Field(default=0.02, gt=0.0, le=1.0)

    def _heads_divide(self, width: int, heads: int, field: str) -> None:
        if width % heads:
            raise SpecError(f"{width} is not divisible by {heads} heads", field=f"model.{field}")

    def _positions(self, positions: int | None, field: str) -> None:
        if positions is not None and positions < self.context:
            raise SpecError(f"{positions} positions < context {self.context}",
                            field=f"model.{field}")


class HFLlamaConfig(_HFText):
    """``LlamaConfig``: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention."""

    family: Literal["hf_llama"]
    hidden_size: int = Field(ge=8, le=MAX_HF_WIDTH)
    intermediate_size: int = Field(ge=8, le=MAX_HF_FF)
    num_hidden_layers: int = Field(ge=1, le=MAX_HF_LAYERS)
    num_attention_heads: int = Field(ge=1, le=MAX_HF_HEADS)
    num_key_value_heads: int | None = Field(default=None, ge=1, le=MAX_HF_HEADS)
    max_position_embeddings: int | None = Field(default=None, ge=2, le=MAX_HF_CONTEXT)
    rms_norm_eps: float = Field(default=1e-6, gt=0.0, le=1e-2)
    rope_theta: float = Field(default=10_000.0, ge=1.0, le=1e8)
    tie_word_embeddings: bool = False

    @model_validator(mode="after")
    def _shapes(self) -> HFLlamaConfig:
        self._heads_divide(self.hidden_size, self.num_attention_heads, "num_attention_heads")
        if self.num_attention_heads % self.kv_heads:
            raise SpecError(f"num_attention_heads {self.num_attention_heads} is not a multiple "
                            f"of num_key_value_heads {self.kv_heads}",
                            field="model.num_key_value_heads")
        self._positions(self.max_position_embeddings, "max_position_embeddings")
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    def hf_config_dict(self) -> dict[str, object]:
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_hidden_layers,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.kv_heads,
                "max_position_embeddings": self.max_position_embeddings or self.context,
                "rms_norm_eps": self.rms_norm_eps,
                "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
                "tie_word_embeddings": self.tie_word_embeddings,
                "initializer_range": self.initializer_range,
                "attention_dropout": 0.0, "hidden_act": "silu", "use_cache": False}

    def param_count(self) -> int:
        d, kv = self.hidden_size, self.kv_heads * (self.hidden_size // self.num_attention_heads)
        per_layer = 2 * d * d + 2 * d * kv + 3 * d * self.intermediate_size + 2 * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.num_hidden_layers * per_layer + d + head

    def activation_floats(self, batch: int) -> int:
        bt = batch * self.context
        per_layer = bt * (12 * self.hidden_size + 4 * self.intermediate_size) \
            + 3 * batch * self.num_attention_heads * self.context ** 2
        return self.num_hidden_layers * per_layer + 3 * bt * self.vocab_size

    def forward_macs(self, batch: int) -> int:
        d, t = self.hidden_size, self.context
        per_token = self.num_hidden_layers * (4 * d * d + 3 * d * self.intermediate_size
                                              + 2 * t * d) + d * self.vocab_size
        return batch * t * per_token


class HFGPT2Config(_HFText):
    """``GPT2Config``: LayerNorm, learned positions, tied output head."""

    family: Literal["hf_gpt2"]
    n_embd: int = Field(ge=8, le=MAX_HF_WIDTH)
    n_layer: int = Field(ge=1, le=MAX_HF_LAYERS)
    n_head: int = Field(ge=1, le=MAX_HF_HEADS)
    n_inner: int | None = Field(default=None, ge=8, le=MAX_HF_FF)
    n_positions: int | None = Field(default=None, ge=2, le=MAX_HF_CONTEXT)
    activation_function: Literal["gelu_new", "gelu"] = "gelu_new"
    resid_pdrop: float = Field(default=0.0, ge=0.0, lt=1.0)
    embd_pdrop: float = Field(default=0.0, ge=0.0, lt=1.0)
    layer_norm_epsilon: float = Field(default=1e-5, gt=0.0, le=1e-2)

    @model_validator(mode="after")
    def _shapes(self) -> HFGPT2Config:
        self._heads_divide(self.n_embd, self.n_head, "n_head")
        self._positions(self.n_positions, "n_positions")
        return self

    @property
    def ff(self) -> int:
        return self.n_inner or 4 * self.n_embd

    @property
    def positions(self) -> int:
        return self.n_positions or self.context

    def hf_config_dict(self) -> dict[str, object]:
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                "vocab_size": self.vocab_size, "n_embd": self.n_embd, "n_layer": self.n_layer,
                "n_head": self.n_head, "n_inner": self.n_inner, "n_positions": self.positions,
                "activation_function": self.activation_function,
                "resid_pdrop": self.resid_pdrop, "embd_pdrop": self.embd_pdrop,
                "attn_pdrop": 0.0, "summary_first_dropout": 0.0,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "initializer_range": self.initializer_range,
                "tie_word_embeddings": True, "use_cache": False,
                "bos_token_id": 0, "eos_token_id": 0}

    def param_count(self) -> int:
        d, ff = self.n_embd, self.ff
        per_layer = 4 * d + 3 * d * d + 3 * d + d * d + d + d * ff + ff + ff * d + d
        return self.vocab_size * d + self.positions * d + self.n_layer * per_layer + 2 * d

    def activation_floats(self, batch: int) -> int:
        bt = batch * self.context
        per_layer = bt * (14 * self.n_embd + 3 * self.ff) + 3 * batch * self.n_head \
            * self.context ** 2
        return self.n_layer * per_layer + 3 * bt * self.vocab_size

    def forward_macs(self, batch: int) -> int:
        d, t = self.n_embd, self.context
        per_token = self.n_layer * (4 * d * d + 2 * d * self.ff + 2 * t * d) + d * self.vocab_size
        return batch * t * per_token


class HFAlbertConfig(_HFText):
    """``AlbertConfig`` with one shared layer group (ALBERT's cross-layer sharing), as a
    masked LM: each step masks ``mlm_probability`` of the window's tokens (80% become
    ``mask_token_id``, 10% a random token, 10% stay) and the loss is over those."""

    family: Literal["hf_albert"]
    embedding_size: int = Field(ge=8, le=MAX_HF_WIDTH)
    hidden_size: int = Field(ge=8, le=MAX_HF_WIDTH)
    num_hidden_layers: int = Field(ge=1, le=MAX_HF_LAYERS)
    num_attention_heads: int = Field(ge=1, le=MAX_HF_HEADS)
    intermediate_size: int = Field(ge=8, le=MAX_HF_FF)
    max_position_embeddings: int | None = Field(default=None, ge=2, le=MAX_HF_CONTEXT)
    hidden_act: Literal["gelu_new", "gelu"] = "gelu_new"
    hidden_dropout_prob: float = Field(default=0.0, ge=0.0, lt=1.0)
    layer_norm_eps: float = Field(default=1e-12, gt=0.0, le=1e-2)
    mlm_probability: float = Field(default=0.15, gt=0.0, lt=1.0)
    mask_token_id: int = Field(ge=0, lt=MAX_HF_VOCAB)

    @model_validator(mode="after")
    def _shapes(self) -> HFAlbertConfig:
        self._heads_divide(self.hidden_size, self.num_attention_heads, "num_attention_heads")
        self._positions(self.max_position_embeddings, "max_position_embeddings")
        if self.mask_token_id >= self.vocab_size:
            raise SpecError(f"mask_token_id {self.mask_token_id} is not below vocab_size "
                            f"{self.vocab_size}", field="model.mask_token_id")
        return self

    @property
    def positions(self) -> int:
        return self.max_position_embeddings or self.context

    def hf_config_dict(self) -> dict[str, object]:
        return {"model_type": "albert", "architectures": ["AlbertForMaskedLM"],
                "vocab_size": self.vocab_size, "embedding_size": self.embedding_size,
                "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
                "num_attention_heads": self.num_attention_heads,
                "intermediate_size": self.intermediate_size,
                "max_position_embeddings": self.positions, "hidden_act": self.hidden_act,
                "hidden_dropout_prob": self.hidden_dropout_prob,
                "attention_probs_dropout_prob": 0.0, "classifier_dropout_prob": 0.0,
                "layer_norm_eps": self.layer_norm_eps,
                "initializer_range": self.initializer_range,
                "num_hidden_groups": 1, "inner_group_num": 1, "type_vocab_size": 2,
                "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0,
                "tie_word_embeddings": True}

    def param_count(self) -> int:
        e, h, i, v = self.embedding_size, self.hidden_size, self.intermediate_size, \
            self.vocab_size
        embeddings = v * e + self.positions * e + 2 * e + 2 * e
        layer = 4 * (h * h + h) + 2 * h + h * i + i + i * h + h + 2 * h
        head = 2 * e + h * e + e + v  # LayerNorm, dense, decoder bias (weight tied)
        return embeddings + e * h + h + layer + head

    def activation_floats(self, batch: int) -> int:
        bt = batch * self.context
        per_layer = bt * (14 * self.hidden_size + 3 * self.intermediate_size) \
            + 3 * batch * self.num_attention_heads * self.context ** 2
        return self.num_hidden_layers * per_layer + 3 * bt * self.vocab_size

    def forward_macs(self, batch: int) -> int:
        h, t = self.hidden_size, self.context
        per_token = self.num_hidden_layers * (4 * h * h + 2 * h * self.intermediate_size
                                              + 2 * t * h) \
            + self.embedding_size * (h + self.vocab_size)
        return batch * t * per_token


HFConfig = HFLlamaConfig | HFGPT2Config | HFAlbertConfig
HF_CONFIG_TYPES = (HFLlamaConfig, HFGPT2Config, HFAlbertConfig)
