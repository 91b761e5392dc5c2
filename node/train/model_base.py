"""What every model family shares: the step's randomness, dropout from it, the model
base class and the family registry (node.train.models registers the built-in families,
node.train.hf_models the Hugging Face ones; neither imports the other's registry back)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from node.errors import SpecError
from node.spec import ModelConfig


class StepRandomness:
    """A step's dropout masks, drawn in call order from one CPU generator at the
    shape of the *whole* batch (dim 0). With gradient accumulation each chunk
    takes its rows of the masks the first chunk drew, so an m-chunk step sees
    exactly the masks of the unsplit step. A bare ``torch.Generator`` passed as
    ``rng`` behaves like this with a single chunk."""

    def __init__(self, gen: torch.Generator, batch_size: int) -> None:
        self.gen = gen
        self.batch_size = batch_size
        self._masks: list[torch.Tensor] = []
        self._call = 0
        self._rows = slice(0, batch_size)

    def begin_chunk(self, rows: slice) -> None:
        self._rows, self._call = rows, 0

    def keep_mask(self, shape: torch.Size, p: float) -> torch.Tensor:
        if self._call == len(self._masks):
            full = (self.batch_size, *shape[1:])
            self._masks.append(torch.rand(full, generator=self.gen, dtype=torch.float32) >= p)
        mask = self._masks[self._call][self._rows]
        self._call += 1
        if mask.shape != shape:
            raise RuntimeError(f"dropout mask {tuple(mask.shape)} does not fit {tuple(shape)}")
        return mask

    def uniform(self, shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
        """U[0, 1) draws for this chunk's rows and for the whole batch (MLM masking,
        node.train.hf_models), drawn once at the whole batch's shape like ``keep_mask``."""
        if self._call == len(self._masks):
            full = (self.batch_size, *shape[1:])
            self._masks.append(torch.rand(full, generator=self.gen, dtype=torch.float32))
        whole = self._masks[self._call]
        self._call += 1
        if whole[self._rows].shape != shape:
            raise RuntimeError(f"draws {tuple(whole.shape)} do not fit {tuple(shape)}")
        return whole[self._rows], whole


Randomness = torch.Generator | StepRandomness | None


class Dropout(nn.Module):
    """Dropout whose masks come from the step's CPU generator (see StepRandomness)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor, rng: Randomness) -> torch.Tensor:
        if not self.training or self.p == 0.0 or rng is None:
            return x
        if isinstance(rng, StepRandomness):
            keep = rng.keep_mask(x.shape, self.p)
        else:
            keep = torch.rand(x.shape, generator=rng, dtype=torch.float32) >= self.p
        scale = keep.to(dtype=x.dtype).mul_(1.0 / (1.0 - self.p))
        return x * scale.to(x.device)


class PolnetModel(nn.Module):
    """Base: ``forward(x, rng)`` returns logits; ``loss`` the training loss."""

    def forward(self, x: torch.Tensor, rng: Randomness = None) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])
        if flat.dtype in (torch.bfloat16, torch.float16):  # reduced-precision autocast
            flat = flat.float()
        return F.cross_entropy(flat, y.reshape(-1))


Builder = Callable[[ModelConfig], tuple[PolnetModel, float | None]]

_REGISTRY: dict[str, Builder] = {}


def register_family(family: str, builder: Builder) -> None:
    """``builder(config) -> (module, normal_std or None for uniform init)``."""
    _REGISTRY[family] = builder


def builder_for(config: ModelConfig) -> Builder:
    try:
        return _REGISTRY[config.family]
    except KeyError:
        raise SpecError(f"unknown model family {config.family!r}", field="model.family") from None
