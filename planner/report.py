"""Plain-text rendering of a :class:`PlanReport`, fixed-width so it reads well in a terminal or CI log."""

from __future__ import annotations

from planner.core import GIB, PlanReport


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]

    # Text columns read best left-aligned, numbers right-aligned.
    def fmt(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=False))
        )

    return [fmt(headers), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)]


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def _size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n < GIB else _gib(n)


def render_text(report: PlanReport) -> str:
    i, m = report.inputs, report.model
    out = [
        f"Plan for {m.name}: {m.num_parameters / 1e9:.2f}B parameters, {m.num_layers} layers, "
        f"{m.num_attention_heads} attention / {m.num_kv_heads} KV heads × {m.head_dim}",
        f"dtype {i.dtype_bytes} bytes, max_model_len {i.max_model_len}, "
        f"gpu_memory_utilization {i.gpu_memory_utilization:g}; typical request {i.settings.typical_prompt_tokens} "
        f"prompt / {i.settings.typical_output_tokens} output tokens",
        "",
        "Memory per GPU",
    ]
    phases = [report.prefill, report.decode]
    out += _table(
        ["", *(p.phase for p in phases)],
        [
            ["instance", *(f"{p.nodes}× {p.instance_type} ({p.gpu}) TP{p.tensor_parallel_size}" for p in phases)],
            ["weights", *(_gib(p.weight_bytes_per_gpu) for p in phases)],
            ["KV per token per GPU", *(f"{p.kv_bytes_per_token_per_gpu / 1024:g} KiB" for p in phases)],
            ["KV cache", *(_gib(p.kv_cache_bytes_per_gpu) for p in phases)],
            ["max cached tokens", *(f"{p.max_cached_tokens:,}" for p in phases)],
            ["sequences at max_model_len", *(f"{p.max_concurrency_at_max_model_len:.2f}" for p in phases)],
            ["fits", *("yes" if p.fits else "NO" for p in phases)],
        ],
    )
    link = "UCX over one TCP flow" if report.inputs.kv_backend == "UCX" else "NIXL over EFA"
    out += ["", f"KV transfer at {report.bandwidth_bytes_per_second * 8 / 1e9:.1f} Gbit/s effective ({link})"]
    out += _table(
        ["prompt tokens", "prefill", "KV to move", "transfer", "share"],
        [
            [
                str(r.prompt_tokens),
                _ms(r.prefill_seconds),
                _size(r.kv_bytes),
                _ms(r.transfer_seconds),
                f"{r.transfer_share:.1%}",
            ]
            for r in report.transfer_rows
        ],
    )
    if report.skipped_prompt_lengths:
        out.append(f"(skipped, above max_model_len: {', '.join(map(str, report.skipped_prompt_lengths))})")
    out += ["", f"Verdict: {report.verdict}"]
    out += [f"ERROR: {e}" for e in report.errors] + [f"WARNING: {w}" for w in report.warnings]
    c = report.cost
    out += ["", f"Cost (on-demand, {c.region}, prices as of {c.prices_as_of})"]
    out += _table(
        ["item", "count", "$/h each", "$/h"],
        [[ln.item, str(ln.count), f"{ln.unit_per_hour:.4f}", f"{ln.per_hour:.4f}"] for ln in c.lines]
        + [["total", "", "", f"{c.per_hour:.4f}"]],
    )
    out.append(f"per 30-day month: ${c.per_month:,.2f} (data transfer and NAT processing not included)")
    if report.scaling is not None:
        out += ["", *_scaling(report.scaling)]
    return "\n".join(out) + "\n"


def _scaling(scaling) -> list[str]:
    out = [f"Scaling (Cluster Autoscaler; an idle node goes after {scaling.idle_minutes} min)"]
    out += _table(
        ["GPU group", "min", "max", "serving", "NewCluster upgrade"],
        [
            [
                f"{g.phase} ({g.instance_type})",
                str(g.min_size),
                str(g.max_size),
                str(g.steady_nodes),
                f"{g.upgrade_nodes} ({'fits' if g.upgrade_nodes <= g.max_size else 'over max_size'})",
            ]
            for g in scaling.groups
        ],
    )
    out.append(
        f"cost per hour: ${scaling.per_hour('min'):.4f} with every GPU group at min_size, "
        f"${scaling.per_hour('max'):.4f} at max_size"
    )
    tables: dict[tuple, list[str]] = {}
    for phase, times in scaling.replica_times.items():
        tables.setdefault(tuple(times), []).append(phase)
    for times, phases in tables.items():
        out += [
            "",
            f"Time to a new {' or '.join(phases)} replica on a new node (estimates; calibrate with make verify)",
        ]
        out += _table(
            ["step", *(t.source for t in times)],
            [
                ["node boot", *(f"{t.node_boot:.0f} s" for t in times)],
                ["image pull", *(f"{t.image_pull:.0f} s" for t in times)],
                ["weights", *(f"{t.weights:.0f} s" for t in times)],
                ["engine start", *(f"{t.engine_start:.0f} s" for t in times)],
                ["total", *(f"{t.total:.0f} s ({t.total / 60:.1f} min)" for t in times)],
                ["NAT data processing", *(f"${t.nat_cost:.2f} ({t.nat_gb:.1f} GB)" for t in times)],
            ],
        )
    return out
