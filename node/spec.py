"""Job specs: the declarative, content-addressed description of a training job.

A spec names a model family from the built-in registry with its config, the
dataset's content hash, the optimizer, batch size, total steps ``T``,
checkpoint interval ``k``, precision, seed, resource needs, the tolerance
policy verifiers apply, and the detection target for sampling. Solvers never
run submitter code: everything is data, validated strictly here.

Public API::

    load_spec(path) -> JobSpec            # TOML or JSON file
    parse_spec(data: Mapping) -> JobSpec  # a dict (e.g. fetched over p2p)
    parse_spec_json(raw: bytes) -> JobSpec
    spec.canonical_json() -> bytes        # node.proof.canonical_json of the dump
    spec.spec_hash() -> bytes             # 32 bytes, node.proof.content_hash: goes on chain
    spec.spec_hash_hex() -> str
    spec.model.param_count() -> int       # analytic, no torch needed
    spec.detection.samples() -> int       # segments to sample (44 for f=0.1, c=0.99)

    parse_collaborative_spec(data) -> CollaborativeSpec   # issue 13: DiLoCo rounds
    parse_collaborative_spec_json(raw) -> CollaborativeSpec
    load_collaborative_spec(path) -> CollaborativeSpec

Every rejection is a :class:`node.errors.SpecError` whose ``field`` is the
dotted path of the offending field (``optimizer.lr``, ``checkpoint_interval``).

Checkpoint interval: ``k <= 50`` keeps the honest/cheat margin of segment
replay >= 10x (docs/protocol.md, Verification); up to ``MAX_CHECKPOINT_INTERVAL``
is accepted for cheap jobs where a weaker per-segment check is acceptable.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from node.boundary import decode_json_object
from node.errors import SpecError
from node.proof import canonical_json, content_hash, samples_for_detection
from node.spec_hf import HF_CONFIG_TYPES, HF_FAMILIES, HFAlbertConfig, HFGPT2Config, HFLlamaConfig

SPEC_VERSION = 1
MAX_CHECKPOINT_INTERVAL = 1000
RECOMMENDED_MAX_CHECKPOINT_INTERVAL = 50
MAX_STEPS = 10_000_000
MAX_SPEC_BYTES = 64 * 1024  # a real spec is < 2 KiB of JSON
#: The most memory a spec may declare (and so need): 256 GiB. A node compares a
#: spec's needs with its own budget too (node.train.budget, node.data.probe).
MAX_MEMORY_MB = 262_144
MAX_VOCAB = 262_144

# Precision-dependent tolerance defaults. fp32 from NOTES.md (honest <= 1.7e-4,
# cheats >= 1.3e-2 of the replayed update). bf16 honest runs differ by up to
# 0.14 of an update: its default is a loose placeholder until calibrated.
TOLERANCE_DEFAULTS: dict[str, dict[str, float]] = {
    "fp32": {"rho": 1e-3, "abs_tol": 1e-7, "adam_eps_mask_bound_factor": 2.0},
    "bf16": {"rho": 0.25, "abs_tol": 1e-4, "adam_eps_mask_bound_factor": 2.0},
}

_BYTES_PER_FLOAT = 4
HEX64 = r"^[0-9a-f]{64}$"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


# --- model families --------------------------------------------------------------


class MLPConfig(_Strict):
    """Fully connected classifier over flattened inputs."""

    family: Literal["mlp"]
    input_dim: int = Field(ge=1, le=1_000_000)
    hidden: list[Annotated[int, Field(ge=1, le=65_536)]] = Field(min_length=1, max_length=16)
    num_classes: int = Field(ge=2, le=100_000)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)

    def param_count(self) -> int:
        dims = [self.input_dim, *self.hidden, self.num_classes]
        return sum(a * b + b for a, b in zip(dims, dims[1:], strict=False))

    def activation_floats(self, batch: int) -> int:
        # input + each hidden layer's pre/post activation and dropout mask + logits
        return batch * (self.input_dim + 3 * sum(self.hidden) + 2 * self.num_classes)


class CNNConfig(_Strict):
    """Conv(3x3, pad 1) + activation + 2x2 max-pool per channel entry, then an MLP head.

    ``activation`` (conv and hidden layers) defaults to SiLU: a smooth activation
    keeps honest replays on other conv kernels within tolerance. With ReLU, every
    all-zero input patch (digits are ~50% exact-zero pixels) gives a
    pre-activation of exactly 0 at initialisation (zero biases) under oneDNN, but
    +-1e-7..1e-5 under NNPACK (PyTorch's CPU conv when oneDNN is off; it uses
    Winograd/FFT transforms, as other fast kernels may): the ReLU gate flips on
    thousands of positions, the first layer's bias gradient moved 28% and segment 0
    drifted 2e-3..7e-2 of an update (rho is 1e-3). ``"relu"`` stays available for jobs without that
    structure, at the submitter's risk of false flags.
    """

    family: Literal["cnn"]
    in_channels: int = Field(ge=1, le=64)
    image_size: int = Field(ge=4, le=512)
    channels: list[Annotated[int, Field(ge=1, le=4096)]] = Field(min_length=1, max_length=8)
    hidden: int = Field(ge=1, le=65_536)
    num_classes: int = Field(ge=2, le=100_000)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    activation: Literal["silu", "relu"] = "silu"

    @model_validator(mode="after")
    def _fits_pooling(self) -> CNNConfig:
        if self.image_size % (2 ** len(self.channels)):
            raise SpecError(
                f"image_size {self.image_size} must be divisible by 2**{len(self.channels)} "
                "(one 2x2 pooling per conv layer)", field="model.image_size")
        return self

    def flat_features(self) -> int:
        side = self.image_size // 2 ** len(self.channels)
        return self.channels[-1] * side * side

    def param_count(self) -> int:
        total, c_in = 0, self.in_channels
        for c in self.channels:
            total += c_in * c * 9 + c
            c_in = c
        return total + self.flat_features() * self.hidden + self.hidden \
            + self.hidden * self.num_classes + self.num_classes

    def activation_floats(self, batch: int) -> int:
        total, side = batch * self.in_channels * self.image_size ** 2, self.image_size
        for c in self.channels:
            total += 3 * batch * c * side * side  # conv out, activation out, pool indices-ish
            side //= 2
        return total + batch * (3 * self.hidden + 2 * self.num_classes)


class TransformerLMConfig(_Strict):
    """Decoder-only, pre-LayerNorm, learned positions, untied output head."""

    family: Literal["transformer_lm"]
    vocab_size: int = Field(ge=2, le=MAX_VOCAB)
    context: int = Field(ge=2, le=8192)
    d_model: int = Field(ge=8, le=16_384)
    n_heads: int = Field(ge=1, le=256)
    n_layers: int = Field(ge=1, le=128)
    d_ff: int = Field(ge=8, le=65_536)
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _heads_divide(self) -> TransformerLMConfig:
        if self.d_model % self.n_heads:
            raise SpecError(f"d_model {self.d_model} is not divisible by n_heads "
                            f"{self.n_heads}", field="model.n_heads")
        return self

    def param_count(self) -> int:
        d = self.d_model
        per_layer = (2 * 2 * d            # two LayerNorms
                     + 3 * d * d + 3 * d  # qkv
                     + d * d + d          # attention out
                     + d * self.d_ff + self.d_ff + self.d_ff * d + d)
        return (self.vocab_size * d + self.context * d + self.n_layers * per_layer
                + 2 * d + d * self.vocab_size + self.vocab_size)

    def activation_floats(self, batch: int) -> int:
        bt = batch * self.context
        per_layer = bt * (12 * self.d_model + 2 * self.d_ff) \
            + 3 * batch * self.n_heads * self.context ** 2
        return self.n_layers * per_layer + 3 * bt * self.vocab_size


ModelConfig = Annotated[MLPConfig | CNNConfig | TransformerLMConfig | HFLlamaConfig
                        | HFGPT2Config | HFAlbertConfig, Field(discriminator="family")]
MODEL_FAMILIES = ("mlp", "cnn", "transformer_lm", *HF_FAMILIES)
#: Families trained on token windows (``vocab_size``, ``context``).
TEXT_CONFIGS = (TransformerLMConfig, *HF_CONFIG_TYPES)


# --- optimizers --------------------------------------------------------------------


class SGDConfig(_Strict):
    name: Literal["sgd"]
    lr: float = Field(gt=0.0, le=10.0)
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    nesterov: bool = False

    def state_floats_per_param(self) -> int:
        return 1


class AdamWConfig(_Strict):
    name: Literal["adamw"]
    lr: float = Field(gt=0.0, le=1.0)
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.999, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-8, gt=0.0, le=1.0)
    weight_decay: float = Field(default=0.01, ge=0.0, le=1.0)

    def state_floats_per_param(self) -> int:
        return 2


OptimizerConfig = Annotated[SGDConfig | AdamWConfig, Field(discriminator="name")]


class Schedule(_Strict):
    """Learning rate as a pure function of the step (no state to checkpoint)."""

    kind: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(default=0, ge=0)
    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)


# --- policies ---------------------------------------------------------------------


class Resources(_Strict):
    max_memory_mb: int = Field(default=4096, ge=16, le=MAX_MEMORY_MB)


class TolerancePolicy(_Strict):
    """What the verifier accepts, per tensor and over the whole state:
    ``||R - C|| <= rho * ||R - S_start|| + abs_tol * sqrt(n)`` where n is the
    number of tightly checked coordinates (``abs_tol`` is a per-coordinate RMS
    floor, so one number fits tensors of any size). Adam coordinates with
    sqrt(v) < eps are masked out of that check and get the loose bound
    ``adam_eps_mask_bound_factor * lr * k`` instead. Missing fields default per
    precision (``TOLERANCE_DEFAULTS``); the verifier (verifier/tolerance.py)
    owns the semantics."""

    rho: float = Field(gt=0.0, le=10.0)
    abs_tol: float = Field(ge=0.0, le=1.0)
    adam_eps_mask_bound_factor: float = Field(gt=0.0, le=1000.0)


class Detection(_Strict):
    """Sample enough segments to catch a solver faking ``fraction`` of them
    with probability ``confidence``."""

    fraction: float = Field(default=0.1, gt=0.0, lt=1.0)
    confidence: float = Field(default=0.99, gt=0.0, lt=1.0)

    def samples(self) -> int:
        return samples_for_detection(self.fraction, self.confidence)


# --- the spec ---------------------------------------------------------------------


class JobSpec(_Strict):
    version: Literal[1] = 1
    name: str = Field(default="", max_length=200)
    model: ModelConfig
    dataset_hash: str = Field(pattern=HEX64, description="sha256 of the dataset file, hex")
    optimizer: OptimizerConfig
    schedule: Schedule = Schedule()
    grad_clip: float | None = Field(default=None, gt=0.0)
    batch_size: int = Field(ge=1, le=1_000_000)
    total_steps: int = Field(ge=1, le=MAX_STEPS)
    checkpoint_interval: int = Field(ge=1, le=MAX_CHECKPOINT_INTERVAL)
    precision: Literal["fp32", "bf16"] = "fp32"
    seed: int = Field(ge=0, lt=2**63)
    resources: Resources = Resources()
    tolerance: TolerancePolicy
    detection: Detection = Detection()
    # Fine-tuning: the sha256 of a safetensors file holding S_0's weights
    # (node.train.init_weights). Omitted from the canonical form when unset, so the
    # hash of every spec without it is what it was before the field existed.
    init_weights: str | None = Field(default=None, pattern=HEX64,
                                     description="sha256 of S_0's weights file, hex")

    @model_serializer(mode="wrap")
    def _omit_unset_init(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        d: dict[str, Any] = handler(self)
        if d.get("init_weights", "") is None:
            del d["init_weights"]
        return d

    @model_validator(mode="before")
    @classmethod
    def _tolerance_defaults(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        precision = data.get("precision", "fp32")
        defaults = TOLERANCE_DEFAULTS.get(precision) if isinstance(precision, str) else None
        given = data.get("tolerance", {})
        if defaults is None or not isinstance(given, Mapping):
            return data  # field validation reports the real problem
        return {**data, "tolerance": {**defaults, **given}}

    @model_validator(mode="after")
    def _cross_checks(self) -> JobSpec:
        if self.total_steps % self.checkpoint_interval:
            raise SpecError(f"total_steps {self.total_steps} is not a multiple of "
                            f"checkpoint_interval {self.checkpoint_interval}",
                            field="checkpoint_interval")
        if self.schedule.warmup_steps > self.total_steps:
            raise SpecError("warmup_steps exceeds total_steps", field="schedule.warmup_steps")
        need = self.estimated_memory_mb()
        if need > self.resources.max_memory_mb:
            raise SpecError(
                f"job needs ~{need} MB ({self.model.param_count():,} params, batch "
                f"{self.batch_size}) but resources.max_memory_mb is "
                f"{self.resources.max_memory_mb}: shrink the model or batch, or raise it",
                field="resources.max_memory_mb")
        return self

    # -- derived -------------------------------------------------------------------

    @property
    def segment_count(self) -> int:
        return self.total_steps // self.checkpoint_interval

    @property
    def tokens_per_step(self) -> int | None:
        """Input tokens a step trains on (a language model's batch x context); None for
        the vision families, whose samples are not tokens."""
        if isinstance(self.model, TEXT_CONFIGS):
            return self.batch_size * self.model.context
        return None

    def estimated_memory_mb(self) -> int:
        """Weights + grads + optimizer state + activations (fwd and bwd), fp32."""
        p = self.model.param_count()
        floats = p * (2 + self.optimizer.state_floats_per_param()) \
            + 2 * self.model.activation_floats(self.batch_size)
        return -(-floats * _BYTES_PER_FLOAT // 2**20)

    def canonical_json(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))

    def spec_hash(self) -> bytes:
        return content_hash(self.model_dump(mode="json"))

    def spec_hash_hex(self) -> str:
        return self.spec_hash().hex()


# --- collaborative jobs (issue 13) -------------------------------------------------

MAX_WORKERS = 256


class NesterovConfig(_Strict):
    """The outer optimizer of a collaborative job: SGD with Nesterov momentum on the
    averaged pseudo-gradient (OpenDiLoCo's lr 0.7, momentum 0.9 by default)."""

    name: Literal["nesterov"] = "nesterov"
    lr: float = Field(default=0.7, gt=0.0, le=10.0)
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    # Byzantine damage bound: each accepted delta's L2 norm is cut to clip_ratio x the
    # round's median norm (node.train.diloco). None: no clipping.
    clip_ratio: float | None = Field(default=None, ge=1.0, le=100.0)


class WorkerRange(_Strict):
    """How many worker slots a round has: it closes with at least ``min`` accepted
    deltas; slots are numbered ``0 .. max - 1`` and the data is cut in ``max`` shards."""

    min: int = Field(ge=1, le=MAX_WORKERS)
    max: int = Field(ge=1, le=MAX_WORKERS)

    @model_validator(mode="after")
    def _ordered(self) -> WorkerRange:
        if self.min > self.max:
            raise SpecError(f"min {self.min} exceeds max {self.max}", field="workers.min")
        return self


class CollaborativeSpec(_Strict):
    """A DiLoCo job: ``outer_rounds`` rounds; in each, every worker slot runs
    ``inner_steps`` steps of ``inner`` (the per-worker job: model, dataset, inner
    optimizer, per-worker batch, seed, schedule over ``H * R`` inner steps) from the
    shared weights on its own shard, and the outer optimizer turns the averaged
    deltas into the next shared weights. ``holdout_samples`` trailing samples of the
    dataset are in no shard (held out for evaluation). ``init_weights`` (optional): the
    sha256 of a safetensors file holding the inner model's weights, theta_0 of a
    warm-started job (DiLoCo starts from a pretrained model), which the submitter
    serves; without it theta_0 is the inner job's seeded weights. A separate model,
    not a field of :class:`JobSpec`, so single-solver specs and their hashes stay as
    they are."""

    kind: Literal["collaborative"]
    version: Literal[1] = 1
    name: str = Field(default="", max_length=200)
    inner: JobSpec
    workers: WorkerRange
    inner_steps: int = Field(ge=1, le=MAX_STEPS)
    outer_rounds: int = Field(ge=1, le=100_000)
    outer_optimizer: NesterovConfig = NesterovConfig()
    holdout_samples: int = Field(default=0, ge=0, le=100_000_000)
    init_weights: str | None = Field(default=None, pattern=HEX64,
                                     description="sha256 of theta_0's safetensors file, hex")

    @model_validator(mode="after")
    def _cross_checks(self) -> CollaborativeSpec:
        if self.inner.init_weights is not None:
            raise SpecError("a collaborative job names its theta_0 in init_weights, not "
                            "inner.init_weights", field="inner.init_weights")
        if self.inner.total_steps != self.inner_steps * self.outer_rounds:
            raise SpecError(
                f"inner.total_steps {self.inner.total_steps} must be inner_steps x "
                f"outer_rounds = {self.inner_steps * self.outer_rounds} (the inner schedule "
                "runs over every inner step of the job)", field="inner.total_steps")
        if self.inner_steps % self.inner.checkpoint_interval:
            raise SpecError(f"inner_steps {self.inner_steps} is not a multiple of "
                            f"inner.checkpoint_interval {self.inner.checkpoint_interval}",
                            field="inner_steps")
        if self.inner.schedule.warmup_steps > self.inner_steps:
            # Each round's inner run is its own trace of H steps (node.train.rounds).
            raise SpecError(f"inner.schedule.warmup_steps {self.inner.schedule.warmup_steps} "
                            f"must end within the first round ({self.inner_steps} steps)",
                            field="inner.schedule.warmup_steps")
        return self

    def _hashed(self) -> dict[str, Any]:
        # A job without init_weights hashes as it did before the field existed.
        d = self.model_dump(mode="json")
        if d["init_weights"] is None:
            del d["init_weights"]
        return d

    def canonical_json(self) -> bytes:
        return canonical_json(self._hashed())

    def spec_hash(self) -> bytes:
        return content_hash(self._hashed())

    def spec_hash_hex(self) -> str:
        return self.spec_hash().hex()


# --- loading ------------------------------------------------------------------------


_S = TypeVar("_S", JobSpec, CollaborativeSpec)
_TAGS = {"model": MODEL_FAMILIES, "optimizer": ("sgd", "adamw")}


def _field_path(loc: tuple[int | str, ...]) -> str:
    # Discriminated unions insert the tag ("model", "cnn", "channels"): drop it.
    parts: list[str] = []
    for i, part in enumerate(loc):
        if i > 0 and str(loc[i - 1]) in _TAGS and part in _TAGS[str(loc[i - 1])]:
            continue
        parts.append(str(part))
    return ".".join(parts)


def _to_spec_error(exc: ValidationError, nested: tuple[str, ...] = ()) -> SpecError:
    """``nested``: fields holding a whole JobSpec, whose own SpecErrors name paths
    from that JobSpec's root (``model.n_heads``): they get the field as a prefix."""
    err = exc.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, SpecError):
        loc = err["loc"]
        field = f"{loc[0]}.{cause.field}" if loc and loc[0] in nested and cause.field \
            else cause.field
        return SpecError(str(cause).removeprefix(f"{cause.field}: "), field=field)
    field = _field_path(tuple(err["loc"]))
    if err["type"] == "extra_forbidden":
        return SpecError("unknown field", field=field)
    ctx = err.get("ctx") or {}
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        key = str(ctx.get("discriminator", "")).strip("'")
        return SpecError(f"unknown or missing {key} {ctx.get('tag')!r}; expected one of "
                         f"{ctx.get('expected_tags', _TAGS.get(field))}", field=f"{field}.{key}")
    if err["type"] == "string_pattern_mismatch" and ctx.get("pattern") == HEX64:
        return SpecError("must be a sha256 in hex: 64 lowercase hex digits, no 0x", field=field)
    msg = err["msg"]
    if len(exc.errors()) > 1:
        msg += f" (and {len(exc.errors()) - 1} more problem(s))"
    return SpecError(msg, field=field or None)


def parse_spec(data: Mapping[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise _to_spec_error(exc) from None


def parse_spec_json(raw: bytes | str) -> JobSpec:
    """A spec from a submitter or a peer: bounded decode, then strict validation."""
    return parse_spec(decode_json_object(raw, max_bytes=MAX_SPEC_BYTES, what="spec JSON",
                                         error=SpecError))


def load_spec(path: str | Path) -> JobSpec:
    """Load a spec from ``.toml`` or ``.json`` (by suffix; other suffixes: tried as TOML)."""
    return _load_file(path, parse_spec, parse_spec_json)


def _load_file(path: str | Path, parse: Callable[[Mapping[str, Any]], _S],
               parse_json: Callable[[bytes], _S]) -> _S:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read spec file {p}: {exc.strerror}") from None
    if p.suffix.lower() == ".json":
        return parse_json(raw)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except ValueError as exc:  # TOMLDecodeError, UnicodeDecodeError, a 5000-digit int
        raise SpecError(f"{p} is not valid TOML: {exc}") from None
    return parse(data)


def parse_collaborative_spec(data: Mapping[str, Any]) -> CollaborativeSpec:
    try:
        return CollaborativeSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise _to_spec_error(exc, nested=("inner",)) from None


def parse_collaborative_spec_json(raw: bytes | str) -> CollaborativeSpec:
    return parse_collaborative_spec(decode_json_object(
        raw, max_bytes=MAX_SPEC_BYTES, what="collaborative spec JSON", error=SpecError))


def load_collaborative_spec(path: str | Path) -> CollaborativeSpec:
    return _load_file(path, parse_collaborative_spec, parse_collaborative_spec_json)


def is_collaborative_file(path: str | Path) -> bool:
    """Does the spec file say ``kind = "collaborative"``? (False for anything that does
    not parse: the single-solver loader then reports what is wrong with it.)"""
    p = Path(path)
    try:
        raw = p.read_bytes()
        data = json.loads(raw) if p.suffix.lower() == ".json" else tomllib.loads(raw.decode())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("kind") == "collaborative"
