"""Model architecture facts: a built-in table of common open models and a local config.json reader.

Nothing here downloads anything: synth must work offline and give the same answer every time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from planner.errors import PlanningError, field_name

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
}


@dataclass(frozen=True)
class ModelArchitecture:
    """The shapes that decide memory and compute; the names follow Hugging Face config.json."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    num_parameters: int
    vocab_size: int
    default_dtype: str = "bfloat16"
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False

    @property
    def matmul_parameters(self) -> int:
        """The weights a prompt token multiplies: all but the embedding (a lookup) and the LM head
        (run once per sampled token, not per prompt token)."""
        return self.num_parameters - self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V for every layer; GQA models store only their KV heads, not all attention heads."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise PlanningError(f"{field_name('dtype')}={dtype!r} is not one of {', '.join(sorted(DTYPE_BYTES))}") from None


def _m(name, layers, hidden, heads, kv, head_dim, params, vocab, max_pos, tied=False):
    return ModelArchitecture(name, layers, hidden, heads, kv, head_dim, params, vocab, "bfloat16", max_pos, tied)


# From each model's config.json; parameter counts are the exact safetensors totals on the model card.
KNOWN_MODELS: dict[str, ModelArchitecture] = {
    m.name.lower(): m
    for m in (
        _m("Qwen/Qwen2.5-7B-Instruct", 28, 3584, 28, 4, 128, 7_615_616_512, 152_064, 32_768),
        _m("Qwen/Qwen2.5-1.5B-Instruct", 28, 1536, 12, 2, 128, 1_543_714_304, 151_936, 32_768, tied=True),
        _m("Qwen/Qwen3-8B", 36, 4096, 32, 8, 128, 8_190_735_360, 151_936, 40_960),
        _m("meta-llama/Llama-3.1-8B-Instruct", 32, 4096, 32, 8, 128, 8_030_261_248, 128_256, 131_072),
        _m("mistralai/Mistral-7B-Instruct-v0.3", 32, 4096, 32, 8, 128, 7_248_023_552, 32_768, 32_768),
        _m("meta-llama/Llama-3.1-70B-Instruct", 80, 8192, 64, 8, 128, 70_553_706_496, 128_256, 131_072),
        _m("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 22, 2048, 32, 4, 64, 1_100_048_384, 32_000, 2_048),
    )
}


def estimate_parameters(config: dict) -> int:
    """Parameter count of a dense Llama-style decoder (Llama, Mistral, Qwen2/3) from its shapes.

    Per layer: Q/K/V/O projections, a gated MLP (three matrices) and two RMSNorms; plus the
    embedding, an untied LM head and the final norm. Qwen2 adds Q/K/V biases, Qwen3 Q/K norms.
    """
    if any(k in config for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        raise PlanningError(
            "mixture-of-experts configs are not estimated: add the model to KNOWN_MODELS in planner/models.py"
        )
    try:
        hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
        layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    except KeyError as missing:
        raise PlanningError(f"config.json lacks {missing} needed to estimate the parameter count") from None
    kv = config.get("num_key_value_heads", heads)
    hd = config.get("head_dim") or hidden // heads
    q, k = heads * hd, kv * hd
    per_layer = hidden * q + 2 * hidden * k + q * hidden + 3 * hidden * inter + 2 * hidden
    if config.get("attention_bias") or config.get("model_type") == "qwen2":
        per_layer += q + 2 * k
    if config.get("model_type") == "qwen3":
        per_layer += 2 * hd
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings + hidden


def architecture_from_config(name: str, config: dict) -> ModelArchitecture:
    """Build an architecture from a parsed Hugging Face config.json."""
    try:
        heads = config["num_attention_heads"]
        arch = ModelArchitecture(
            name=name,
            num_layers=config["num_hidden_layers"],
            hidden_size=config["hidden_size"],
            num_attention_heads=heads,
            num_kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            num_parameters=config.get("num_parameters") or estimate_parameters(config),
            vocab_size=config["vocab_size"],
            default_dtype=config.get("torch_dtype") or config.get("dtype") or "bfloat16",
            max_position_embeddings=config.get("max_position_embeddings"),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    except KeyError as missing:
        raise PlanningError(f"config.json for {name} lacks {missing}") from None
    return arch


def load_architecture(model_source: str, config_json: str | Path | None = None) -> ModelArchitecture:
    """The architecture of ``model_source``: a local config.json (file or its folder) wins over the table."""
    if config_json is not None:
        path = Path(config_json)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise PlanningError(f"{field_name('config_json')}={str(config_json)!r}: no config.json there")
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise PlanningError(f"{path} is not valid JSON: {exc}") from None
        return architecture_from_config(model_source, config)
    try:
        return KNOWN_MODELS[model_source.lower()]
    except KeyError:
        raise PlanningError(
            f"{field_name('model')}={model_source!r} is not in the planner's model table: add its "
            f"architecture to KNOWN_MODELS in planner/models.py or set {field_name('config_json')} "
            "to a local config.json (the planner never downloads one)"
        ) from None
