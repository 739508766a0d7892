"""The efficiencies fitted to published measurements (planner/measurements.py): the held-out runs
land within the stated bound, the advisor predicts with the fitted figures, the fit is a least-squares
minimum, and what no measurement touches stays assumed."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from config.catalog import GPUS, INSTANCES
from planner.measurements import (
    BOUNDS,
    FIGURES,
    FIT,
    HELD_OUT,
    HELD_OUT_BOUND,
    MEASUREMENTS,
    REFERENCE,
    UNMEASURED,
    fit_family,
    fits,
    main,
    objective,
    predict,
)
from planner.models import KNOWN_MODELS
from planner.performance import ASSUMED_EFFICIENCY, GPU_FAMILY, Device, StepCost, efficiency_of

FITTED_FAMILIES = [family for family, f in fits().items() if f.fitted]


@pytest.mark.parametrize("family", FITTED_FAMILIES)
def test_every_held_out_measurement_lands_within_the_bound_and_closer_than_the_assumed_figures(family):
    f = fits()[family]
    assert f.held_out, "a family fitted on two or more runs holds one out"
    for m in f.held_out:
        fitted = predict(m, f.efficiency) / m.value - 1
        assumed = predict(m, ASSUMED_EFFICIENCY[family]) / m.value - 1
        assert abs(fitted) <= HELD_OUT_BOUND, (m.key, fitted)
        assert abs(fitted) < abs(assumed), (m.key, fitted, assumed)
    assert f.held_out_error == max(abs(e) for e in f.errors(f.held_out).values())


def test_the_advisor_predicts_an_h100_decode_step_near_the_published_one():
    """The advisor's own engine (a p5.48xlarge's H100, through efficiency_of) against the H100 runs."""
    h100 = INSTANCES["p5.48xlarge"]
    cost = StepCost.of(KNOWN_MODELS["meta-llama/llama-3.1-8b-instruct"], Device.of(h100, 1))
    for m in (m for m in MEASUREMENTS if m.gpu.model == "H100" and m.kind == "tpot" and m.concurrency == 1):
        step_ms = cost.step_seconds(1, m.prompt_tokens + m.output_tokens / 2, 0, 0.0, 0, 0) * 1e3
        assert abs(step_ms / m.value - 1) <= HELD_OUT_BOUND, (m.key, step_ms, m.value)


def test_the_advisor_uses_the_fitted_figures_and_keeps_the_assumed_ones_where_nothing_is_fitted():
    for gpu, family in GPU_FAMILY.items():
        f = fits()[family]
        assert efficiency_of(GPUS[gpu]) == f.efficiency
        if not f.fitted:
            assert f.efficiency == ASSUMED_EFFICIENCY[family]
            assert f.efficiency.source.startswith("assumed")
        for figure in FIGURES:
            if f.status(figure) == "assumed":
                assert getattr(f.efficiency, figure) == getattr(ASSUMED_EFFICIENCY[family], figure)
            else:
                assert getattr(f.efficiency, figure) != getattr(ASSUMED_EFFICIENCY[family], figure)
    # No run here isolates a prompt's prefill: every family's MFU is the assumed one, and says so.
    for family in FITTED_FAMILIES:
        assert fits()[family].status("prefill_mfu") == "assumed"
        assert "assumed, as nothing there measures it: prefill mfu" in fits()[family].efficiency.source


@pytest.mark.parametrize("family", FITTED_FAMILIES)
def test_the_fit_is_a_least_squares_minimum_within_its_bounds(family):
    f = fits()[family]
    prior = ASSUMED_EFFICIENCY[family]
    best = objective(list(f.fitted), f.efficiency, prior)
    for figure in FIGURES:
        if f.status(figure) == "assumed":
            continue
        low, high = BOUNDS[figure]
        for factor in (0.97, 1.03):
            value = getattr(f.efficiency, figure) * factor
            if low <= value <= high:
                moved = replace(f.efficiency, **{figure: value})
                assert objective(list(f.fitted), moved, prior) >= best, (figure, factor)


def test_the_fit_recovers_the_figures_that_made_the_measurements():
    # Runs made by known figures, with the published runs' shapes: the fit reproduces every one.
    truth = replace(ASSUMED_EFFICIENCY["Hopper"], decode_bandwidth=0.85, step_overhead_s=0.0015)
    made = [replace(m, value=predict(m, truth), role=FIT) for m in MEASUREMENTS if m.family == "Hopper"]
    made = [m for m in made if m.kind != "throughput"]
    f = fit_family("Hopper", made)
    for m in made:
        # Within 5 %: the weak pull towards the assumed figures costs the rest.
        assert predict(m, f.efficiency) == pytest.approx(m.value, rel=0.05), m.key


def test_every_measurement_says_where_and_how_it_was_taken():
    roles = {FIT, HELD_OUT, REFERENCE}
    for m in MEASUREMENTS:
        assert m.source.startswith("https://"), m.key
        assert m.role in roles and m.engine and m.statistic and m.dtype in ("bf16", "fp16"), m.key
        assert m.model.name.lower() in KNOWN_MODELS and m.value > 0 and m.kind in ("tpot", "latency", "throughput")
        if m.role == REFERENCE:
            assert m.assumptions, f"{m.key}: a reference says why it is not fitted"
        assert math.isfinite(predict(m, ASSUMED_EFFICIENCY[m.family]))
    assert len({m.key for m in MEASUREMENTS}) == len(MEASUREMENTS)
    # Every catalog GPU is measured, or the data say why not.
    measured = {m.gpu.model for m in MEASUREMENTS if m.role != REFERENCE}
    assert set(GPUS) <= measured | set(UNMEASURED)


def test_the_table_gives_each_family_its_figures_sources_and_held_out_error(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for family, f in fits().items():
        row = next(line for line in out.splitlines() if line.startswith(f"| {family} ("))
        expected = "none held out" if f.held_out_error is None else f"{f.held_out_error:.0%}"
        assert row.endswith(f"| {len(f.sources)} | {expected} |"), row
    assert main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["Hopper"]["held_out_error"] == fits()["Hopper"].held_out_error


def test_the_command_has_help_and_refuses_an_unknown_flag(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0 and "python -m planner.measurements" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["--held-out"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1 and "--held-out" in err


@pytest.mark.parametrize("m", [m for m in MEASUREMENTS if m.kind == "tpot"], ids=lambda m: m.key)
def test_the_fit_s_time_per_output_token_is_what_the_advisor_s_simulation_gives(m):
    """The fit predicts a closed loop's TPOT in closed form (a step of every stream and the others'
    prompt chunks, or the front end's pace, c tokens of it, whichever is slower); the advisor simulates
    the same clients step by step, each token through the front end. The two must agree, or the fitted
    figures would mean something else in `make plan` than in the fit."""
    from planner.measurements import device_of, kv_capacity_tokens
    from planner.simulate import EngineSpec, Slo, Workload, simulate

    efficiency = fits()[m.family].efficiency
    spec = EngineSpec(StepCost.of(m.model, device_of(m, efficiency)), int(kv_capacity_tokens(m)), 256, m.token_budget)
    workload = Workload(
        round(m.prompt_tokens), round(m.output_tokens), concurrency=m.concurrency, requests=4 * m.concurrency + 40
    )
    simulated = simulate(workload, Slo(1e9, 1e9), colocated=(spec, 1)).latency_ms["median_tpot_ms"]
    assert simulated == pytest.approx(predict(m, efficiency), rel=0.05)


def test_the_front_end_s_pace_is_fitted_where_a_run_at_high_concurrency_measures_it_and_negligible_elsewhere():
    from planner.performance import ASSUMED_TOKEN_OVERHEAD_S

    hopper = fits()["Hopper"]
    assert hopper.status("token_overhead_s") == "measured"
    # 16 streams at 10.9 ms a token: the front end passes a token every 0.68 ms.
    assert hopper.efficiency.token_overhead_s == pytest.approx(10.9e-3 / 16, rel=0.02)
    for family, f in fits().items():
        if family != "Hopper":
            assert f.status("token_overhead_s") == "assumed"
            assert f.efficiency.token_overhead_s == ASSUMED_TOKEN_OVERHEAD_S
