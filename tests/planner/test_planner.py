"""Planner numbers checked against arithmetic done by hand from the models' config.json values."""

from __future__ import annotations

import json

import pytest

from config.catalog import EKS_CONTROL_PLANE_PER_HOUR, EKS_EXTENDED_SUPPORT_PER_HOUR, INSTANCES, NAT_GATEWAY_PER_HOUR
from planner import (
    PhasePlanInputs,
    PlanInputs,
    PlannerSettings,
    PlanningError,
    load_architecture,
    plan,
    prefill_flops,
    render_text,
)

GIB = 2**30
L4 = PhasePlanInputs("g6.8xlarge", tensor_parallel_size=1, nodes=1)


def inputs(model: str, settings: dict | None = None, **overrides) -> PlanInputs:
    return PlanInputs(model=model, prefill=L4, decode=L4, settings=PlannerSettings(**(settings or {})), **overrides)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 32 * 8 * 128 * 2 * 2),  # 131072
        ("Qwen/Qwen2.5-7B-Instruct", 28 * 4 * 128 * 2 * 2),  # 57344
        ("mistralai/Mistral-7B-Instruct-v0.3", 32 * 8 * 128 * 2 * 2),  # 131072
        ("Qwen/Qwen3-8B", 36 * 8 * 128 * 2 * 2),  # 147456
        ("meta-llama/Llama-3.1-70B-Instruct", 80 * 8 * 128 * 2 * 2),  # 327680
    ],
)
def test_kv_bytes_per_token(model: str, expected: int) -> None:
    assert load_architecture(model).kv_bytes_per_token(2) == expected
    assert plan(inputs(model, max_model_len=1024)).decode.kv_bytes_per_token == expected


def test_known_values_spelled_out() -> None:
    assert load_architecture("meta-llama/Llama-3.1-8B-Instruct").kv_bytes_per_token(2) == 131072 == 128 * 1024
    assert load_architecture("qwen/qwen2.5-7b-instruct").kv_bytes_per_token(2) == 57344


def test_qwen_7b_memory_on_l4_by_hand() -> None:
    phase = plan(inputs("Qwen/Qwen2.5-7B-Instruct")).decode
    weights = 7_615_616_512 * 2
    assert phase.weight_bytes_per_gpu == weights == 15_231_233_024
    # 0.9 × 22.5 GiB budget, less weights and the 1.5 GiB runtime overhead.
    kv_cache = int(0.9 * 22.5 * GIB) - weights - int(1.5 * GIB)
    assert phase.kv_cache_bytes_per_gpu == kv_cache == 4_901_426_176
    # Whole 16-token blocks of 57344 bytes per token.
    assert phase.max_cached_tokens == kv_cache // (16 * 57344) * 16 == 85_472
    assert phase.max_concurrency_at_max_model_len == pytest.approx(85_472 / 8192)
    assert phase.fits and phase.problem is None


def test_tensor_parallel_splits_weights_and_kv_heads() -> None:
    tp4 = PhasePlanInputs("g6.12xlarge", tensor_parallel_size=4)
    report = plan(PlanInputs("Qwen/Qwen2.5-7B-Instruct", prefill=tp4, decode=tp4))
    assert report.decode.weight_bytes_per_gpu == 7_615_616_512 * 2 // 4
    assert report.decode.kv_bytes_per_token_per_gpu == 28 * 1 * 128 * 2 * 2
    assert report.decode.kv_bytes_per_token == 57344


def test_70b_does_not_fit_on_l4() -> None:
    report = plan(inputs("meta-llama/Llama-3.1-70B-Instruct"))
    assert not report.ok and not report.decode.fits
    assert report.decode.kv_cache_bytes_per_gpu < 0
    message = report.decode.problem
    assert "does not fit" in message and "serving.decode.tensor_parallel_size=8" in message
    assert "cluster.gpu_node_groups.decode.instance_type" in message and "g6.48xlarge" in message
    assert message in report.errors
    assert report.verdict.startswith("not deployable")


def test_max_model_len_too_long_suggests_maximum() -> None:
    report = plan(inputs("Qwen/Qwen3-8B", max_model_len=32768))
    kv_cache = int(0.9 * 22.5 * GIB) - 8_190_735_360 * 2 - int(1.5 * GIB)
    most = kv_cache // (16 * 147456) * 16
    assert most == 25_424
    assert report.decode.max_cached_tokens == most
    assert "serving.max_model_len=32768 does not fit" in report.decode.problem
    assert f"lower serving.max_model_len to at most {most}" in report.decode.problem
    assert plan(inputs("Qwen/Qwen3-8B", max_model_len=most)).ok


def test_max_model_len_beyond_model_context() -> None:
    report = plan(inputs("TinyLlama/TinyLlama-1.1B-Chat-v1.0", max_model_len=4096))
    assert any("exceeds the 2048-token context" in e for e in report.errors)


def test_tensor_parallel_larger_than_gpu_count() -> None:
    report = plan(PlanInputs("Qwen/Qwen2.5-7B-Instruct", prefill=PhasePlanInputs("g6.8xlarge", 2), decode=L4))
    assert "serving.prefill.tensor_parallel_size=2 exceeds the 1 GPU(s) of g6.8xlarge" in report.prefill.problem


def test_prefill_and_transfer_time_by_hand() -> None:
    report = plan(inputs("Qwen/Qwen2.5-7B-Instruct"))
    row = next(r for r in report.transfer_rows if r.prompt_tokens == 4096)
    # The matmuls' weights: all of Qwen2.5-7B's 7.62 B but its untied embedding and LM head (152,064 × 3,584
    # each), which a prompt token does not multiply; the LM head once, for the one sampled token.
    matmul = 7_615_616_512 - 2 * 152_064 * 3584
    assert report.model.matmul_parameters == matmul == 6_525_621_760
    flops = 2 * matmul * 4096 + 2 * 28 * 4096**2 * (28 * 128) + 2 * 3584 * 152_064
    assert prefill_flops(report.model, 4096) == flops
    # L4 peak 121 TFLOPS BF16 at Ada's 60 % MFU (planner/performance.py).
    assert row.prefill_seconds == pytest.approx(flops / (121e12 * 0.6))
    assert row.prefill_seconds == pytest.approx(0.7827, abs=1e-4)
    # 25 Gbit/s at 70 % efficiency = 2.1875 GB/s.
    assert row.kv_bytes == 4096 * 57344 == 234_881_024
    assert row.transfer_seconds == pytest.approx(234_881_024 / 2.1875e9)
    assert row.transfer_share == pytest.approx(row.transfer_seconds / row.prefill_seconds)
    assert [r.prompt_tokens for r in report.transfer_rows] == [1024, 2048, 4096, 8192]
    assert report.skipped_prompt_lengths == [16384, 32768]
    # 107 ms of transfer against a 0.78 s prefill is 14 %, above half the 25 % limit.
    assert report.verdict.startswith("marginal: at 4096-token prompts moving the KV cache takes 14%")


def test_calibration_override() -> None:
    slow = plan(inputs("Qwen/Qwen2.5-7B-Instruct", settings={"prefill_mfu": 0.7}))
    base = plan(inputs("Qwen/Qwen2.5-7B-Instruct"))
    assert slow.transfer_rows[0].prefill_seconds == pytest.approx(base.transfer_rows[0].prefill_seconds * 0.6 / 0.7)


def test_transfer_share_warns_or_fails() -> None:
    # A tiny model prefills fast, so moving its KV over 25 Gbit/s is a large share of prefill time.
    warn = plan(inputs("TinyLlama/TinyLlama-1.1B-Chat-v1.0", {"max_transfer_share": 0.01}, max_model_len=2048))
    assert any("planner.max_transfer_share=0.01" in w for w in warn.warnings) and warn.ok
    assert warn.verdict.startswith("not worth it")
    strict = {"max_transfer_share": 0.01, "fail_on_transfer_share": True}
    fail = plan(inputs("TinyLlama/TinyLlama-1.1B-Chat-v1.0", strict, max_model_len=2048))
    assert any("planner.max_transfer_share" in e for e in fail.errors)


def test_rdma_and_efa_notes() -> None:
    report = plan(inputs("Qwen/Qwen2.5-7B-Instruct"))
    assert any("no GPUDirect RDMA" in w for w in report.warnings)
    no_efa = plan(PlanInputs("Qwen/Qwen2.5-1.5B-Instruct", prefill=PhasePlanInputs("g6.xlarge"), decode=L4))
    assert any(w.startswith("g6.xlarge (prefill) has no EFA") for w in no_efa.warnings)


def test_price_arithmetic() -> None:
    report = plan(
        PlanInputs(
            "Qwen/Qwen2.5-7B-Instruct",
            prefill=L4,
            decode=L4,
            system_instance_type="m7i.xlarge",
            system_nodes=1,
            nat_gateways=1,
        )
    )
    hourly = (
        INSTANCES["m7i.xlarge"].price_per_hour
        + 2 * INSTANCES["g6.8xlarge"].price_per_hour
        + NAT_GATEWAY_PER_HOUR
        + EKS_CONTROL_PLANE_PER_HOUR
    )
    assert report.cost.per_hour == pytest.approx(hourly)
    assert report.cost.per_month == pytest.approx(hourly * 24 * 30, abs=0.01)
    # With the 2026-11 table: 0.2016 + 2 × 2.0144 + 0.045 + 0.10.
    if INSTANCES["g6.8xlarge"].price_per_hour == 2.0144 and INSTANCES["m7i.xlarge"].price_per_hour == 0.2016:
        assert report.cost.per_hour == pytest.approx(4.3754)
        assert report.cost.per_month == pytest.approx(3150.29)
    assert [line.count for line in report.cost.lines] == [1, 1, 1, 1, 1]


def test_extended_support_and_endpoints() -> None:
    report = plan(inputs("Qwen/Qwen2.5-7B-Instruct", eks_extended_support=True, interface_endpoints=6))
    items = {line.item: line for line in report.cost.lines}
    assert items["EKS control plane (extended support)"].per_hour == EKS_EXTENDED_SUPPORT_PER_HOUR
    assert "EKS control plane" not in items
    assert items["interface endpoints (per AZ)"].per_hour == pytest.approx(6 * 0.01)


def test_local_config_json_wins(tmp_path) -> None:
    config = {
        "model_type": "llama",
        "num_hidden_layers": 16,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 131072,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    arch = load_architecture("meta-llama/Llama-3.1-8B-Instruct", tmp_path)
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim) == (16, 8, 64)
    assert arch.kv_bytes_per_token(2) == 16 * 8 * 64 * 2 * 2
    # Llama-3.2-1B's shapes: embedding tied, so 1,235,814,400 parameters as on its model card.
    per_layer = 2048 * 2048 * 2 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048
    assert arch.num_parameters == 16 * per_layer + 128256 * 2048 + 2048 == 1_235_814_400


def test_unknown_model_says_what_to_do(tmp_path) -> None:
    with pytest.raises(PlanningError) as excinfo:
        load_architecture("acme/unknown-13b")
    message = str(excinfo.value)
    assert "KNOWN_MODELS in planner/models.py" in message and "config.json" in message
    with pytest.raises(PlanningError, match="no config.json there"):
        load_architecture("acme/unknown-13b", tmp_path)


def test_unknown_instance_type() -> None:
    with pytest.raises(PlanningError, match="cluster.gpu_node_groups.decode.instance_type='g9.huge'"):
        plan(PlanInputs("Qwen/Qwen2.5-7B-Instruct", prefill=L4, decode=PhasePlanInputs("g9.huge")))


def test_render_text_shows_key_numbers() -> None:
    text = render_text(plan(inputs("Qwen/Qwen2.5-7B-Instruct")))
    for needle in (
        "Qwen/Qwen2.5-7B-Instruct",
        "14.19 GiB",
        "56 KiB",
        "85,472",
        "782.7 ms",
        "224.0 MiB",
        "107.4 ms",
        "Verdict: marginal",
        "4.3754",
        "3,150.29",
        "2026-11",
    ):
        assert needle in text, needle


def test_plan_inputs_default_to_the_configs_default_settings() -> None:
    # The hand arithmetic above uses these: the GPU family's MFU, 70 % network efficiency, 1.5 GiB overhead.
    settings = PlanInputs("Qwen/Qwen2.5-7B-Instruct", prefill=L4, decode=L4).settings
    assert settings == PlannerSettings()
    assert (settings.prefill_mfu, settings.network_efficiency, settings.runtime_overhead_gib) == (None, 0.7, 1.5)
    assert (settings.typical_prompt_tokens, settings.typical_output_tokens) == (4096, 256)
    assert (settings.max_transfer_share, settings.fail_on_transfer_share) == (0.25, False)
