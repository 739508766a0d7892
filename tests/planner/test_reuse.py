"""Prefix hits in the advisor: what a hit leaves to compute and to move (planner/simulate.py), and
the share at which the verdict between colocated and P/D flips (planner/reuse.py, `make plan`)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

from planner.advisor import advise
from planner.calibration import single_request_ttft
from planner.core import KV_BLOCK_TOKENS
from planner.simulate import Slo, Workload, simulate
from tests.conftest import CONFIG_DIR
from tests.planner.test_advisor import engine, g6_link, inputs, l4_cost

# vLLM's prefill of a P/D split: its prefix cache serves whole blocks.
PROMPTS = (1, 15, 16, 17, 100, 1500, 1581, 4096)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_hit_is_the_most_whole_blocks_the_share_covers_short_of_the_last_token(prompt):
    from planner.reuse import SHARES
    from planner.simulate import cached_prefix_tokens

    for share in (*SHARES, 1.0):
        cached = cached_prefix_tokens(prompt, share)
        assert cached % KV_BLOCK_TOKENS == 0
        assert cached <= prompt * share and cached <= prompt - 1
        # One more block would pass the share or the last token.
        assert cached + KV_BLOCK_TOKENS > min(prompt * share, prompt - 1)


@pytest.mark.parametrize("share", [0.0, 0.5, 0.9])
def test_one_request_alone_computes_and_moves_only_what_the_cache_lacks(share):
    from planner.simulate import cached_prefix_tokens

    cost = l4_cost()
    workload = Workload(3000, 4, concurrency=1, requests=1, prefix_hit_share=share)
    slo = Slo(10_000, 1_000)
    cached = cached_prefix_tokens(3000, share)
    colocated = simulate(workload, slo, colocated=(engine(cost), 1))
    pd = simulate(workload, slo, prefill=(engine(cost), 1), decode=(engine(cost), 1), link=g6_link())
    assert colocated.ttft_ms[50] == pytest.approx(
        single_request_ttft(cost, 3000, 2048, "colocated", None, cached=cached) * 1e3
    )
    assert pd.ttft_ms[50] == pytest.approx(
        single_request_ttft(cost, 3000, 2048, "disaggregated", g6_link(), cached=cached) * 1e3
    )
    assert pd.prompt_tokens_computed == colocated.prompt_tokens_computed == 3000 - cached
    assert pd.kv_bytes_moved == (3000 - cached) * cost.kv_bytes_per_token
    assert colocated.kv_bytes_moved == 0


def test_more_hits_mean_less_prefill_and_fewer_kv_bytes_and_none_is_todays_simulation():
    from planner.reuse import SHARES

    cost, slo = l4_cost(), Slo(3000, 100)
    cold = Workload(4096, 256, 0.25, concurrency=4, requests=60)
    fleet = {"prefill": (engine(cost), 1), "decode": (engine(cost), 1), "link": g6_link()}
    outcomes = [simulate(replace(cold, prefix_hit_share=s), slo, **fleet) for s in SHARES]
    # A share of 0 is the workload as it was before there were shares: every prompt whole, moved whole.
    assert outcomes[0] == simulate(cold, slo, **fleet)
    prompts = [p for p, _ in cold.lengths()]
    assert outcomes[0].kv_bytes_moved == pytest.approx(sum(prompts) / len(prompts) * cost.kv_bytes_per_token)
    for fewer, more in itertools.pairwise(outcomes):
        assert more.prompt_tokens_computed < fewer.prompt_tokens_computed
        assert more.prefill_seconds < fewer.prefill_seconds
        assert more.kv_bytes_moved < fewer.kv_bytes_moved


def test_the_verdict_flips_where_the_whole_advisor_run_afresh_changes_its_mind():
    from planner.reuse import reuse_verdicts

    one_node_each = inputs(prefill_max_nodes=1, decode_max_nodes=1)
    workload, slo = Workload(4096, 256, 0.25, concurrency=8, requests=80), Slo(3000, 100, 99)
    advice = advise(one_node_each, workload, slo)
    reuse = reuse_verdicts(one_node_each, advice)
    assert reuse.winner_at(0.0) == advice.recommended.mode
    # Long prompts and a tight p99 ITL: P/D wins cold, and a cache serving most of each prompt leaves
    # little prefill to keep out of decode's batches, so the verdict turns somewhere on the way.
    assert reuse.flips
    for before, after, mode in reuse.flips:
        assert advise(one_node_each, replace(workload, prefix_hit_share=after), slo).recommended.mode == mode
        assert advise(one_node_each, replace(workload, prefix_hit_share=before), slo).recommended.mode != mode
        assert f"between {before:g} and {after:g}" in reuse.verdict_sentence()


def _plan(capsys, *flags: str) -> tuple[int, str, str]:
    from cli.plan import main

    args = [
        "--prompt-tokens",
        "4096",
        "--output-tokens",
        "256",
        "--concurrency",
        "8",
        "--slo-percentile",
        "99",
        "--requests",
        "40",
    ]
    code = main([str(CONFIG_DIR / "dev.yaml"), *args, *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_make_plan_says_where_the_verdict_flips_and_json_carries_it(capsys):
    _, cold, _ = _plan(capsys, "--json")
    _, zero, _ = _plan(capsys, "--json", "--prefix-hit-share", "0")
    _, warm, _ = _plan(capsys, "--json", "--prefix-hit-share", "0.5")
    cold, zero, warm = json.loads(cold), json.loads(zero), json.loads(warm)
    assert zero == cold
    assert warm["workload"]["prefix_hit_share"] == 0.5
    hits = warm["prefix_hits"]
    assert hits["disaggregated_at_share"]["kv_bytes_moved"] < hits["disaggregated_at_0"]["kv_bytes_moved"]
    assert hits["disaggregated_at_0"]["kv_bytes_moved"] == cold["modes"]["disaggregated"]["kv_bytes_moved"]
    # The flips are the shares tried where the winner changes, and the text names each of them.
    tried = [(t["prefix_hit_share"], t["winner"]) for t in hits["tried"]]
    changes = [(a, b, new) for (a, old), (b, new) in itertools.pairwise(tried) if new != old]
    assert [(f["from"], f["to"], f["winner"]) for f in hits["flips"]] == changes
    code, text, _ = _plan(capsys, "--prefix-hit-share", "0.5")
    assert code == 0
    assert hits["summary"] in text
    for before, after, _ in changes:
        assert f"between {before:g} and {after:g}" in text
    assert "At a prefix-hit share of 0.5, " in text


@pytest.mark.parametrize("value", ["1.5", "-0.1", "half", "nan"])
def test_a_share_outside_0_to_1_is_refused_in_one_line_naming_the_flag(capsys, value):
    from cli.plan import main

    with pytest.raises(SystemExit) as exit_:
        main([str(CONFIG_DIR / "dev.yaml"), "--prefix-hit-share", value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1
    assert "--prefix-hit-share" in err and f"{value} is not a share from 0 to 1" in err and "e.g. 0.8" in err
