"""The deployment planner's thresholds and calibration; planner/ computes with this model as it is."""

from __future__ import annotations

from pydantic import Field

from config.schema.base import StrictModel


class PlannerSettings(StrictModel):
    max_transfer_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="Largest share of prefill time that moving the KV cache may take before the plan warns.",
    )
    fail_on_transfer_share: bool = Field(
        default=False, description="Fail synth (instead of warning) when the share is exceeded."
    )
    typical_prompt_tokens: int = Field(default=4096, ge=1, description="Prompt length the verdict is judged at.")
    typical_output_tokens: int = Field(default=256, ge=1, description="Output length the verdict is judged at.")
    typical_concurrency: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Requests in flight at once that the advisor simulates by default (`make plan` takes others).",
    )
    ttft_slo_ms: float = Field(default=3000, gt=0, description="Time-to-first-token target the advisor judges by.")
    itl_slo_ms: float = Field(default=100, gt=0, description="Inter-token latency target the advisor judges by.")
    slo_percentile: int = Field(
        default=90, ge=50, le=99, description="Percentile of TTFT and ITL that must meet their targets."
    )
    prefill_mfu: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "Share of the GPU's peak BF16 FLOPS a prefill reaches. Empty: the GPU family's figure in "
            "planner/performance.py (Ada 0.6, Ampere 0.55, Hopper 0.45, with their sources); `make plan "
            "CALIBRATION=…` fits it to a benchmark."
        ),
    )
    network_efficiency: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Share of the instance's network bandwidth a KV transfer reaches.",
    )
    runtime_overhead_gib: float = Field(
        default=1.5,
        ge=0,
        description="GPU memory per GPU taken by CUDA context, activations and CUDA graphs.",
    )
    # Time to a new serving replica: each step an estimate to calibrate with a real deploy
    # (`make verify` reports how long the last replica took).
    node_boot_seconds: float = Field(
        default=90,
        gt=0,
        description=(
            "EC2 launch to a Ready Kubernetes node for a new GPU node. AWS publishes no figure; field reports "
            "of autoscaler-driven scale-ups give 45-90 s for the node (the upper end is used)."
        ),
    )
    image_compressed_gib: float = Field(
        default=12.6,
        gt=0,
        description=(
            "Compressed size of the serving image. AWS publishes none for the Ray LLM DLC; vLLM's CUDA image "
            "is about 12.6 GB (vllm-project/vllm#27154), and the DLC carries vLLM, Ray and EFA."
        ),
    )
    image_unpacked_gib: float = Field(
        default=28.6,
        gt=0,
        description=(
            "Unpacked size of the serving image on the node (vLLM's CUDA image: 28.6 GB, vllm-project/vllm#22377). "
            "A pull writes the compressed layers and the unpacked snapshot to the root volume."
        ),
    )
    hf_download_mibps: float = Field(
        default=475,
        gt=0,
        description=(
            "Download rate of model files from Hugging Face through the NAT gateway (about 500 MB/s, where the "
            "hf_transfer README places the plain client's ceiling; a NAT gateway gives 5 Gbps, scaling to 100)."
        ),
    )
    s3_stream_gbps: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Rate of streaming safetensors from the S3 mirror into the engine. Left empty: the node's network "
            "bandwidth × network_efficiency (Run:ai Model Streamer's S3 benchmark loads Llama-3-8B, 15 GB, in "
            "4.9 s at concurrency 32, so the network is the limit)."
        ),
    )
    engine_start_seconds: float = Field(
        default=80,
        gt=0,
        description=(
            "vLLM engine start after the weights are loaded: torch.compile (66.5 s for an 8B model on an L4, "
            "vllm-project/vllm#20264) plus CUDA graph capture and KV-cache allocation."
        ),
    )
