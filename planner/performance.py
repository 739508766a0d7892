"""What one engine step and one KV transfer cost on a GPU: a roofline per step, with efficiencies per
GPU family that a measured run replaces (``make plan CALIBRATION=…``, planner/calibration.py).

A step is what vLLM's scheduler runs at once: one token for each running sequence (decode) and up to
the token budget of prompt chunks (prefill). It takes the longer of its compute (FLOPs over the
GPUs' peak times the MFU reached) and its memory traffic (the weights once, plus every sequence's KV
cache read by attention, over the bandwidth times the share reached), plus a fixed per-step cost
(scheduling, sampling, launches). Per prompt token the matmuls cost 2 FLOPs per weight outside the
embedding and the LM head: the embedding is a lookup, and the LM head runs once per sequence per
step (the token it samples), not once per prompt token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from config.catalog import GpuFacts, InstanceFacts
from planner.errors import PlanningError
from planner.models import ModelArchitecture


@dataclass(frozen=True)
class Efficiency:
    """How close a GPU family gets to its datasheet, and the fixed costs around it."""

    prefill_mfu: float  # share of peak BF16 FLOPS a prefill-heavy step reaches
    decode_bandwidth: float  # share of peak memory bandwidth a decode-heavy step reaches
    step_overhead_s: float  # per engine step, whatever its size
    request_overhead_s: float  # per request: HTTP, Serve's hops, tokenizing, detokenizing
    source: str
    # The front end's CPU per streamed token, in the process each token of a replica's streams passes
    # (detokenizing, an SSE chunk): a replica streams at most one token per this many seconds, and a
    # stream's next token waits for the others' (planner/simulate.py). ASSUMED_TOKEN_OVERHEAD_S unless
    # a family's measurements at high concurrency fit it (planner/measurements.py).
    token_overhead_s: float = 0.0
    # Per sequence in an engine step, whatever its tokens: vLLM scheduling it, preparing its inputs,
    # sampling its token and building its output. Fitted on the local CPU servers from what their
    # engines spent per step and per sequence (planner/local_check.py); on a GPU it is not measured by
    # any run here and is taken as nothing, so a GPU answer does not rest on it.
    sequence_overhead_s: float = 0.0


# The figures assumed before anything measured them, and still where nothing does: the prior of the
# fit to published measurements (planner/measurements.py), and the figures of a family it has no
# measurement for. Sources: decode bandwidth on L4 from a batch-1 measurement of Qwen2.5-7B at 2k
# context, 81% of peak (arXiv 2605.30571); prefill MFU of Ada from L40S serving data (0.55-0.65);
# Hopper's prefill from Dynamo's profile of Llama-3.1-8B on H200 (40k tokens/s at 3k prompts, about
# 0.34 of FP8 peak, so higher at BF16's lower peak). The per-step and per-request costs are vLLM's
# scheduler and Ray Serve's hops, a few milliseconds each: estimates, which is what calibration is for.
# The per-token front-end cost where nothing measures it: negligible (a cap of 100,000 tokens/s per
# replica), so that no answer rests on a cap nobody measured.
ASSUMED_TOKEN_OVERHEAD_S = 1e-5
ASSUMED_EFFICIENCY: dict[str, Efficiency] = {
    "Ada": Efficiency(
        0.60, 0.80, 0.004, 0.008, "assumed: L40S serving data; arXiv 2605.30571 (L4 decode)", ASSUMED_TOKEN_OVERHEAD_S
    ),
    "Ampere": Efficiency(
        0.55, 0.75, 0.004, 0.008, "assumed: estimate between Ada and Hopper; calibrate", ASSUMED_TOKEN_OVERHEAD_S
    ),
    "Ampere GA102": Efficiency(
        0.55, 0.75, 0.004, 0.008, "assumed: estimate between Ada and Hopper; calibrate", ASSUMED_TOKEN_OVERHEAD_S
    ),
    "Hopper": Efficiency(
        0.45, 0.60, 0.003, 0.008, "assumed: Dynamo's H200 prefill profile; arXiv 2605.30571", ASSUMED_TOKEN_OVERHEAD_S
    ),
    # The local servers' front end shares the CPU with the engines: planner/local_check.py models it
    # as a shared host from what each process spent (bench/host_cpu.py), not as this figure.
    "CPU": Efficiency(0.05, 0.30, 0.010, 0.030, "nominal; a CPU run is only meaningful calibrated"),
}
# A family shares a memory system as well as an architecture, since the bandwidth share a decode step
# reaches is the memory's: the A10G (GA102, GDDR6) is not fitted with the A100 (GA100, HBM2e).
GPU_FAMILY: dict[str, str] = {
    "L4": "Ada",
    "L40S": "Ada",
    "A10G": "Ampere GA102",
    "A100-40GB": "Ampere",
    "H100": "Hopper",
}

# PCIe 4.0 x16 as a host copy reaches it (of 32 GB/s raw): where there is no GPUDirect RDMA, NIXL
# stages KV through host memory, one copy on each side.
HOST_STAGING_BYTES_PER_S = 20e9
# A KV transfer's fixed cost: NIXL's notification round trip and Ray's second engine call.
TRANSFER_FIXED_S = 0.004


def efficiency_of(gpu: GpuFacts) -> Efficiency:
    """The GPU family's efficiencies (fitted to published measurements where there are any); for a GPU
    no family here covers, the least any family reaches (the lowest shares, the highest fixed costs),
    said to be assumed, with the run that measures it."""
    # The fit lives with its data and predicts with this module's step model, so it is imported
    # when first asked for rather than when this module loads.
    from planner.measurements import family_efficiencies

    table = family_efficiencies()
    known = GPU_FAMILY.get(gpu.model)
    if known is not None:
        return table[known]
    families = [e for name, e in table.items() if name in GPU_FAMILY.values()]
    return Efficiency(
        prefill_mfu=min(e.prefill_mfu for e in families),
        decode_bandwidth=min(e.decode_bandwidth for e in families),
        step_overhead_s=max(e.step_overhead_s for e in families),
        request_overhead_s=max(e.request_overhead_s for e in families),
        token_overhead_s=max(e.token_overhead_s for e in families),
        source=(
            f"assumed: nothing measured on the {gpu.model} GPU, so the least any GPU family here reaches; "
            "`make bench-compare` on one node of each group, then `make plan CALIBRATION=results/<date>`, "
            "measures it (or add the GPU to planner/performance.py GPU_FAMILY and its runs to "
            "planner/measurements.py)"
        ),
    )


@dataclass(frozen=True)
class Device:
    """One engine replica's hardware: ``tp`` GPUs of one model and how well they are used."""

    name: str
    peak_flops: float  # per GPU
    memory_bytes_per_s: float  # per GPU
    tp: int
    efficiency: Efficiency

    @classmethod
    def of(cls, facts: InstanceFacts, tp: int, efficiency: Efficiency | None = None) -> Device:
        gpu = facts.gpu_facts
        if gpu is None:
            raise PlanningError(f"{facts.instance_type} has no GPU")
        return cls(
            name=f"{facts.instance_type} ({gpu.model} ×{tp})",
            peak_flops=gpu.peak_bf16_tflops * 1e12,
            memory_bytes_per_s=gpu.memory_bandwidth_gbps * 1e9,
            tp=tp,
            efficiency=efficiency or efficiency_of(gpu),
        )

    def with_efficiency(self, efficiency: Efficiency) -> Device:
        return replace(self, efficiency=efficiency)


@dataclass(frozen=True)
class StepCost:
    """Engine-step arithmetic for one model on one device."""

    model: ModelArchitecture
    device: Device
    weight_bytes: float
    kv_bytes_per_token: float

    @classmethod
    def of(cls, model: ModelArchitecture, device: Device, dtype_bytes: int = 2) -> StepCost:
        return cls(model, device, model.num_parameters * dtype_bytes, model.kv_bytes_per_token(dtype_bytes))

    def with_efficiency(self, efficiency: Efficiency) -> StepCost:
        """The same model and device, used as well as ``efficiency`` says."""
        return StepCost(self.model, self.device.with_efficiency(efficiency), self.weight_bytes, self.kv_bytes_per_token)

    def __post_init__(self) -> None:
        m, d = self.model, self.device
        # Per-step constants, in seconds per unit, so that a step's cost is a few multiplications.
        compute_rate = d.tp * d.peak_flops * d.efficiency.prefill_mfu
        memory_rate = d.tp * d.memory_bytes_per_s * d.efficiency.decode_bandwidth
        object.__setattr__(self, "_per_token_s", 2 * m.matmul_parameters / compute_rate)
        object.__setattr__(self, "_attention_s", 4 * m.num_layers * m.num_attention_heads * m.head_dim / compute_rate)
        object.__setattr__(self, "_logits_s", 2 * m.hidden_size * m.vocab_size / compute_rate)
        object.__setattr__(self, "_weights_s", self.weight_bytes / memory_rate)
        object.__setattr__(self, "_kv_read_s", self.kv_bytes_per_token / memory_rate)

    def seconds(self, decode_contexts: list[int], prefill_chunks: list[tuple[int, int]]) -> float:
        """One step: a token for each decode sequence (its context so far) and each prefill chunk
        (offset, tokens); a chunk that ends a prompt also samples a token."""
        return self.step_seconds(
            len(decode_contexts),
            sum(decode_contexts),
            sum(c for _, c in prefill_chunks),
            sum(c * (o + c / 2) for o, c in prefill_chunks),
            sum(o for o, _ in prefill_chunks),
            len(prefill_chunks),
        )

    def step_seconds(
        self,
        decode_tokens: float,
        decode_context: float,
        prefill_tokens: float,
        prefill_attention: float,
        prefill_context: float,
        prefill_sequences: float,
    ) -> float:
        """:meth:`seconds` from the sums a simulation keeps: decode sequences and their total context;
        prompt tokens in the step, Σ tokens × (offset + tokens/2) for attention, Σ offsets, chunks
        (means over many steps may be fractional)."""
        compute = (
            self._per_token_s * (decode_tokens + prefill_tokens)  # type: ignore[attr-defined]
            + self._attention_s * (decode_context + prefill_attention)  # type: ignore[attr-defined]
            + self._logits_s * (decode_tokens + prefill_sequences)  # type: ignore[attr-defined]
        )
        memory = self._weights_s + self._kv_read_s * (decode_context + prefill_context)  # type: ignore[attr-defined]
        efficiency = self.device.efficiency
        sequences = decode_tokens + prefill_sequences
        return max(compute, memory) + efficiency.step_overhead_s + efficiency.sequence_overhead_s * sequences


@dataclass(frozen=True)
class Link:
    """How a prompt's KV cache moves from a prefill node to a decode node."""

    network_bytes_per_s: float
    staging_bytes_per_s: float | None  # None: GPUDirect RDMA, no host copies
    fixed_s: float = TRANSFER_FIXED_S
    # False: vLLM's NIXL connector (what this project deploys) moves a prompt's KV once its prefill
    # is done. True: SGLang's P/D sends each prefill chunk's KV as soon as the chunk is computed,
    # through one queue per prefill engine that sends a chunk at a time (sglang 2025-04,
    # disaggregation/prefill.py send_kv_chunk, disaggregation/mooncake/conn.py transfer_thread), so a
    # long prompt's transfer overlaps its own later chunks, and transfers wait for each other.
    per_chunk: bool = False

    @classmethod
    def between(cls, prefill: InstanceFacts, decode: InstanceFacts, network_efficiency: float) -> Link:
        network = min(prefill.network_gbps, decode.network_gbps) * 1e9 / 8 * network_efficiency
        direct = prefill.gpudirect_rdma and decode.gpudirect_rdma
        return cls(network, None if direct else HOST_STAGING_BYTES_PER_S)

    def seconds(self, kv_bytes: float) -> float:
        # vLLM's NIXL connector pulls a request's KV once its prefill is done, so nothing overlaps
        # with its own prefill.
        return self.fixed_s + self.moving_seconds(kv_bytes)

    def moving_seconds(self, kv_bytes: float) -> float:
        """The bytes on the wire, and the copies to and from host memory in series with it; not the
        per-request fixed cost."""
        staging = 2 * kv_bytes / self.staging_bytes_per_s if self.staging_bytes_per_s else 0.0
        return kv_bytes / self.network_bytes_per_s + staging
