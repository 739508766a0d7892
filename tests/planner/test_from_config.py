"""The planner as the config and synth use it: plan_config, synth's check and `make plan`."""

from __future__ import annotations

import pytest

from tests.planner.test_advisor import ADVICE_FIGURES


def _config_with(**serving_changes):
    import yaml

    from config.loader import parse_config
    from tests.conftest import CONFIG_DIR

    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["serving"].update(serving_changes)
    return data, parse_config(data)


def test_shipped_dev_config_plans_cleanly():
    from planner.from_config import plan_config

    _, config = _config_with()
    report = plan_config(config)
    assert report.ok
    assert report.decode.kv_bytes_per_token == 57344
    assert report.cost.per_hour > 4


def test_synth_fails_when_max_model_len_does_not_fit(tmp_path):
    import yaml

    from app import build_app
    from config.loader import ConfigError

    data, _ = _config_with(max_model_len=32768)
    data["serving"]["model"] = {"model_id": "qwen3-8b", "source": "Qwen/Qwen3-8B"}
    path = tmp_path / "too-long.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as caught:
        build_app(str(path), outdir=str(tmp_path / "out"))
    message = str(caught.value)
    assert "serving.max_model_len=32768" in message
    assert "at most 25424" in message


def test_synth_fails_for_unknown_s3_model_without_config_json(tmp_path):
    import yaml

    from app import build_app
    from config.loader import ConfigError

    data, _ = _config_with()
    data["serving"]["model"] = {"model_id": "mine", "source": "s3://models/mine", "source_region": "us-east-2"}
    path = tmp_path / "s3.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(
        ConfigError, match="set serving.model.hub_id to the repo it mirrors, or serving.model.config_json"
    ):
        build_app(str(path), outdir=str(tmp_path / "out"))


def test_transfer_share_warns_at_synth_and_fails_when_asked(tmp_path):
    from app import checked_plan
    from config.loader import ConfigError, parse_config

    data, _ = _config_with()
    data["planner"] = {"max_transfer_share": 0.01}
    report = checked_plan(parse_config(data), "x.yaml")
    assert any("planner.max_transfer_share" in w for w in report.warnings)
    data["planner"]["fail_on_transfer_share"] = True
    with pytest.raises(ConfigError, match="planner.max_transfer_share"):
        checked_plan(parse_config(data), "x.yaml")


def test_make_plan_cli_prints_the_report(capsys):
    from cli.plan import main
    from tests.conftest import CONFIG_DIR

    assert main([str(CONFIG_DIR / "dev.yaml")]) == 0
    out = capsys.readouterr().out
    assert "Qwen/Qwen2.5-7B-Instruct" in out
    assert "Verdict:" in out
    assert "total" in out


def test_the_configs_planner_section_is_the_planners_settings():
    from config.loader import parse_config
    from planner import render_text
    from planner.from_config import plan_config, plan_inputs

    data, config = _config_with()
    assert plan_inputs(config).settings is config.planner
    data["planner"] = {"prefill_mfu": 0.7, "typical_prompt_tokens": 2048, "runtime_overhead_gib": 2.5}
    calibrated, base = plan_config(parse_config(data)), plan_config(config)
    assert calibrated.inputs.settings.prefill_mfu == 0.7
    assert calibrated.transfer_rows[0].prefill_seconds == pytest.approx(
        base.transfer_rows[0].prefill_seconds * 0.6 / 0.7
    )
    assert calibrated.decode.kv_cache_bytes_per_gpu == base.decode.kv_cache_bytes_per_gpu - 2**30
    assert "typical request 2048 prompt / 256 output tokens" in render_text(calibrated)


def test_make_plan_json_compares_the_modes_for_the_workload_given(capsys):
    import json

    from cli.plan import main
    from tests.conftest import CONFIG_DIR

    flags = ["--prompt-tokens", "4096", "--output-tokens", "256", "--concurrency", "8", "--json"]
    assert main([str(CONFIG_DIR / "dev.yaml"), *flags]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"] == {
        "prompt_tokens": 4096,
        "output_tokens": 256,
        "range_ratio": 0.25,
        "prefix_hit_share": 0.0,
        "concurrency": 8,
    }
    for mode in ("colocated", "disaggregated"):
        for key in ADVICE_FIGURES:
            assert data["modes"][mode][key] > 0
    # dev's groups allow 2 nodes each: 1P1D to 2P2D, and 1 to 4 colocated replicas.
    assert len(data["candidates"]) >= 4 + 4
    # The recommendation says over which prefill MFU it holds, and its mode wins at the assumed one.
    band = data["recommendation"]["band"]
    low, high = band["verdict_holds_for_prefill_mfu"]
    assert low <= band["assumed_prefill_mfu"] <= high
    at_assumed = next(t for t in band["tried"] if t["prefill_mfu"] == band["assumed_prefill_mfu"])
    assert at_assumed["winner"] == data["recommendation"]["mode"]
    assert "make bench-compare" in band["summary"]


def test_make_plan_takes_a_rate_instead_of_a_concurrency(capsys):
    from cli.plan import main
    from tests.conftest import CONFIG_DIR

    assert main([str(CONFIG_DIR / "dev.yaml"), "--prompt-tokens", "512", "--output-tokens", "64", "--rate", "2"]) == 0
    out = capsys.readouterr().out
    assert "at 2 requests/s (Poisson)" in out and "Recommendation: serving.mode:" in out
    assert "How sure: " in out and "of peak (assumed 60%)" in out


def test_synth_warns_when_colocated_serves_the_workload_at_least_as_well():
    from config.loader import parse_config
    from planner.from_config import advisor_warning, plan_config

    data, config = _config_with()
    warning = advisor_warning(config, plan_config(config))
    assert warning is not None and "at least as well as the deployed 1P1D on as many GPUs" in warning
    # Judged at p99, colocated streams wait behind their neighbours' 2k-token prompt chunks: P/D pays.
    data["planner"] = {"slo_percentile": 99, "itl_slo_ms": 100}
    tight = parse_config(data)
    assert advisor_warning(tight, plan_config(tight)) is None
    data["serving"]["mode"] = "colocated"
    colocated = parse_config(data)
    assert advisor_warning(colocated, plan_config(colocated)) is None


@pytest.mark.parametrize("percentile", [50, 91, 99])
def test_advisor_judges_at_any_percentile_the_schema_allows(percentile):
    from config.loader import parse_config
    from planner.from_config import advisor_warning, plan_config

    data, _ = _config_with()
    data["planner"] = {"slo_percentile": percentile}
    config = parse_config(data)
    advisor_warning(config, plan_config(config))  # raised KeyError for a percentile outside 50/90/99


def test_the_local_prefill_caps_default_is_the_advisors_figure_for_the_default_model_on_its_gpu():
    """serving.pd_max_local_prefill_tokens' default keeps decode's step within the default ITL target
    beside the default concurrency, for the shipped model and GPU: derived again here, so a change of
    the step model, the model or the GPU that moves the figure fails until the default follows."""
    from config.schema.planner import PlannerSettings
    from planner.advisor import local_prefill_cap
    from planner.from_config import advisor_inputs, plan_config
    from planner.simulate import Slo
    from serve_app.spec import DEFAULT_LOCAL_PREFILL_CAP, ServingSpec

    _, config = _config_with()
    defaults = PlannerSettings()
    slo = Slo(defaults.ttft_slo_ms, defaults.itl_slo_ms, defaults.slo_percentile)
    cap = local_prefill_cap(advisor_inputs(config, plan_config(config)), slo, defaults.typical_concurrency)
    assert cap == DEFAULT_LOCAL_PREFILL_CAP == ServingSpec.model_fields["pd_max_local_prefill_tokens"].default


def test_make_plan_prints_the_local_prefill_cap_and_what_to_set(capsys):
    import json

    from cli.plan import main
    from tests.conftest import CONFIG_DIR

    assert main([str(CONFIG_DIR / "dev.yaml"), "--json"]) == 0
    cap = json.loads(capsys.readouterr().out)["local_prefill_cap"]
    assert cap["tokens"] > 0 and cap["configured"] == 512
    # A tighter ITL target lowers the figure, and the text says to lower the setting to it.
    main([str(CONFIG_DIR / "dev.yaml"), "--itl-slo-ms", "80", "--json"])
    tight = json.loads(capsys.readouterr().out)["local_prefill_cap"]["tokens"]
    assert 0 < tight < cap["tokens"]
    main([str(CONFIG_DIR / "dev.yaml"), "--itl-slo-ms", "80"])
    assert f"serving.pd_max_local_prefill_tokens is 512, above it: lower it to {tight} " in capsys.readouterr().out


def test_the_ucx_fallback_costs_its_transfers_at_one_tcp_flow():
    """g6.8xlarge has 25 Gbit/s; UCX moves KV over one TCP flow, which EC2 caps at 10 Gbit/s in a cluster
    placement group: every transfer takes 2.5x what it takes over EFA, and the plan says so."""
    from planner.from_config import plan_config
    from planner.report import render_text

    _, efa = _config_with()
    _, ucx = _config_with(kv_transfer={"backend": "UCX"})
    over_efa, over_tcp = plan_config(efa), plan_config(ucx)
    assert over_efa.bandwidth_bytes_per_second / over_tcp.bandwidth_bytes_per_second == pytest.approx(2.5)
    for fast, slow in zip(over_efa.transfer_rows, over_tcp.transfer_rows, strict=True):
        assert slow.transfer_seconds == pytest.approx(2.5 * fast.transfer_seconds)
    (warning,) = [w for w in over_tcp.warnings if "kv_transfer.backend" in w]
    assert warning.startswith(
        "serving.kv_transfer.backend is UCX: KV moves over one TCP flow, at most 10 of the instances' 25 Gbit/s"
    )
    assert "takes 2.5x what LIBFABRIC over EFA would" in warning
    assert "KV transfer at 7.0 Gbit/s effective (UCX over one TCP flow)" in render_text(over_tcp)
