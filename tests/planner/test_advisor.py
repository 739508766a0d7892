"""The advisor's step model, simulation, recommendation and calibration (planner/performance.py,
simulate.py, advisor.py, calibration.py), by hand where the arithmetic allows it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from config.catalog import INSTANCES
from planner.advisor import AdvisorInputs, advise, recommended_threshold
from planner.calibration import fit, single_request_ttft
from planner.errors import PlanningError
from planner.measurements import family_efficiencies
from planner.models import KNOWN_MODELS
from planner.performance import Device, Link, StepCost
from planner.simulate import Engine, EngineSpec, Request, Slo, Workload, simulate

QWEN = KNOWN_MODELS["qwen/qwen2.5-7b-instruct"]
G6 = INSTANCES["g6.8xlarge"]
KV_TOKENS = 60_000


def l4_cost() -> StepCost:
    return StepCost.of(QWEN, Device.of(G6, 1))


def engine(cost: StepCost | None = None, kv_tokens: int = KV_TOKENS) -> EngineSpec:
    return EngineSpec(cost or l4_cost(), kv_tokens, 256, 2048)


def g6_link() -> Link:
    return Link.between(G6, G6, 0.7)


# One step and one transfer, by hand ---------------------------------------------------------------


def test_a_decode_step_reads_the_weights_and_the_kv_cache_once():
    # 7.62 B bf16 weights and 4,096 tokens of 57,344-byte KV, over 300 GB/s at 80 %, plus 4 ms.
    expected = (7_615_616_512 * 2 + 4096 * 57_344) / (300e9 * 0.8) + 0.004
    assert l4_cost().seconds([4096], []) == pytest.approx(expected)
    assert expected == pytest.approx(0.0684, abs=1e-4)


def test_a_prefill_chunk_is_compute_bound_and_counts_no_embedding_flops():
    matmul = 2 * QWEN.matmul_parameters * 2048
    attention = 4 * 28 * 28 * 128 * 2048 * (2048 / 2)
    logits = 2 * 3584 * 152_064
    expected = (matmul + attention + logits) / (121e12 * 0.6) + 0.004
    assert l4_cost().seconds([], [(0, 2048)]) == pytest.approx(expected)


def test_without_gpudirect_the_kv_cache_is_copied_through_host_memory_on_both_sides():
    link = g6_link()
    assert not G6.gpudirect_rdma and link.staging_bytes_per_s == 20e9
    kv = 4096 * 57_344
    # 25 Gbit/s at 70 %, two PCIe copies, and the fixed cost.
    assert link.seconds(kv) == pytest.approx(0.004 + kv / (25e9 / 8 * 0.7) + 2 * kv / 20e9)


def test_a_gpu_no_family_covers_is_still_advised_on_with_the_least_any_family_reaches_said_to_be_assumed(
    monkeypatch,
):
    from config import catalog
    from planner.performance import GPU_FAMILY, efficiency_of

    h100 = INSTANCES["p5.48xlarge"].gpu_facts
    table = family_efficiencies()
    assert efficiency_of(h100) == table[GPU_FAMILY["H100"]]
    assumed = efficiency_of(replace(h100, model="B200"))
    families = [table[f] for f in set(GPU_FAMILY.values())]
    assert assumed.prefill_mfu == min(e.prefill_mfu for e in families)
    assert assumed.decode_bandwidth == min(e.decode_bandwidth for e in families)
    assert assumed.step_overhead_s == max(e.step_overhead_s for e in families)
    assert "assumed: nothing measured on the B200 GPU" in assumed.source
    assert "`make bench-compare` on one node of each group" in assumed.source
    # A catalog entry with a GPU no family covers: the engine is built on the assumed figures.
    monkeypatch.setitem(catalog.GPUS, "B200", replace(h100, model="B200"))
    device = Device.of(replace(INSTANCES["p5.48xlarge"], gpu="B200"), 1)
    assert device.efficiency == assumed
    assert single_request_ttft(StepCost.of(QWEN, device), 4096, 2048, "colocated", None) > 0


# The simulation ------------------------------------------------------------------------------------


def test_one_request_alone_takes_what_the_step_model_says():
    cost = l4_cost()
    workload = Workload(3000, 4, concurrency=1, requests=1)
    slo = Slo(10_000, 1_000)
    colocated = simulate(workload, slo, colocated=(engine(cost), 1))
    pd = simulate(workload, slo, prefill=(engine(cost), 1), decode=(engine(cost), 1), link=g6_link())
    assert colocated.ttft_ms[50] == pytest.approx(single_request_ttft(cost, 3000, 2048, "colocated", None) * 1e3)
    assert pd.ttft_ms[50] == pytest.approx(single_request_ttft(cost, 3000, 2048, "disaggregated", g6_link()) * 1e3)
    # Three output tokens after the first, each one decode step at its context (3,001 to 3,003).
    assert colocated.itl_ms[50] == pytest.approx(cost.seconds([3002], []) * 1e3)


def test_prefill_in_decodes_batch_is_what_p_d_removes_from_the_inter_token_latency():
    workload = Workload(4096, 256, 0.25, concurrency=8, requests=120)
    slo = Slo(5000, 100)
    colocated = simulate(workload, slo, colocated=(engine(), 2))
    pd = simulate(workload, slo, prefill=(engine(), 1), decode=(engine(), 1), link=g6_link())
    chunk_step_ms = l4_cost().seconds([4096] * 4, [(0, 2044)]) * 1e3
    # A colocated stream waits for its neighbours' prompt chunks; a P/D stream never does.
    assert colocated.itl_ms[99] >= chunk_step_ms * 0.9
    assert pd.itl_ms[99] < l4_cost().seconds([5000] * 8, []) * 1e3 * 1.1
    # P/D's first token waits for the transfer; on equal GPUs the throughput is close.
    assert pd.ttft_ms[50] > colocated.ttft_ms[50] * 0.5
    assert pd.output_tokens_per_s == pytest.approx(colocated.output_tokens_per_s, rel=0.25)


def test_an_engine_that_does_not_mix_runs_a_waiting_prompt_alone_while_the_streams_wait():
    cost = l4_cost()

    def first_step(mixed: bool) -> tuple[float | None, Request, Request, Engine]:
        replica = Engine(replace(engine(cost), mixed_batches=mixed), "colocated")
        streaming = Request(0, 1000, 64, 0.0, prefilled=1000, generated=1)
        arriving = Request(1, 2000, 64, 0.0)
        replica.running.append(streaming)
        replica.kv_used = 1064
        replica.waiting.append(arriving)
        return replica.start_step(), streaming, arriving, replica

    # vLLM V1: the stream's next token and the whole prompt in one step.
    seconds, streaming, arriving, replica = first_step(mixed=True)
    assert replica.batch == ([streaming], [(arriving, 2000)])
    assert seconds == pytest.approx(cost.seconds([1001], [(0, 2000)]))
    # SGLang's default and vLLM 0.3: the prompt alone; the stream gets its token a step later.
    seconds, streaming, arriving, replica = first_step(mixed=False)
    assert replica.batch == ([], [(arriving, 2000)])
    assert seconds == pytest.approx(cost.seconds([], [(0, 2000)]))
    replica.finish_step(seconds)
    assert streaming.generated == 1 and arriving.generated == 1
    assert replica.start_step() == pytest.approx(cost.seconds([1001, 2001], []))


@pytest.mark.parametrize("wire_share_of_a_chunk", [0.5, 2.0])
def test_a_link_that_sends_each_chunk_as_it_is_computed_overlaps_the_transfer_with_the_next_chunk(
    wire_share_of_a_chunk,
):
    cost = l4_cost()
    chunk = cost.seconds([], [(2048, 2048)])  # the second chunk, whose compute the first one's sending overlaps
    wire = chunk * wire_share_of_a_chunk  # one chunk's KV on the wire
    bandwidth = 2048 * cost.kv_bytes_per_token / wire
    workload = Workload(4096, 2, concurrency=1, requests=1)
    slo = Slo(10_000, 1_000)

    def ttft_ms(per_chunk: bool) -> float:
        link = Link(bandwidth, None, 0.004, per_chunk=per_chunk)
        return simulate(workload, slo, prefill=(engine(cost), 1), decode=(engine(cost), 1), link=link).ttft_ms[50]

    # Whole: both chunks' KV after the prefill. Per chunk: the first chunk's KV goes while the second
    # is computed, so what is left after the prefill is the last chunk's, or, on a link slower than
    # a chunk, the first chunk's tail as well (the second waits for it in the engine's queue).
    saved = wire if wire <= chunk else chunk
    assert ttft_ms(per_chunk=False) - ttft_ms(per_chunk=True) == pytest.approx(saved * 1e3)


def test_selective_pd_decides_on_the_uncached_remainder_as_serve_app_does():
    """A 1,000-token conversation turn whose first 960 tokens both phases hold: its 40-token remainder is
    below a 128-token threshold, so decode prefills it (no KV crosses), as serve_app/selective.py does;
    the whole prompt is far above the threshold."""
    workload = Workload(1000, 16, concurrency=1, requests=20, prefix_hit_share=0.96)
    slo = Slo(10_000, 1_000)
    fleet = dict(prefill=(engine(), 1), decode=(engine(), 1), link=g6_link())
    selective = simulate(workload, slo, **fleet, min_prompt_tokens=128)
    assert selective.kv_bytes_moved == 0
    assert simulate(workload, slo, **fleet).kv_bytes_moved > 0


def test_selective_pd_never_prefills_more_than_the_cap_on_decode():
    workload = Workload(600, 16, concurrency=1, requests=20)
    slo = Slo(10_000, 1_000)
    fleet = dict(prefill=(engine(), 1), decode=(engine(), 1), link=g6_link())
    assert simulate(workload, slo, **fleet, min_prompt_tokens=1024).kv_bytes_moved == 0
    capped = simulate(workload, slo, **fleet, min_prompt_tokens=1024, local_prefill_cap=512)
    assert capped.kv_bytes_moved == pytest.approx(600 * l4_cost().kv_bytes_per_token)


def test_the_advisor_takes_the_configs_cap():
    from planner.from_config import advisor_inputs, plan_config
    from tests.config.helpers import dev_config

    config = dev_config()
    assert advisor_inputs(config, plan_config(config)).local_prefill_cap == config.serving.pd_max_local_prefill_tokens


def test_selective_pd_below_the_threshold_costs_what_colocated_does():
    workload = Workload(100, 16, concurrency=1, requests=20)
    slo = Slo(10_000, 1_000)
    colocated = simulate(workload, slo, colocated=(engine(), 1))
    pd = simulate(workload, slo, prefill=(engine(), 1), decode=(engine(), 1), link=g6_link())
    selective = simulate(
        workload, slo, prefill=(engine(), 1), decode=(engine(), 1), link=g6_link(), min_prompt_tokens=128
    )
    assert selective.ttft_ms[50] == pytest.approx(colocated.ttft_ms[50])
    assert pd.ttft_ms[50] - colocated.ttft_ms[50] == pytest.approx(
        (g6_link().seconds(100 * 57_344) + l4_cost().seconds([100], [])) * 1e3, rel=0.01
    )


def test_a_small_kv_cache_queues_requests_and_the_queue_shows_in_ttft():
    workload = Workload(2000, 64, concurrency=16, requests=160)
    slo = Slo(10_000, 1_000)
    roomy = simulate(workload, slo, colocated=(engine(kv_tokens=200_000), 1))
    cramped = simulate(workload, slo, colocated=(engine(kv_tokens=4_200), 1))  # two requests at a time
    assert cramped.mean_decode_batch <= 2.0 < roomy.mean_decode_batch
    assert cramped.ttft_ms[50] > roomy.ttft_ms[50]


def test_a_rate_beyond_what_the_replicas_serve_misses_the_slo():
    slo = Slo(3000, 100)
    light = simulate(Workload(4096, 128, rate=0.2, requests=80), slo, colocated=(engine(), 1))
    heavy = simulate(Workload(4096, 128, rate=5.0, requests=80), slo, colocated=(engine(), 1))
    assert light.meets_slo and not heavy.meets_slo
    assert heavy.ttft_ms[90] > 10 * light.ttft_ms[90]
    # Goodput counts the requests within both targets, never more than were served.
    assert heavy.goodput_rps < heavy.requests_per_s


def test_a_workload_has_a_concurrency_or_a_rate():
    with pytest.raises(ValueError, match="a concurrency or a rate, not both"):
        Workload(100, 10, concurrency=2, rate=1.0)


# The recommendation --------------------------------------------------------------------------------


def inputs(**changes) -> AdvisorInputs:
    base = AdvisorInputs(
        model=QWEN,
        prefill_instance="g6.8xlarge",
        decode_instance="g6.8xlarge",
        prefill_tp=1,
        decode_tp=1,
        prefill_max_nodes=2,
        decode_max_nodes=2,
        prefill_kv_tokens=KV_TOKENS,
        decode_kv_tokens=KV_TOKENS,
        max_model_len=8192,
    )
    return replace(base, **changes)


def test_the_threshold_is_the_longest_prompt_decode_prefills_within_the_itl_target():
    decode, slo = engine(), Slo(3000, 100)
    threshold = recommended_threshold(decode, 4, slo, 8192)
    step = decode.cost.step_seconds
    context = 4 * 8192 // 4
    assert threshold % 16 == 0 and threshold > 0
    assert step(4, context, threshold, threshold**2 / 2, 0, 1) <= 0.1
    assert step(4, context, threshold + 16, (threshold + 16) ** 2 / 2, 0, 1) > 0.1
    # A target below one bare decode step leaves nothing to prefill on decode.
    assert recommended_threshold(decode, 4, Slo(3000, 60), 8192) == 0


# Figures every mode of an advice reports, under `vllm bench serve`'s names where it has them.
ADVICE_FIGURES = ("mean_ttft_ms", "median_ttft_ms", "p99_itl_ms", "mean_tpot_ms", "output_tokens_per_s", "goodput_rps")


def test_advice_compares_the_best_split_with_colocated_on_as_many_gpus():
    advice = advise(inputs(), Workload(4096, 256, 0.25, concurrency=8, requests=100), Slo(3000, 100))
    data = json.loads(json.dumps(advice.as_dict()))
    for mode in ("colocated", "disaggregated"):
        for key in ADVICE_FIGURES:
            assert data["modes"][mode][key] > 0, (mode, key)
    assert data["modes"]["colocated"]["gpus"] == data["modes"]["disaggregated"]["gpus"]
    splits = {c["split"] for c in data["candidates"]}
    assert {"1P1D", "1P2D", "2P1D", "2P2D"} <= splits
    assert {f"{n}× colocated" for n in range(1, 5)} <= splits
    assert data["recommendation"]["mode"] in ("colocated", "disaggregated")
    assert data["recommendation"]["reason"]


def test_an_instance_the_catalog_lacks_is_refused_by_name():
    with pytest.raises(
        PlanningError, match=r"cluster.gpu_node_groups.decode.instance_type='g9.huge' is not a GPU instance type"
    ):
        advise(inputs(decode_instance="g9.huge"), Workload(100, 10, concurrency=1, requests=5), Slo(1000, 100))


# Calibration ---------------------------------------------------------------------------------------


def test_calibration_recovers_the_costs_that_made_the_measurements():
    truth = StepCost.of(
        QWEN,
        Device.of(
            G6,
            1,
            replace(family_efficiencies()["Ada"], prefill_mfu=0.31, request_overhead_s=0.021, step_overhead_s=0.006),
        ),
    )
    true_link = Link(1.3e9, None, 0.009)
    sizes = (20, 500, 1500)
    probe = {
        mode: {str(t): single_request_ttft(truth, t, 2048, mode, true_link) * 1e3 for t in sizes}
        for mode in ("colocated", "disaggregated")
    }
    itl = truth.seconds([512 + 8], []) * 1e3
    data = {
        "ttft_probe": probe,
        "workload": {"input_len": 512, "output_len": 16},
        "rows": [{"mode": "colocated", "concurrency": 1, "median_itl_ms": itl}],
    }
    result = fit(data, l4_cost(), 2048, g6_link(), fit_on=(20, 1500))
    assert result.efficiency.prefill_mfu == pytest.approx(0.31, rel=1e-3)
    assert result.efficiency.step_overhead_s == pytest.approx(0.006, rel=1e-3)
    assert result.efficiency.request_overhead_s == pytest.approx(0.021, rel=1e-3)
    assert result.link.network_bytes_per_s == pytest.approx(1.3e9, rel=1e-3)
    assert result.link.fixed_s == pytest.approx(0.009, rel=1e-3)
    held_out = result.errors()["after"][500]
    assert abs(held_out["colocated_ttft_error"]) < 1e-3 and abs(held_out["gap_error_ms"]) < 0.01
    # The uncalibrated model was off, and the report says by how much.
    assert abs(result.errors()["before"][500]["colocated_ttft_error"]) > 0.05
    assert "held out 500 tokens" in result.render()


def test_calibration_without_both_modes_says_what_to_run():
    with pytest.raises(PlanningError, match="TTFT probe of both modes and has colocated, not disaggregated: run"):
        fit({"ttft_probe": {"colocated": {"20": 30.0}}}, l4_cost(), 2048, g6_link())


def test_the_reason_says_only_when_no_candidate_of_the_other_mode_meets_the_targets():
    workload, slo = Workload(4096, 256, 0.25, concurrency=8, requests=100), Slo(3000, 100, 99)
    advice = advise(inputs(), workload, slo)
    meeting = [c for c in advice.candidates if c.mode == "colocated" and c.outcome.meets_slo]
    assert advice.recommended.mode == "disaggregated" and not advice.colocated.outcome.meets_slo
    # Colocated on as many GPUs misses the p99 ITL; more replicas meet it, at a higher cost per request.
    smallest = min(meeting, key=lambda c: c.gpus)
    assert smallest.goodput_per_gpu < advice.recommended.goodput_per_gpu
    assert "only" not in advice.reason
    assert f"the smallest colocated candidate that does, {smallest.split} on {smallest.gpus} GPU(s)" in advice.reason
    # One node per group: two colocated replicas at most, and neither meets it.
    alone = advise(inputs(prefill_max_nodes=1, decode_max_nodes=1), workload, slo)
    assert not any(c.outcome.meets_slo for c in alone.candidates if c.mode == "colocated")
    assert (
        "only disaggregated meets TTFT p99 ≤ 3000 ms and ITL p99 ≤ 100 ms: no colocated candidate does" in alone.reason
    )


# The statistics a benchmark reports -----------------------------------------------------------------


@pytest.mark.serving  # numpy, the serving stack's, computes the reference statistics
@pytest.mark.parametrize("slo_percentile", [90, 97])
def test_each_latency_has_vllm_bench_serves_statistics_under_its_names_computed_as_numpy_does(slo_percentile):
    import random

    import numpy as np

    from planner.simulate import latency_statistics

    rng = random.Random(slo_percentile)
    values = [rng.lognormvariate(4, 1) for _ in range(37)]
    stats = latency_statistics("itl", values, also=slo_percentile)
    percentiles = sorted({90, 95, 99, slo_percentile})
    assert list(stats) == ["mean_itl_ms", "median_itl_ms", *(f"p{p}_itl_ms" for p in percentiles)]
    assert stats["mean_itl_ms"] == pytest.approx(np.mean(values))
    assert stats["median_itl_ms"] == pytest.approx(np.median(values))
    for p in percentiles:
        assert stats[f"p{p}_itl_ms"] == pytest.approx(np.percentile(values, p))


def test_a_simulated_run_reports_ttft_tpot_and_itl_as_a_benchmark_of_it_would():
    workload, slo = Workload(1500, 32, 0.25, concurrency=4, requests=40), Slo(10_000, 1_000)
    outcome = simulate(workload, slo, colocated=(engine(), 1))
    stats = outcome.latency_ms
    for metric in ("ttft", "tpot", "itl"):
        mean_, median, p90, p95, p99 = (stats[f"{s}_{metric}_ms"] for s in ("mean", "median", "p90", "p95", "p99"))
        assert 0 < median <= p90 <= p95 <= p99, metric
    assert stats["mean_ttft_ms"] == pytest.approx(outcome.ttft_mean_ms)
    assert stats["p99_ttft_ms"] == pytest.approx(outcome.ttft_ms[99])
    # TPOT averages each request's gaps; the ITL pools every gap: their means differ only in weighting.
    assert stats["mean_tpot_ms"] == pytest.approx(stats["mean_itl_ms"], rel=0.2)


# How sure a recommendation is -----------------------------------------------------------------------


def test_the_band_ends_where_the_advisor_itself_changes_its_verdict():
    from planner.band import verdict_band

    one_node_each = inputs(prefill_max_nodes=1, decode_max_nodes=1)
    workload, slo = Workload(4096, 256, 0.25, concurrency=8, requests=80), Slo(3000, 100, 99)
    advice = advise(one_node_each, workload, slo)
    band = verdict_band(one_node_each, advice)
    assert band.mode == advice.recommended.mode == "disaggregated"
    assert band.low <= band.assumed_mfu <= band.high
    # A slower prefill makes P/D's prefill node the bottleneck: the band is bounded below, and the
    # whole advisor, run afresh at the MFU just under the band, recommends colocated there.
    assert band.bounded_below
    below = max(m for m, _ in band.tried if m < band.low)
    assumed = family_efficiencies()["Ada"]

    def recommended_at(mfu: float) -> str:
        at = replace(one_node_each, efficiency=replace(assumed, prefill_mfu=mfu))
        return advise(at, workload, slo).recommended.mode

    assert recommended_at(band.low) == "disaggregated"
    assert recommended_at(below) == "colocated"
    assert f"P/D wins while prefill runs at {band.low:.0%} to {band.high:.0%} of peak" in band.sentence()
    assert f"colocated wins at {below:.0%} or below" in band.sentence()
