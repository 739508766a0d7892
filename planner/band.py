"""How sure a recommendation is: the range of prefill MFU over which its verdict holds.

The advisor's verdict rests on a prefill MFU per GPU family that no published measurement fixes
(planner/measurements.py: it stays assumed) until `make bench` measures it. Here the two candidates the advice puts side by
side (the best P/D split and colocated replicas on as many GPUs) are simulated again with the
prefill MFU scaled over ``MFU_FACTORS`` of the assumed figure, and the verdict is judged as the
advisor judges it (planner/advisor.py ``_best``). The band is the run of scaled figures, around the
assumed one, at which the recommended mode still wins; where it ends, the other mode does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.advisor import Advice, AdvisorInputs, Candidate, _best, _fleet
from planner.simulate import simulate

# From a third to twice the assumed figure: wide enough to hold what an assumed family figure may be
# off by before `make bench` measures it.
MFU_FACTORS = (0.33, 0.5, 0.7, 0.85, 1.0, 1.2, 1.5, 2.0)
# A prefill cannot beat the datasheet.
MAX_MFU = 1.0


@dataclass(frozen=True)
class Band:
    assumed_mfu: float
    tried: tuple[tuple[float, str], ...]  # (prefill MFU, the mode that wins there), lowest first
    low: float  # the lowest MFU tried at which the recommended mode wins
    high: float  # the highest
    mode: str  # the recommended mode, which wins at the assumed figure

    @property
    def bounded_below(self) -> bool:
        return self.low > self.tried[0][0]

    @property
    def bounded_above(self) -> bool:
        return self.high < self.tried[-1][0]

    def sentence(self) -> str:
        mode = "P/D" if self.mode == "disaggregated" else "colocated"
        other = "colocated" if mode == "P/D" else "P/D"
        if not self.bounded_below and not self.bounded_above:
            where = (
                f"{mode} wins over the whole range tried, prefill at {self.low:.0%} to {self.high:.0%} of peak "
                f"(assumed {self.assumed_mfu:.0%})"
            )
        else:
            where = f"{mode} wins while prefill runs at {self.low:.0%} to {self.high:.0%} of peak (assumed {self.assumed_mfu:.0%})"
            ends = []
            if self.bounded_below:
                below = max(m for m, _ in self.tried if m < self.low)
                ends.append(f"at {below:.0%} or below")
            if self.bounded_above:
                above = min(m for m, _ in self.tried if m > self.high)
                ends.append(f"at {above:.0%} or above")
            where += f"; {other} wins {' and '.join(ends)}"
        return (
            f"{where}. What would settle it: `make bench-compare` on one node of each group, whose TTFT probe "
            "`make plan CALIBRATION=…` fits the prefill MFU to (and the KV link, from P/D's TTFT over colocated's); "
            "`make verify` confirms the KV crosses by NIXL."
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "assumed_prefill_mfu": round(self.assumed_mfu, 4),
            "verdict_holds_for_prefill_mfu": [round(self.low, 4), round(self.high, 4)],
            "tried": [{"prefill_mfu": round(m, 4), "winner": mode} for m, mode in self.tried],
            "summary": self.sentence(),
        }


def _rerun(candidate: Candidate, inputs: AdvisorInputs, advice: Advice) -> Candidate:
    prefill, decode, link = _fleet(inputs)
    if candidate.mode == "colocated":
        outcome = simulate(advice.workload, advice.slo, colocated=(decode, candidate.decode_replicas))
    else:
        outcome = simulate(
            advice.workload,
            advice.slo,
            prefill=(prefill, candidate.prefill_replicas),
            decode=(decode, candidate.decode_replicas),
            link=link,
            min_prompt_tokens=candidate.min_prompt_tokens,
            local_prefill_cap=inputs.local_prefill_cap,
        )
    return replace(candidate, outcome=outcome)


def winner_at(mfu: float, inputs: AdvisorInputs, advice: Advice) -> str:
    """The mode the advisor would pick at ``mfu`` among the recommendation and the two candidates the
    advice puts side by side (at the assumed figure: the recommendation's own mode)."""
    efficiency = _fleet(inputs)[1].cost.device.efficiency
    scaled = replace(inputs, efficiency=replace(efficiency, prefill_mfu=mfu))
    shown = {c.split: c for c in (advice.recommended, advice.colocated, advice.disaggregated)}
    return _best([_rerun(c, scaled, advice) for c in shown.values()]).mode


def verdict_band(inputs: AdvisorInputs, advice: Advice, factors: tuple[float, ...] = MFU_FACTORS) -> Band:
    assumed = _fleet(inputs)[1].cost.device.efficiency.prefill_mfu
    mfus = sorted({min(assumed * f, MAX_MFU) for f in factors} | {assumed})
    tried = tuple((m, winner_at(m, inputs, advice)) for m in mfus)
    at = mfus.index(assumed)
    mode = tried[at][1]
    low = high = at
    while low > 0 and tried[low - 1][1] == mode:
        low -= 1
    while high < len(tried) - 1 and tried[high + 1][1] == mode:
        high += 1
    return Band(assumed, tried, mfus[low], mfus[high], mode)
