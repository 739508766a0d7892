"""Colocated or P/D, which split, and which selective threshold, for one workload and its SLOs.

Every candidate is simulated (planner/simulate.py) on the configured instances: colocated with 1 to
as many replicas as both GPU groups hold at their max sizes, and every xPyD with x up to the prefill
group's max size and y up to decode's, each with and without the selective threshold. The
recommendation is the candidate that meets the SLOs with the most goodput per GPU (all of them
missing the SLOs: the most goodput per GPU); within 2%, colocated, then fewer GPUs, wins, as the
simpler deployment. ``modes`` puts the best split beside colocated replicas on as many GPUs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

from config.catalog import INSTANCES, InstanceFacts
from planner.errors import PlanningError, field_name
from planner.models import ModelArchitecture
from planner.performance import Device, Efficiency, Link, StepCost
from planner.simulate import EngineSpec, Outcome, Slo, Workload, simulate

# Goodput per GPU within this share of the best counts as a tie (simulated noise is larger).
TIE_SHARE = 0.02
# Selective thresholds are whole multiples of vLLM's KV block.
THRESHOLD_STEP = 16
# At most this many colocated replicas are simulated (the groups' max sizes may allow more).
MAX_COLOCATED_REPLICAS = 16


@dataclass(frozen=True)
class AdvisorInputs:
    model: ModelArchitecture
    prefill_instance: str
    decode_instance: str
    prefill_tp: int
    decode_tp: int
    prefill_max_nodes: int
    decode_max_nodes: int
    prefill_kv_tokens: int
    decode_kv_tokens: int
    max_model_len: int
    dtype_bytes: int = 2
    network_efficiency: float = 0.7
    max_num_seqs: int = 256
    token_budget: int = 2048
    # serving.pd_max_local_prefill_tokens: selective P/D never prefills more on decode by its choice.
    local_prefill_cap: int | None = None
    # Calibration (planner/calibration.py): every engine's efficiency, and the link's.
    efficiency: Efficiency | None = None
    link: Link | None = None


@dataclass(frozen=True)
class Candidate:
    mode: str  # colocated or disaggregated
    prefill_replicas: int  # 0 when colocated
    decode_replicas: int  # the colocated replicas when colocated
    min_prompt_tokens: int
    gpus: int
    outcome: Outcome

    @property
    def split(self) -> str:
        if self.mode == "colocated":
            return f"{self.decode_replicas}× colocated"
        selective = f", local prefill < {self.min_prompt_tokens}" if self.min_prompt_tokens else ""
        return f"{self.prefill_replicas}P{self.decode_replicas}D{selective}"

    @property
    def goodput_per_gpu(self) -> float:
        return self.outcome.goodput_rps / self.gpus

    def as_dict(self) -> dict[str, Any]:
        o = self.outcome
        return {
            "mode": self.mode,
            "split": self.split,
            "prefill_replicas": self.prefill_replicas,
            "decode_replicas": self.decode_replicas,
            "pd_min_prompt_tokens": self.min_prompt_tokens,
            "gpus": self.gpus,
            # `vllm bench serve`'s names: mean_ttft_ms, median_ttft_ms, p90_ttft_ms, …, p99_itl_ms.
            **{name: round(value, 2) for name, value in o.latency_ms.items()},
            "output_tokens_per_s": round(o.output_tokens_per_s, 1),
            "goodput_rps": round(o.goodput_rps, 4),
            "goodput_rps_per_gpu": round(self.goodput_per_gpu, 4),
            "meets_slo": o.meets_slo,
            "saturated": o.saturated,
            # Per request: what prefix hits (workload.prefix_hit_share) leave to compute and to move.
            "prompt_tokens_computed": round(o.prompt_tokens_computed, 1),
            "prefill_ms": round(o.prefill_seconds * 1e3, 2),
            "kv_bytes_moved": round(o.kv_bytes_moved),
        }


@dataclass(frozen=True)
class Advice:
    workload: Workload
    slo: Slo
    colocated: Candidate
    disaggregated: Candidate
    recommended: Candidate
    candidates: list[Candidate]
    recommended_min_prompt_tokens: int
    reason: str
    assumptions: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        w = self.workload
        return {
            "workload": {
                "prompt_tokens": w.prompt_tokens,
                "output_tokens": w.output_tokens,
                "range_ratio": w.range_ratio,
                "prefix_hit_share": w.prefix_hit_share,
                **({"concurrency": w.concurrency} if w.concurrency is not None else {"rate": w.rate}),
            },
            "slo": {"ttft_ms": self.slo.ttft_ms, "itl_ms": self.slo.itl_ms, "percentile": self.slo.percentile},
            "modes": {"colocated": self.colocated.as_dict(), "disaggregated": self.disaggregated.as_dict()},
            "recommendation": {
                "mode": self.recommended.mode,
                "split": self.recommended.split,
                "pd_min_prompt_tokens": self.recommended_min_prompt_tokens,
                "reason": self.reason,
            },
            "candidates": [c.as_dict() for c in self.candidates],
            "assumptions": self.assumptions,
        }


def _instance(name: str, what: str) -> InstanceFacts:
    facts = INSTANCES.get(name)
    if facts is None or facts.gpu_facts is None:
        raise PlanningError(f"{what}={name!r} is not a GPU instance type in config/catalog.py")
    return facts


def _engine(inputs: AdvisorInputs, facts: InstanceFacts, tp: int, kv_tokens: int) -> EngineSpec:
    device = Device.of(facts, tp, inputs.efficiency)
    return EngineSpec(
        StepCost.of(inputs.model, device, inputs.dtype_bytes), kv_tokens, inputs.max_num_seqs, inputs.token_budget
    )


def _fleet(inputs: AdvisorInputs) -> tuple[EngineSpec, EngineSpec, Link]:
    """The prefill and decode engine of the configured instances, and the KV link between them."""
    prefill_facts = _instance(inputs.prefill_instance, field_name("instance_type", "prefill"))
    decode_facts = _instance(inputs.decode_instance, field_name("instance_type", "decode"))
    prefill = _engine(inputs, prefill_facts, inputs.prefill_tp, inputs.prefill_kv_tokens)
    decode = _engine(inputs, decode_facts, inputs.decode_tp, inputs.decode_kv_tokens)
    return prefill, decode, inputs.link or Link.between(prefill_facts, decode_facts, inputs.network_efficiency)


def _pd_candidate(
    inputs: AdvisorInputs,
    workload: Workload,
    slo: Slo,
    fleet: tuple[EngineSpec, EngineSpec, Link],
    x: int,
    y: int,
    threshold: int,
) -> Candidate:
    prefill, decode, link = fleet
    outcome = simulate(
        workload,
        slo,
        prefill=(prefill, x),
        decode=(decode, y),
        link=link,
        min_prompt_tokens=threshold,
        local_prefill_cap=inputs.local_prefill_cap,
    )
    return Candidate("disaggregated", x, y, threshold, x * inputs.prefill_tp + y * inputs.decode_tp, outcome)


def recommended_threshold(decode: EngineSpec, decode_batch: float, slo: Slo, max_model_len: int) -> int:
    """The longest prompt decode can prefill in one step beside its usual batch while that step
    stays within the ITL target: below it, remote prefill only adds the transfer to TTFT."""
    cost, batch = decode.cost, max(1, round(decode_batch))
    # The batch's context: each running sequence about halfway through a typical request.
    context = batch * (max_model_len // 4)
    best = 0
    limit = min(decode.token_budget - batch, max_model_len - 1)
    for tokens in range(THRESHOLD_STEP, limit + 1, THRESHOLD_STEP):
        step = cost.step_seconds(batch, context, tokens, tokens * tokens / 2, 0, 1)
        if step * 1e3 > slo.itl_ms:
            break
        best = tokens
    return best


def local_prefill_cap(inputs: AdvisorInputs, slo: Slo, decode_batch: int) -> int:
    """The longest prefill decode's GPU can run beside ``decode_batch`` streams while its step stays
    within the ITL target: what ``serving.pd_max_local_prefill_tokens`` should be for this model and
    GPU (serve_app/selective.py never prefills more on decode by its own choice)."""
    return recommended_threshold(_fleet(inputs)[1], decode_batch, slo, inputs.max_model_len)


def advise(inputs: AdvisorInputs, workload: Workload, slo: Slo) -> Advice:
    for what, nodes in (("prefill", inputs.prefill_max_nodes), ("decode", inputs.decode_max_nodes)):
        if nodes < 1:
            raise PlanningError(f"the {what} GPU group's max_size is {nodes}: the advisor needs at least 1 node")
    prefill, decode, link = _fleet(inputs)

    @functools.cache
    def pd(x: int, y: int, threshold: int) -> Candidate:
        return _pd_candidate(inputs, workload, slo, (prefill, decode, link), x, y, threshold)

    candidates: list[Candidate] = []
    replicas = min(inputs.prefill_max_nodes + inputs.decode_max_nodes, MAX_COLOCATED_REPLICAS)
    for n in range(1, replicas + 1):
        outcome = simulate(workload, slo, colocated=(decode, n))
        candidates.append(Candidate("colocated", 0, n, 0, n * inputs.decode_tp, outcome))
    splits = [(x, y) for x in range(1, inputs.prefill_max_nodes + 1) for y in range(1, inputs.decode_max_nodes + 1)]
    plain = [pd(x, y, 0) for x, y in splits]
    candidates += plain
    best_plain = _best(plain)
    threshold = recommended_threshold(decode, best_plain.outcome.mean_decode_batch, slo, inputs.max_model_len)
    if threshold:
        candidates += [pd(x, y, threshold) for x, y in splits]
    best = _best(candidates)
    disaggregated = _best([c for c in candidates if c.mode == "disaggregated"])
    # Side by side on the same GPUs: colocated replicas on as many GPUs as the best split uses.
    same_gpus = [c for c in candidates if c.mode == "colocated" and c.gpus == disaggregated.gpus]
    colocated = same_gpus[0] if same_gpus else _best([c for c in candidates if c.mode == "colocated"])
    return Advice(
        workload=workload,
        slo=slo,
        colocated=colocated,
        disaggregated=disaggregated,
        recommended=best,
        candidates=candidates,
        recommended_min_prompt_tokens=threshold if best.mode == "disaggregated" else 0,
        reason=_reason(best, colocated, disaggregated, slo, candidates),
        assumptions={
            "efficiency": decode.cost.device.efficiency.__dict__,
            "kv_link_gbit_per_s": round(link.network_bytes_per_s * 8 / 1e9, 2),
            "host_staging": link.staging_bytes_per_s is not None,
            "kv_transfer_fixed_ms": round(link.fixed_s * 1e3, 2),
            "token_budget": inputs.token_budget,
            "max_num_seqs": inputs.max_num_seqs,
            "decode_kv_tokens": inputs.decode_kv_tokens,
        },
    )


def _best(candidates: list[Candidate]) -> Candidate:
    meeting = [c for c in candidates if c.outcome.meets_slo] or candidates
    top = max(c.goodput_per_gpu for c in meeting)
    close = [c for c in meeting if c.goodput_per_gpu >= top * (1 - TIE_SHARE)]
    return min(close, key=lambda c: (c.mode != "colocated", c.gpus, c.min_prompt_tokens != 0, -c.goodput_per_gpu))


def _reason(
    best: Candidate, colocated: Candidate, disaggregated: Candidate, slo: Slo, candidates: list[Candidate]
) -> str:
    other = disaggregated if best.mode == "colocated" else colocated
    if other is best:
        other = colocated if best.mode == "colocated" and colocated is not best else disaggregated
    b, o = best.outcome, other.outcome
    target = f"TTFT p{slo.percentile} ≤ {slo.ttft_ms:g} ms and ITL p{slo.percentile} ≤ {slo.itl_ms:g} ms"
    if b.meets_slo and not o.meets_slo:
        # `other` is the other mode on as many GPUs; more of them may meet the targets at a higher
        # cost per good request, and saying "only" would then be wrong.
        meeting = [c for c in candidates if c.mode == other.mode and c.outcome.meets_slo]
        if meeting:
            cheapest = min(meeting, key=lambda c: (c.gpus, -c.goodput_per_gpu))
            why = (
                f"it meets {target} where {other.split} on {other.gpus} GPU(s) does not; the smallest "
                f"{other.mode} candidate that does, {cheapest.split} on {cheapest.gpus} GPU(s), has "
                f"{cheapest.goodput_per_gpu:.3f} good requests/s per GPU against {best.goodput_per_gpu:.3f}"
            )
        else:
            why = f"only {best.mode} meets {target}: no {other.mode} candidate does"
    elif not b.meets_slo:
        why = f"no candidate meets {target}; it has the most goodput per GPU"
    else:
        why = (
            f"both meet {target}; it has {best.goodput_per_gpu:.3f} good requests/s per GPU against "
            f"{other.goodput_per_gpu:.3f} for {other.split}"
            + (
                " (a tie goes to colocated, the simpler deployment)"
                if best.mode == "colocated" and other.goodput_per_gpu >= best.goodput_per_gpu * (1 - TIE_SHARE)
                else ""
            )
        )
    return (
        f"{best.split} on {best.gpus} GPU(s): {why}. Predicted mean TTFT {b.latency_ms['mean_ttft_ms']:.0f} ms "
        f"(median {b.latency_ms['median_ttft_ms']:.0f}), mean ITL {b.latency_ms['mean_itl_ms']:.1f} ms "
        f"(median {b.latency_ms['median_itl_ms']:.1f}), {b.output_tokens_per_s:.0f} output tokens/s."
    )


def with_calibration(inputs: AdvisorInputs, efficiency: Efficiency | None, link: Link | None) -> AdvisorInputs:
    return replace(inputs, efficiency=efficiency or inputs.efficiency, link=link or inputs.link)


@functools.lru_cache(maxsize=32)
def deployed_against_colocated(
    inputs: AdvisorInputs, workload: Workload, slo: Slo, prefill_replicas: int, decode_replicas: int, threshold: int
) -> tuple[Candidate, Candidate]:
    """(the P/D shape a config deploys, colocated replicas on as many GPUs) for one workload."""
    fleet = _fleet(inputs)
    pd = _pd_candidate(inputs, workload, slo, fleet, prefill_replicas, decode_replicas, threshold)
    replicas = max(pd.gpus // inputs.decode_tp, 1)
    colocated = simulate(workload, slo, colocated=(fleet[1], replicas))
    return pd, Candidate("colocated", 0, replicas, 0, replicas * inputs.decode_tp, colocated)


def colocated_serves_better(pd: Candidate, colocated: Candidate, percentile: int) -> bool:
    """Colocated meets the SLOs where P/D does not; or serves clearly more good requests per GPU; or, as
    many, with a shorter TTFT and an ITL within 5% at the SLOs' percentile (what P/D would add is then
    a second GPU group, a KV link and their failure modes, for nothing the SLOs ask for)."""
    c, p = colocated.outcome, pd.outcome
    if c.meets_slo != p.meets_slo:
        return c.meets_slo
    if colocated.goodput_per_gpu > pd.goodput_per_gpu * (1 + TIE_SHARE):
        return True
    if colocated.goodput_per_gpu < pd.goodput_per_gpu * (1 - TIE_SHARE):
        return False
    return c.ttft_ms[percentile] <= p.ttft_ms[percentile] and c.itl_ms[percentile] <= p.itl_ms[percentile] * 1.05


def resimulate(candidate: Candidate, inputs: AdvisorInputs, workload: Workload, slo: Slo) -> Candidate:
    """The same candidate (mode, split, threshold) simulated again for another workload."""
    prefill, decode, link = _fleet(inputs)
    if candidate.mode == "colocated":
        return replace(candidate, outcome=simulate(workload, slo, colocated=(decode, candidate.decode_replicas)))
    fleet = (prefill, decode, link)
    x, y, threshold = candidate.prefill_replicas, candidate.decode_replicas, candidate.min_prompt_tokens
    return _pd_candidate(inputs, workload, slo, fleet, x, y, threshold)
