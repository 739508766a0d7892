"""Generate a tiny, random, Llama-style causal LM that vLLM (CPU) can load, fully offline.

    python -m local.tiny_model OUT_DIR [--seed 0] [--layers 2] [--hidden 128] [--max-pos 2048]

Writes into OUT_DIR:
  config.json                  LlamaForCausalLM config (head_dim 64: vLLM CPU rejects 16)
  model.safetensors            random weights (torch.manual_seed(seed), normal(0, 0.02)), float32
  tokenizer.json               byte-level BPE with the 256 byte symbols and NO merges, built with `tokenizers`
                               => 1 token per byte, so an ASCII prompt of N characters is exactly N tokens
  tokenizer_config.json        PreTrainedTokenizerFast + a chat_template (needed for /v1/chat/completions)
  special_tokens_map.json, generation_config.json

Deterministic: the same arguments give byte-identical files (no timestamps; sorted JSON).
Needs only torch, safetensors and tokenizers (no transformers import, no network).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]  # ids 256, 257, 258
# Renders a request's tools as Qwen2.5's template does, in a system turn before the conversation (one
# JSON object per line), so a tool schema counts in the prompt as it does for the default model.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\n# Tools\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _dump(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def build_tokenizer(out: Path, model_max_length: int) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # 256 printable stand-ins for bytes
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.save(str(out / "tokenizer.json"))
    _dump(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": model_max_length,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _dump(out / "special_tokens_map.json", {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})
    return tok.get_vocab_size()


def build_model(
    out: Path,
    *,
    seed: int,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab_size: int,
    max_pos: int,
) -> dict:
    import torch
    from safetensors.torch import save_file

    head_dim = hidden // heads
    if head_dim != 64:
        raise SystemExit(f"head_dim must be 64 for vLLM CPU (got hidden={hidden}/heads={heads}={head_dim})")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "bos_token_id": 256,
        "eos_token_id": 257,
        "pad_token_id": 258,
        "torch_dtype": "float32",
        "initializer_range": 0.02,
        "use_cache": True,
    }
    _dump(out / "config.json", config)
    _dump(out / "generation_config.json", {"bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 258})

    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32) * 0.02

    kv = kv_heads * head_dim
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rnd(vocab_size, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = rnd(hidden, hidden)
        t[p + "self_attn.k_proj.weight"] = rnd(kv, hidden)
        t[p + "self_attn.v_proj.weight"] = rnd(kv, hidden)
        t[p + "self_attn.o_proj.weight"] = rnd(hidden, hidden)
        t[p + "mlp.gate_proj.weight"] = rnd(intermediate, hidden)
        t[p + "mlp.up_proj.weight"] = rnd(intermediate, hidden)
        t[p + "mlp.down_proj.weight"] = rnd(hidden, intermediate)
        t[p + "input_layernorm.weight"] = torch.ones(hidden)
        t[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    t["model.norm.weight"] = torch.ones(hidden)
    lm_head = rnd(vocab_size, hidden) * 10.0  # sharper logits -> less ambiguous greedy picks
    lm_head[256:] = 0.0  # special/padding rows never win strongly -> generations rarely stop on EOS
    t["lm_head.weight"] = lm_head
    save_file({k: v.contiguous() for k, v in t.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return config


def ensure_tiny_model(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Generates the default tiny model into ``out_dir`` unless it is already there; a tokenizer made
    with another chat template is made again (the weights stay)."""
    out = Path(out_dir).resolve()
    if not (out / "model.safetensors").is_file() or not (out / "tokenizer.json").is_file():
        main([str(out), "--seed", str(seed)])
        return out
    config = json.loads((out / "tokenizer_config.json").read_text())
    if config.get("chat_template") != CHAT_TEMPLATE:
        build_tokenizer(out, config["model_max_length"])
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--vocab-size", type=int, default=320, help=">= 259 (256 bytes + 3 specials)")
    ap.add_argument("--max-pos", type=int, default=2048)
    a = ap.parse_args(argv)

    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_tok = build_tokenizer(out, a.max_pos)
    if a.vocab_size < n_tok:
        raise SystemExit(f"--vocab-size {a.vocab_size} < tokenizer size {n_tok}")
    build_model(
        out,
        seed=a.seed,
        layers=a.layers,
        hidden=a.hidden,
        heads=a.heads,
        kv_heads=a.kv_heads,
        intermediate=a.intermediate,
        vocab_size=a.vocab_size,
        max_pos=a.max_pos,
    )
    print(f"wrote tiny llama to {os.path.abspath(out)} (vocab {a.vocab_size}, tokenizer {n_tok} tokens)")


if __name__ == "__main__":
    main()
