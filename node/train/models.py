"""The built-in model registry: MLP, small CNN, char-level transformer LM.

Models are built on the CPU from ``(config, seed)`` with every parameter
initialised explicitly from a seeded ``torch.Generator`` (never the global
RNG), so any node builds the same S_0 bit for bit. Dropout takes its masks
from the per-step CPU generator passed to ``forward`` and moves them to the
device: masks are then identical on every device.

Public API::

    build_model(config, seed) -> PolnetModel     # forward(x, rng=None) -> logits
    StepRandomness(gen, batch_size)              # rng for (micro-batched) steps
    register_family(family, builder)             # add a family (spec.py must know it too)
    save_model(path, tensors, spec, **meta)      # weights + the job's spec, one file
    load_model(path, device="cpu") -> PolnetModel  # the exact architecture, weights, eval()
    model_spec(path) -> JobSpec                  # the spec a model file was trained from

A model file is safetensors: the weights under their module names, and under the
one metadata key ``"polnet"`` canonical JSON ``{"format": "polnet-model/1", "spec":
<the spec's canonical JSON>, ...}``. The spec is what rebuilds the architecture
(family, sizes, activation), so a model file needs nothing beside it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from node.boundary import check_fields, decode_json_object
from node.errors import MalformedInput, SpecError
from node.fsutil import atomic_write
from node.proof import canonical_json
from node.spec import (
    CNNConfig,
    JobSpec,
    MLPConfig,
    ModelConfig,
    TransformerLMConfig,
    parse_spec_json,
)
from node.tensorfile import Header, parse_header
from node.train.model_base import (
    Builder,
    Dropout,
    PolnetModel,
    Randomness,
    StepRandomness,
    builder_for,
    register_family,
)


class MLP(PolnetModel):
    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        dims = [cfg.input_dim, *cfg.hidden]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:], strict=False))
        self.head = nn.Linear(dims[-1], cfg.num_classes)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, rng: Randomness = None) -> torch.Tensor:
        h = x.flatten(1)
        for layer in self.layers:
            h = self.drop(F.relu(layer(h)), rng)
        out: torch.Tensor = self.head(h)
        return out


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": F.silu,
                                                                    "relu": F.relu}


class CNN(PolnetModel):
    def __init__(self, cfg: CNNConfig) -> None:
        super().__init__()
        chans = [cfg.in_channels, *cfg.channels]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1)
                                   for a, b in zip(chans, chans[1:], strict=False))
        self.fc = nn.Linear(cfg.flat_features(), cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.num_classes)
        self.drop = Dropout(cfg.dropout)
        # Smooth by default: see CNNConfig (ReLU's kink at an exact-zero pre-activation
        # makes honest replays on other conv kernels diverge at S_0).
        self.act: Callable[[torch.Tensor], torch.Tensor] = _ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor, rng: Randomness = None) -> torch.Tensor:
        h = x
        for conv in self.convs:
            h = F.max_pool2d(self.act(conv(h)), 2)
        h = self.drop(self.act(self.fc(h.flatten(1))), rng)
        out: torch.Tensor = self.head(h)
        return out


class Block(nn.Module):
    def __init__(self, cfg: TransformerLMConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ff1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.ff2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.drop = Dropout(cfg.dropout)
        mask = torch.ones(cfg.context, cfg.context, dtype=torch.bool).triu(1)
        self.register_buffer("causal", mask, persistent=False)  # not state: derived

    def forward(self, x: torch.Tensor, rng: Randomness) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)
                   for z in (q, k, v))
        # Explicit attention (not SDPA): its dropout would draw from the global RNG.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.n_heads))
        causal = self.get_buffer("causal")
        att = att.masked_fill(causal[:t, :t], float("-inf")).softmax(dim=-1)
        y = (self.drop(att, rng) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y), rng)
        return x + self.drop(self.ff2(F.gelu(self.ff1(self.ln2(x)))), rng)


class TransformerLM(PolnetModel):
    def __init__(self, cfg: TransformerLMConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, rng: Randomness = None) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device)
        h = self.drop(self.tok(x) + self.pos(pos), rng)
        for block in self.blocks:
            h = block(h, rng)
        out: torch.Tensor = self.head(self.ln_f(h))
        return out


# --- deterministic initialisation --------------------------------------------------


def _norm_weights(model: nn.Module) -> set[int]:
    # RMSNorm: transformers' own class per family (LlamaRMSNorm), weight ones too.
    return {id(m.weight) for m in model.modules()
            if (isinstance(m, nn.LayerNorm) or type(m).__name__.endswith("RMSNorm"))
            and isinstance(getattr(m, "weight", None), torch.Tensor)}


def _draw(shape: tuple[int, ...], gen: torch.Generator, normal_std: float | None
          ) -> torch.Tensor:
    """A matrix's initial value: U(+-1/sqrt(fan_in)) or N(0, normal_std)."""
    if normal_std is not None:
        return torch.randn(shape, generator=gen) * normal_std
    bound = 1.0 / math.sqrt(math.prod(shape[1:]))
    return torch.rand(shape, generator=gen) * (2 * bound) - bound


def _init_params(model: nn.Module, gen: torch.Generator, normal_std: float | None) -> None:
    """Norm weights 1, biases 0; matrices as ``_draw`` makes them.

    Parameters are visited in registration order, which is fixed by the code."""
    norm_weights = _norm_weights(model)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.fill_(1.0 if id(p) in norm_weights else 0.0)
            else:
                p.copy_(_draw(tuple(p.shape), gen, normal_std))


register_family("mlp", lambda c: (MLP(c), None))  # type: ignore[arg-type]
register_family("cnn", lambda c: (CNN(c), None))  # type: ignore[arg-type]
register_family("transformer_lm", lambda c: (TransformerLM(c), 0.02))  # type: ignore[arg-type]


def build_skeleton(config: ModelConfig) -> PolnetModel:
    """The module on the meta device: names, shapes and dtypes, no memory, no init.

    What a checkpoint of this config must hold is read from it before loading one."""
    builder = builder_for(config)
    with torch.device("meta"):
        model, _ = builder(config)
    return model


@contextlib.contextmanager
def _params_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (one at a time is
    ever real) and their buffers real: ``torch.device("meta")`` would lose buffers a
    module derives as it is built (a causal mask)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def build_deferred(config: ModelConfig, init_seed: int
                   ) -> tuple[PolnetModel, Callable[[str], torch.Tensor]]:
    """``build_model``'s module with its parameters on the meta device (buffers real)
    and ``value(name)``: that parameter's initial value, the very tensor ``build_model``
    gives it, made afresh at each call: a sharded run materialises one parameter at a
    time and keeps its shard. Matrices draw from the generator in registration
    order; its state before each draw is kept, so any one is redrawn alone."""
    builder = builder_for(config)
    with _params_on_meta():
        model, std = builder(config)
    norm_weights = _norm_weights(model)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(init_seed)
    plans: dict[str, tuple[torch.Tensor | None, float]] = {}  # name -> (gen state, fill)
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, torch.dtype] = {}
    for name, p in model.named_parameters():
        shape = shapes[name] = tuple(p.shape)
        dtypes[name] = p.dtype
        if p.ndim == 1:
            plans[name] = (None, 1.0 if id(p) in norm_weights else 0.0)
        else:
            plans[name] = (gen.get_state(), 0.0)
            _draw(shape, gen, std)  # advances the generator as build_model does

    def value(name: str) -> torch.Tensor:
        state, fill = plans[name]
        if state is None:
            return torch.full(shapes[name], fill, dtype=dtypes[name])
        g = torch.Generator(device="cpu")
        g.set_state(state)
        return _draw(shapes[name], g, std).to(dtypes[name])

    return model, value


def build_model(config: ModelConfig, init_seed: int) -> PolnetModel:
    """Build on the CPU and initialise from ``init_seed`` only."""
    builder = builder_for(config)
    model, std = builder(config)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(init_seed)
    _init_params(model, gen, std)
    return model


# --- model files -------------------------------------------------------------------

MODEL_FORMAT = "polnet-model/1"
_META_KEY = "polnet"
_MAX_MODEL_HEADER = 16 * 2**20  # tensor entries + a spec of at most 64 KiB
_MODEL_PREFIX = "model."


def save_model(path: str | Path, tensors: Mapping[str, torch.Tensor], spec: JobSpec,
               **meta: Any) -> Path:
    """Write the weights of ``tensors`` (a checkpoint's ``model.*`` entries, or a
    module's state_dict) with ``spec`` inside; ``meta`` (job id, state hash) is kept
    beside it in the metadata. Atomic: a reader sees the old file or the new one."""
    prefixed = any(k.startswith(_MODEL_PREFIX) for k in tensors)
    weights = {k.removeprefix(_MODEL_PREFIX): v.detach().to("cpu").contiguous()
               for k, v in tensors.items() if not prefixed or k.startswith(_MODEL_PREFIX)}
    header = {"format": MODEL_FORMAT, "spec": spec.canonical_json().decode("utf-8"),
              "spec_hash": spec.spec_hash_hex(), **meta}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, st_save(weights, metadata={_META_KEY: canonical_json(header).decode()}))
    return out


def _bad_model(path: Path) -> Callable[[str], MalformedInput]:
    def make(message: str) -> MalformedInput:
        return MalformedInput(f"{path}: {message}; fetch it again with `polnet job fetch JOB "
                              "--out FILE` (it writes the weights with the job's spec)")
    return make


def _read_model_file(path: str | Path) -> tuple[bytes, JobSpec, Header]:
    p = Path(path)
    bad = _bad_model(p)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror})") from None
    header = parse_header(raw, max_header=_MAX_MODEL_HEADER, what=str(p), error=bad)
    if _META_KEY not in header.metadata:
        raise bad("holds no polnet metadata (written by an older `polnet job fetch`?)")
    meta = decode_json_object(header.metadata[_META_KEY], max_bytes=_MAX_MODEL_HEADER,
                              what="model metadata", error=bad)
    check_fields(meta, {"format": "str", "spec": "str"}, extra_ok=True,
                 what="model metadata", error=bad)
    if meta["format"] != MODEL_FORMAT:
        raise bad(f"format {meta['format'][:40]!r} is not {MODEL_FORMAT}")
    try:
        spec = parse_spec_json(meta["spec"])
    except SpecError as exc:
        raise bad(f"its spec does not validate ({exc})") from None
    return raw, spec, header


def model_spec(path: str | Path) -> JobSpec:
    """The job spec a model file was trained from (its architecture and data)."""
    return _read_model_file(path)[1]


def load_model(path: str | Path, device: str | torch.device = "cpu") -> PolnetModel:
    """Rebuild the exact architecture of the spec inside ``path``, load its weights
    and return it in eval mode: ``load_model(p)(x)`` gives the logits of the trained
    model, bit for bit those of the solver's final state on the same device."""
    raw, spec, header = _read_model_file(path)
    bad = _bad_model(Path(path))
    want = {n: tuple(t.shape) for n, t in build_skeleton(spec.model).state_dict().items()}
    got = {n: t.shape for n, t in header.tensors.items()}
    if got != want:
        missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
        wrong = sorted(n for n in want.keys() & got.keys() if want[n] != got[n])
        raise bad(f"its tensors do not fit its spec's {spec.model.family} (missing "
                  f"{missing[:3]}, unexpected {extra[:3]}, other shape {wrong[:3]})")
    if any(t.dtype != "F32" for t in header.tensors.values()):
        raise bad("weights must be F32")
    model = build_model(spec.model, 0)  # initialised, then every tensor replaced
    model.load_state_dict(st_load(raw), strict=True)
    return model.to(device).eval()


__all__ = ["Builder", "Dropout", "PolnetModel", "Randomness", "StepRandomness", "build_model",
           "build_skeleton", "load_model", "model_spec", "register_family", "save_model"]

# The Hugging Face families register themselves (transformers is imported lazily).
import node.train.hf_models  # noqa: E402, F401
