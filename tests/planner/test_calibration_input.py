"""A calibration file the fit cannot use is refused in one line that names what it lacks: another
model's run, one mode's run, a probe too short to fit (planner/calibration.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest

from bench.calibration import write_calibration
from bench.ttft import SizeResult
from planner import PlanningError
from planner.calibration import MIN_PROBE_SAMPLES, calibrate_file, load, probe_of
from tests.conftest import CONFIG_DIR, ROOT

WORKLOAD = SimpleNamespace(name="tiny", input_len=64, output_len=16, range_ratio=0.0, num_prompts=6)


def probe(mode: str, sizes: dict[int, float], samples: int = 10) -> list[SizeResult]:
    return [SizeResult(f"{mode}-{t}", t, [ms / 1e3] * samples) for t, ms in sizes.items()]


def written(tmp_path, model: str = "qwen2.5-7b-instruct", **modes: list[SizeResult]):
    return write_calibration(tmp_path, model=model, workload=WORKLOAD, rows=[], ttft=modes)


def healthy(tmp_path, model: str = "qwen2.5-7b-instruct"):
    return written(
        tmp_path,
        model,
        colocated=probe("colocated", {20: 30.0, 500: 80.0, 1500: 190.0}),
        disaggregated=probe("disaggregated", {20: 32.0, 500: 95.0, 1500: 230.0}),
    )


def advisor_inputs_of_dev():
    from config.loader import load_config
    from planner.from_config import advisor_inputs, plan_config

    config = load_config(CONFIG_DIR / "dev.yaml")
    return config, advisor_inputs(config, plan_config(config))


def test_a_run_of_both_modes_on_the_configured_model_fits(tmp_path):
    config, inputs = advisor_inputs_of_dev()
    result = calibrate_file(healthy(tmp_path), inputs, config.serving.model.model_id)
    assert result.fitted_on == (20, 1500)


def test_the_file_records_how_many_requests_each_median_is_of(tmp_path):
    data = load(healthy(tmp_path))
    assert data["ttft_probe_samples"]["colocated"] == {"20": 10, "500": 10, "1500": 10}


def test_another_models_run_is_refused_naming_both_models(tmp_path):
    config, inputs = advisor_inputs_of_dev()
    path = healthy(tmp_path, model="tiny-llama")
    with pytest.raises(PlanningError) as refused:
        calibrate_file(path, inputs, config.serving.model.model_id)
    assert str(refused.value) == (
        f"calibration {path}: measured on model 'tiny-llama', not 'qwen2.5-7b-instruct' (serving.model.model_id): "
        "calibrate with a run of qwen2.5-7b-instruct (`make bench-compare MODEL=qwen2.5-7b-instruct`)"
    )


def test_a_run_of_one_endpoint_is_refused_naming_the_modes_it_lacks(tmp_path):
    # `make bench` on one endpoint labels its probe "endpoint".
    data = load(written(tmp_path, endpoint=probe("endpoint", {20: 30.0, 500: 80.0})))
    with pytest.raises(PlanningError, match="has endpoint, not colocated and disaggregated: run `make bench-compare`"):
        probe_of(data)


def test_a_probe_size_of_too_few_requests_is_refused(tmp_path):
    data = load(
        written(
            tmp_path,
            colocated=probe("colocated", {20: 30.0, 500: 80.0}),
            disaggregated=[*probe("disaggregated", {20: 32.0}), *probe("disaggregated", {500: 95.0}, samples=2)],
        )
    )
    with pytest.raises(PlanningError) as refused:
        probe_of(data)
    assert str(refused.value).startswith(
        f"the TTFT probe of disaggregated at 500 tokens is the median of 2 request(s); the fit needs {MIN_PROBE_SAMPLES}"
    )


def test_a_size_whose_requests_all_failed_leaves_one_size_and_is_refused(tmp_path):
    data = load(
        written(
            tmp_path,
            colocated=probe("colocated", {20: 30.0, 500: 80.0}),
            disaggregated=[*probe("disaggregated", {20: 32.0}), SizeResult("failed", 500, [])],
        )
    )
    with pytest.raises(PlanningError) as refused:
        probe_of(data)
    assert str(refused.value) == (
        "the calibration needs the TTFT probe at two prompt sizes at least, measured in both modes; it has "
        "colocated at 20, 500 tokens; disaggregated at 20 tokens"
    )


def test_a_probe_value_that_is_no_time_is_refused():
    data = {"ttft_probe": {"colocated": {"20": 30.0, "500": math.nan}, "disaggregated": {"20": 32.0, "500": 95.0}}}
    with pytest.raises(PlanningError, match=r"the TTFT probe of colocated at 500 tokens holds nan, not a time"):
        probe_of(data)


def test_a_probe_that_does_not_grow_with_the_prompt_is_refused(tmp_path):
    config, inputs = advisor_inputs_of_dev()
    path = written(
        tmp_path,
        colocated=probe("colocated", {20: 90.0, 500: 80.0}),
        disaggregated=probe("disaggregated", {20: 92.0, 500: 95.0}),
    )
    with pytest.raises(
        PlanningError, match=r"colocated TTFT does not grow from 20 to 500 tokens \(90 ms, then 80 ms\)"
    ):
        calibrate_file(path, inputs, config.serving.model.model_id)


def test_a_file_that_is_not_json_is_refused(tmp_path):
    (tmp_path / "calibration.json").write_text("{not json")
    with pytest.raises(PlanningError, match=r"^not JSON \("):
        load(tmp_path)


@pytest.mark.parametrize("command", ["plan", "calibration"])
def test_the_commands_refuse_another_models_run_in_one_line_with_exit_2(tmp_path, command):
    path = healthy(tmp_path, model="tiny-llama")
    argv = (
        ["-m", "cli.plan", "config/dev.yaml", "--calibration", str(path)]
        if command == "plan"
        else ["-m", "planner.calibration", str(path), "--config", "config/dev.yaml"]
    )
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "measured on model 'tiny-llama', not 'qwen2.5-7b-instruct'" in lines[0], done.stderr


def test_an_old_file_without_sample_counts_still_fits(tmp_path):
    path = healthy(tmp_path)
    data = json.loads(path.read_text())
    del data["ttft_probe_samples"]
    path.write_text(json.dumps(data))
    config, inputs = advisor_inputs_of_dev()
    assert calibrate_file(path, inputs, config.serving.model.model_id).fitted_on == (20, 1500)
