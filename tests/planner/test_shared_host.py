"""The advisor's model of a host whose few cores the engines and the serving front end share
(planner/simulate.py, ``SharedHost``): the local servers, where vLLM's engine loops, Ray Serve's
processes and the benchmark's client are processes of one 2-core machine."""

from __future__ import annotations

import pytest

from planner.simulate import SharedHost, Slo, Workload, _ProcessorSharing, simulate
from tests.planner.test_advisor import engine, g6_link

NO_SLO = Slo(1e9, 1e9)


def finish_times(cores: float, works: list[float]) -> list[float]:
    """When each of ``works`` (one process each, all submitted at 0) ends on ``cores``."""
    events: list[tuple[float, int]] = []
    sharing = _ProcessorSharing(cores, lambda at, version: events.append((at, version)))
    for index, work in enumerate(works):
        sharing.submit(0.0, f"process {index}", work, ("job", index))
    ended = [0.0] * len(works)
    while events:
        events.sort()
        at, version = events.pop(0)
        for job in sharing.finished(at, version):
            ended[job[1]] = at
    return ended


def test_processes_with_work_share_the_cores_equally_and_none_runs_faster_than_one_core():
    assert finish_times(2, [1.0, 1.0]) == pytest.approx([1.0, 1.0])
    assert finish_times(1, [1.0, 1.0]) == pytest.approx([2.0, 2.0])
    # Three on two cores run at two thirds each until the short ones end; the long one then has a core.
    assert finish_times(2, [1.0, 1.0, 2.0]) == pytest.approx([1.5, 1.5, 2.5])


def test_a_process_runs_its_own_work_in_order():
    events: list[tuple[float, int]] = []
    sharing = _ProcessorSharing(4, lambda at, version: events.append((at, version)))
    sharing.submit(0.0, "one process", 1.0, ("first",))
    sharing.submit(0.0, "one process", 1.0, ("second",))
    ended = {}
    while events:
        events.sort()
        at, version = events.pop(0)
        ended.update({job[0]: at for job in sharing.finished(at, version)})
    assert ended == pytest.approx({"first": 1.0, "second": 2.0})


def test_a_front_end_stage_caps_the_stream_at_one_token_per_its_cost():
    workload = Workload(256, 64, concurrency=32, requests=200, warmup_share=0.0)
    unbounded = simulate(workload, NO_SLO, colocated=(engine(), 1))
    assert unbounded.output_tokens_per_s > 200
    # A stage of 10 ms per token with a core of its own passes at most 100 tokens a second.
    capped = simulate(workload, NO_SLO, colocated=(engine(), 1), host=SharedHost(64, (0.001, 0.010)))
    assert 90 < capped.output_tokens_per_s <= 100
    # Each stream's next token waits for one of every other stream's at that stage: 32 × 10 ms apart.
    assert capped.itl_mean_ms == pytest.approx(32 * 10, rel=0.1)
    assert capped.ttft_mean_ms > unbounded.ttft_mean_ms


def test_a_second_engine_on_the_same_core_slows_the_first():
    workload = Workload(2048, 64, concurrency=4, requests=60, warmup_share=0.0)
    stage = (1e-6,)
    pair = dict(prefill=(engine(), 1), decode=(engine(), 1), link=g6_link())
    apart = simulate(workload, NO_SLO, **pair, host=SharedHost(8, stage))
    together = simulate(workload, NO_SLO, **pair, host=SharedHost(1, stage))
    # With a core each the engines' steps take what the step model says; on one, a decode step that
    # runs beside a prefill step runs at half speed, and prefill (the bottleneck here) too.
    assert apart.itl_mean_ms == pytest.approx(engine().cost.seconds([2048 + 32] * 4, []) * 1e3, rel=0.1)
    assert together.itl_mean_ms > 1.1 * apart.itl_mean_ms
    assert together.output_tokens_per_s < 0.8 * apart.output_tokens_per_s


def test_without_a_shared_host_a_request_s_fixed_cost_is_a_delay_and_with_one_it_is_front_end_work():
    workload = Workload(256, 16, concurrency=1, requests=20, warmup_share=0.0)
    delay = simulate(workload, NO_SLO, colocated=(engine(), 1), request_overhead_s=0.050)
    work = simulate(workload, NO_SLO, colocated=(engine(), 1), request_overhead_s=0.050, host=SharedHost(8, (0.0, 0.0)))
    # Alone, the two are the same first token: the cost is spent before it either way.
    assert work.ttft_mean_ms == pytest.approx(delay.ttft_mean_ms, rel=0.01)


def test_a_host_with_no_cores_or_no_stage_is_refused():
    with pytest.raises(ValueError, match="no cores"):
        SharedHost(0, (0.001,))
    with pytest.raises(ValueError, match="no front-end stage"):
        SharedHost(2, ())


def test_on_a_gpu_node_each_decode_replica_s_server_paces_its_own_streams():
    from dataclasses import replace

    cost = engine().cost
    paced = engine(cost.with_efficiency(replace(cost.device.efficiency, token_overhead_s=0.010)))
    workload = Workload(256, 64, concurrency=32, requests=200, warmup_share=0.0)
    one = simulate(workload, NO_SLO, colocated=(paced, 1))
    two = simulate(workload, NO_SLO, colocated=(paced, 2))
    # A replica's server passes at most 100 tokens a second; a second replica brings its own.
    assert 90 < one.output_tokens_per_s <= 100
    assert 180 < two.output_tokens_per_s <= 200
