"""Hugging Face model families (node.spec_hf) as polnet models.

The model is ``transformers``' own class built from the spec's configuration, with
what the verifier relies on put back in polnet's hands:

* S_0: transformers initialises from the global RNG, so construction runs inside
  ``torch.random.fork_rng`` (the caller's global RNG is left as it was) and every
  parameter is then overwritten by the project's seeded init (node.train.models:
  norms 1, biases 0, matrices N(0, initializer_range) from the job seed);
* attention: the eager implementation (SDPA's kernels differ by backend) with
  attention dropout 0 (its mask would come from the global RNG);
* layer norms: the affine part runs as separate ops (``_SplitLayerNorm``): the fused
  CPU kernel sums the weight and bias gradients over rows in per-thread buffers, so
  the thread count changed their rounding (ALBERT's trace root differed between 1
  and 2 threads); a broadcast multiply-add's gradients reduce over rows in one order;
* every other dropout module is replaced by one drawing from the step's
  generator (``StepRandomness``), as the built-in families do;
* masked LM: which tokens are masked, and how, is drawn from the same generator at
  the whole batch's shape, so micro-batching sees the unsplit step's masks; the
  loss is normalised by the whole batch's masked count, so m chunks sum to the
  unsplit loss.

Public API::

    (importing it registers hf_* in node.train.model_base's registry; node.train.models
    imports it, so building any model knows them)
    hf_module(model) -> PreTrainedModel # the transformers model inside a polnet one
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from node.errors import TrainingError
from node.spec_hf import HF_FAMILIES, HFAlbertConfig, HFConfig, check_installed_version
from node.train.model_base import (
    Dropout,
    PolnetModel,
    Randomness,
    StepRandomness,
    register_family,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

IGNORE = -100


def _classes(cfg: HFConfig) -> tuple[Any, Any]:
    import transformers as tf  # noqa: PLC0415 - a second or more; only HF jobs pay it

    return {"hf_llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
            "hf_gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel),
            "hf_albert": (tf.AlbertConfig, tf.AlbertForMaskedLM)}[cfg.family]


def hf_config(cfg: HFConfig) -> Any:
    """The ``transformers`` configuration object of a spec's model."""
    config_cls, _ = _classes(cfg)
    fields = {k: v for k, v in cfg.hf_config_dict().items() if k != "model_type"}
    conf = config_cls(**fields)
    conf._attn_implementation = "eager"  # noqa: SLF001 - the documented switch
    return conf


class _RngSlot:
    """The current step's randomness, read by the dropout modules inside HF's forward
    (which has no argument to pass it through)."""

    def __init__(self) -> None:
        self.rng: Randomness = None


class _StepDropout(nn.Module):
    def __init__(self, p: float, slot: _RngSlot) -> None:
        super().__init__()
        self.p = p
        self.slot = slot
        self.drop = Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.drop(x, self.slot.rng)
        return out


def _replace_dropouts(module: nn.Module, slot: _RngSlot) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Dropout):
            if child.p > 0.0:
                setattr(module, name, _StepDropout(child.p, slot))
        else:
            _replace_dropouts(child, slot)


class _SplitLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` with the same parameters and the same forward bits as the fused
    kernel (an exported model's logits equal the trace's), but weight and bias
    gradients from a broadcast multiply-add over rows (see the module docstring): the
    fused op sees the affine parameters detached, and ``a - a.detach()`` (exactly zero
    forward) carries their gradient."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = None if self.weight is None else self.weight.detach()
        b = None if self.bias is None else self.bias.detach()
        y = F.layer_norm(x, self.normalized_shape, w, b, self.eps)
        if self.weight is None and self.bias is None:
            return y
        a = F.layer_norm(x.detach(), self.normalized_shape, None, None, self.eps)
        if self.weight is not None:
            a = a * self.weight
        if self.bias is not None:
            a = a + self.bias
        return y + (a - a.detach())


def _split_layer_norms(module: nn.Module) -> None:
    for m in module.modules():
        if type(m) is nn.LayerNorm:
            m.__class__ = _SplitLayerNorm  # same state: names, shapes, init untouched


def _check_no_global_dropout(model: nn.Module) -> None:
    left = [n for n, m in model.named_modules() if isinstance(m, nn.Dropout) and m.p > 0.0]
    if left:  # would draw from the global RNG: not replayable
        raise TrainingError(f"dropout modules {left[:3]} draw from the global RNG")


def _build_hf(cfg: HFConfig) -> PreTrainedModel:
    check_installed_version(cfg)
    conf = hf_config(cfg)
    _, model_cls = _classes(cfg)
    with torch.random.fork_rng(devices=[]):  # HF's own init draws from the global RNG
        model = model_cls(conf)
    model.config.use_cache = False
    return model


class HFCausalLM(PolnetModel):
    """Next-token logits ``[B, T, V]`` of a causal LM; the base class's loss."""

    def __init__(self, cfg: HFConfig) -> None:
        super().__init__()
        self.hf = _build_hf(cfg)
        self._slot = _RngSlot()
        _replace_dropouts(self.hf, self._slot)
        _check_no_global_dropout(self.hf)
        _split_layer_norms(self.hf)

    def forward(self, x: torch.Tensor, rng: Randomness = None) -> torch.Tensor:
        self._slot.rng = rng
        try:
            out: torch.Tensor = self.hf(input_ids=x, use_cache=False).logits
        finally:
            self._slot.rng = None
        return out

class HFMaskedLM(HFCausalLM):
    """A masked LM: in training (``rng`` given) the window is masked from the step's
    draws and ``loss`` scores the masked positions only; without ``rng`` (eval) the
    window goes in as it is and ``loss`` is the plain cross-entropy against ``y``."""

    def __init__(self, cfg: HFAlbertConfig) -> None:
        super().__init__(cfg)
        self.mlm = cfg
        self._labels: torch.Tensor | None = None
        self._scale = 1.0

    def _mask(self, x: torch.Tensor, rng: Randomness) -> torch.Tensor:
        cpu = x.detach().to("cpu")
        if isinstance(rng, StepRandomness):
            sel_u, sel_all = rng.uniform(cpu.shape)
            kind, _ = rng.uniform(cpu.shape)
            tok, _ = rng.uniform(cpu.shape)
            chunk_share = cpu.shape[0] / rng.batch_size
        else:
            assert rng is not None
            sel_u, kind, tok = (torch.rand(cpu.shape, generator=rng) for _ in range(3))
            sel_all, chunk_share = sel_u, 1.0
        p = self.mlm.mlm_probability
        selected = sel_u < p
        total = max(1, int((sel_all < p).sum()))
        random_tok = (tok * self.mlm.vocab_size).long().clamp_(max=self.mlm.vocab_size - 1)
        masked = torch.where(selected & (kind < 0.8),
                             torch.full_like(cpu, self.mlm.mask_token_id), cpu)
        masked = torch.where(selected & (kind >= 0.8) & (kind < 0.9), random_tok, masked)
        self._labels = torch.where(selected, cpu, torch.full_like(cpu, IGNORE)).to(x.device)
        # sum over this chunk's masked tokens / the whole batch's count, times m:
        # the step divides each chunk's loss by m, so the chunks add up exactly.
        self._scale = 1.0 / (total * chunk_share)
        return masked.to(x.device)

    def forward(self, x: torch.Tensor, rng: Randomness = None) -> torch.Tensor:
        self._labels = None
        if self.training and rng is not None:
            x = self._mask(x, rng)
        return super().forward(x, rng)

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        labels, self._labels = self._labels, None
        if labels is None:
            return super().loss(logits, y)
        flat = logits.reshape(-1, logits.shape[-1]).float()
        return F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE,
                               reduction="sum") * self._scale


def hf_module(model: nn.Module) -> PreTrainedModel:
    hf = getattr(model, "hf", None)
    if hf is None:
        raise TrainingError(f"{type(model).__name__} is not a Hugging Face family model")
    return hf  # type: ignore[no-any-return]


def _builder(cfg: Any) -> tuple[PolnetModel, float | None]:
    cls = HFMaskedLM if isinstance(cfg, HFAlbertConfig) else HFCausalLM
    return cls(cfg), cfg.initializer_range


for _family in HF_FAMILIES:
    register_family(_family, _builder)
