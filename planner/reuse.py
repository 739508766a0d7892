"""Where prefix hits change the verdict between colocated and P/D.

A prefix hit takes work off prefill (only the prompt's uncached rest is computed) and off the KV link
(decode holds the same blocks, so only that rest crosses: planner/simulate.py). P/D pays by taking
long prefills out of decode's batches; the more of each prompt the cache serves, the less there is
to take out, while the prefill node's GPUs stay. The candidates the advice weighs (its
recommendation and the two it puts side by side) are simulated again at each share of ``SHARES``
and the workload's own, and judged as the advisor judges them (planner/advisor.py ``_best``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.advisor import Advice, AdvisorInputs, Candidate, _best, resimulate

# From no reuse to a long conversation's late turns (its history nearly the whole prompt).
SHARES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
MODE_NAMES = {"colocated": "colocated", "disaggregated": "P/D"}


@dataclass(frozen=True)
class Reuse:
    share: float  # the workload's
    tried: tuple[tuple[float, str], ...]  # (prefix-hit share, the mode that wins there), lowest first
    cold: Candidate  # the advice's P/D split at share 0
    warm: Candidate  # the same split at the workload's share

    def winner_at(self, share: float) -> str:
        return dict(self.tried)[share]

    @property
    def flips(self) -> list[tuple[float, float, str]]:
        """(the last share tried with the old winner, the first with the new, the new winner)."""
        return [(a, b, mode) for (a, old), (b, mode) in zip(self.tried, self.tried[1:], strict=False) if mode != old]

    def runs(self) -> list[tuple[float, float, str]]:
        """(first share, last share, the mode that wins over them) for each run of one winner."""
        runs: list[tuple[float, float, str]] = []
        for share, mode in self.tried:
            if runs and runs[-1][2] == mode:
                runs[-1] = (runs[-1][0], share, mode)
            else:
                runs.append((share, share, mode))
        return runs

    def verdict_sentence(self) -> str:
        here = f"this workload's {self.share:g}: {MODE_NAMES[self.winner_at(self.share)]}"
        runs = self.runs()
        if len(runs) == 1:
            first, last, mode = runs[0]
            return (
                f"Prefix hits: {MODE_NAMES[mode]} wins at every share of each prompt served from cache tried, "
                f"{first:g} to {last:g} ({here})."
            )
        flips = ", ".join(f"between {before:g} and {after:g}" for before, after, _ in self.flips)
        spans = ", ".join(
            f"{MODE_NAMES[mode]} at {first:g}" + (f" to {last:g}" if last != first else "")
            for first, last, mode in runs
        )
        return f"Prefix hits: the verdict flips {flips} of each prompt served from cache: {spans} ({here})."

    def saving_sentence(self) -> str:
        c, w = self.cold.outcome, self.warm.outcome
        return (
            f"At a prefix-hit share of {self.share:g}, {self.warm.split} computes {w.prompt_tokens_computed:,.0f} "
            f"prompt tokens a request (against {c.prompt_tokens_computed:,.0f} with no hits), "
            f"{w.prefill_seconds * 1e3:,.0f} ms of prefill (against {c.prefill_seconds * 1e3:,.0f}) and moves "
            f"{w.kv_bytes_moved / 1e6:,.1f} MB of KV to decode (against {c.kv_bytes_moved / 1e6:,.1f}); "
            f"mean TTFT {w.latency_ms['mean_ttft_ms']:,.0f} ms (against {c.latency_ms['mean_ttft_ms']:,.0f})."
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "prefix_hit_share": self.share,
            "tried": [{"prefix_hit_share": s, "winner": mode} for s, mode in self.tried],
            "flips": [{"from": before, "to": after, "winner": mode} for before, after, mode in self.flips],
            "disaggregated_at_0": self.cold.as_dict(),
            "disaggregated_at_share": self.warm.as_dict(),
            "summary": self.verdict_sentence(),
        }


def reuse_verdicts(inputs: AdvisorInputs, advice: Advice, shares: tuple[float, ...] = SHARES) -> Reuse:
    shown = {c.split: c for c in (advice.recommended, advice.colocated, advice.disaggregated)}
    tried = []
    runs: dict[float, dict[str, Candidate]] = {}
    for share in sorted({*shares, advice.workload.prefix_hit_share}):
        workload = replace(advice.workload, prefix_hit_share=share)
        runs[share] = {split: resimulate(c, inputs, workload, advice.slo) for split, c in shown.items()}
        tried.append((share, _best(list(runs[share].values())).mode))
    split = advice.disaggregated.split
    return Reuse(
        advice.workload.prefix_hit_share,
        tuple(tried),
        runs[min(runs)][split],
        runs[advice.workload.prefix_hit_share][split],
    )
