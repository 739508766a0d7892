"""Serving mistakes caught at synth: serve_app's spec as the config's serving section."""

from __future__ import annotations

from tests.config.helpers import problems_for


def test_prefill_and_decode_cannot_name_different_models(dev_data):
    dev_data["serving"]["prefill"]["model"] = {"source": "Qwen/Qwen3-8B"}
    message = problems_for(dev_data)
    assert "serving.prefill.model: unknown key; remove it" in message


def test_gated_model_without_secret(dev_data):
    dev_data["serving"]["model"] = {"model_id": "llama", "source": "meta-llama/Llama-3.1-8B-Instruct", "gated": True}
    message = problems_for(dev_data)
    assert "serving.model: model meta-llama/Llama-3.1-8B-Instruct is gated but hf_token_secret is not set" in message


def test_engine_kwargs_cannot_override_managed_fields(dev_data):
    dev_data["serving"]["decode"]["engine_kwargs"] = {"kv_transfer_config": {}}
    message = problems_for(dev_data)
    assert "engine_kwargs.kv_transfer_config is set by the spec; use serving.kv_transfer instead" in message


def test_secret_looking_env_var_is_rejected(dev_data):
    dev_data["serving"]["env_vars"] = {"HF_TOKEN": "abc"}
    assert "env_vars.HF_TOKEN looks like a secret" in problems_for(dev_data)


def test_replica_bounds_out_of_order(dev_data):
    dev_data["serving"]["decode"]["min_replicas"] = 2
    dev_data["serving"]["decode"]["max_replicas"] = 1
    assert "serving.decode: min_replicas (2) > max_replicas (1)" in problems_for(dev_data)


def test_unknown_tool_call_parser_is_one_line_naming_the_field_and_vllms_parsers(dev_data):
    from serve_app.spec import TOOL_CALL_PARSERS

    dev_data["serving"]["tool_call_parser"] = "hermes2"
    (line,) = [line for line in problems_for(dev_data).splitlines() if "tool_call_parser" in line]
    assert (
        "serving.tool_call_parser: 'hermes2' is not a tool-call parser of vLLM 0.26.0, the serving image's; use one of"
        in line
    )
    assert all(name in line for name in TOOL_CALL_PARSERS)


def test_a_parser_only_a_newer_vllm_knows_is_refused_naming_the_images_vllm(dev_data):
    """qwen3_json and hf are vLLM 0.32's, not the image's 0.26.0: the engine's start would fail on the cluster."""
    dev_data["serving"]["tool_call_parser"] = "qwen3_json"
    dev_data["serving"]["reasoning_parser"] = "hf"
    problems = problems_for(dev_data)
    assert (
        "serving.tool_call_parser: 'qwen3_json' is not a tool-call parser of vLLM 0.26.0, the serving image's"
        in problems
    )
    assert "serving.reasoning_parser: 'hf' is not a reasoning parser of vLLM 0.26.0, the serving image's" in problems


def test_unknown_reasoning_parser_is_refused(dev_data):
    dev_data["serving"]["reasoning_parser"] = "qwen4"
    assert "serving.reasoning_parser: 'qwen4' is not a reasoning parser of vLLM 0.26.0" in problems_for(dev_data)


def test_tool_calling_is_set_by_the_spec_not_per_phase(dev_data):
    dev_data["serving"]["prefill"]["engine_kwargs"] = {"tool_call_parser": "hermes"}
    assert "engine_kwargs.tool_call_parser is set by the spec; use serving.tool_call_parser instead" in problems_for(
        dev_data
    )


def test_cached_tokens_are_refused_in_pd_and_allowed_colocated(dev_data):
    from serve_app.spec import ServingSpec

    dev_data["serving"]["decode"]["engine_kwargs"] = {"enable_prompt_tokens_details": True}
    message = problems_for(dev_data)
    assert "decode.engine_kwargs.enable_prompt_tokens_details would report the KV decode pulls" in message
    assert "remove it, or use mode: colocated" in message
    colocated = dev_data["serving"] | {
        "mode": "colocated",
        "colocated": {"engine_kwargs": {"enable_prompt_tokens_details": True}},
    }
    assert ServingSpec.model_validate(colocated).engine_kwargs("colocated")["enable_prompt_tokens_details"] is True


def test_cached_tokens_are_vllms_front_end_flag_that_ray_passes_on():
    import pytest

    pytest.importorskip("vllm", reason="the serving stack (requirements-serve.txt) is not installed")
    from vllm.entrypoints.openai.cli_args import FrontendArgs

    from serve_app.spec import PROMPT_TOKENS_DETAILS

    # Ray Serve LLM hands every engine_kwargs key that FrontendArgs has to vLLM's front end
    # (VLLMEngineConfig's frontend_kwargs in ray.llm's engines/vllm/vllm_models.py).
    assert PROMPT_TOKENS_DETAILS in FrontendArgs.__dataclass_fields__


def test_a_kv_stall_bound_not_below_the_request_timeout_is_refused(dev_data):
    dev_data["serving"]["request_timeout_s"] = 60
    dev_data["serving"]["kv_transfer"]["stall_timeout_s"] = 60
    assert (
        "serving: kv_transfer.stall_timeout_s (60) is not below request_timeout_s (60): a stalled KV read would end "
        "the request before load_failure_policy could serve it; lower kv_transfer.stall_timeout_s"
    ) in problems_for(dev_data)


def test_a_colocated_service_has_no_kv_stall_bound_to_keep_below_its_timeout(dev_data):
    from config.loader import parse_config

    dev_data["serving"]["mode"] = "colocated"
    dev_data["serving"]["request_timeout_s"] = 10
    assert parse_config(dev_data).serving.kv_transfer.stall_timeout_s == 30


def test_the_kv_stall_bound_is_rendered_for_both_phases_with_the_bounded_connector(dev_data):
    from config.loader import parse_config
    from serve_app.spec import KV_WAIT_MODULE, STALL_TIMEOUT_KEY

    dev_data["serving"]["kv_transfer"]["stall_timeout_s"] = 12
    serving = parse_config(dev_data).serving
    for phase in ("prefill", "decode"):
        rendered = serving.kv_transfer_config(phase)
        assert rendered["kv_connector_module_path"] == KV_WAIT_MODULE
        assert rendered["kv_connector_extra_config"][STALL_TIMEOUT_KEY] == 12
