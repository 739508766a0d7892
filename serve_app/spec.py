"""What is served, as one pydantic model used by Python, the Serve YAML and the RayService.

:class:`ServingSpec` is the ``args`` of the Serve application: the RayService's
``serveConfigV2`` carries ``ServingSpec.model_dump(mode="json")`` and ``build_app`` parses it back.
Everything vLLM and Ray Serve LLM need (``LLMConfig`` dicts) is derived here, in one place.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PHASES = ("prefill", "decode")

# Ray custom resources that each worker group advertises; every placement bundle of a phase asks
# for a sliver of its phase's resource, so replicas can only land on that phase's nodes.
PHASE_RESOURCE = {"prefill": "pd_prefill", "decode": "pd_decode"}
PHASE_RESOURCE_PER_BUNDLE = 0.001
# Ray Serve LLM's ingress behind the endpoint's API keys, by import path (Ray loads it in the replica).
KEYED_INGRESS = "serve_app.ingress:KeyedOpenAiIngress"
# What a colocated app's ingress asks for: enough to keep it off the head, which advertises no CPU.
INGRESS_CPUS = 0.01

# Keys of engine_kwargs that the spec manages itself; setting them twice would be ambiguous.
MANAGED_ENGINE_KWARGS = {
    "kv_transfer_config": "kv_transfer",
    "tensor_parallel_size": "<phase>.tensor_parallel_size",
    "max_model_len": "max_model_len",
    "dtype": "dtype",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "model": "model.source",
    "served_model_name": "model.model_id",
    "device": "device",
    "load_format": "model.load_format",
    "enable_auto_tool_choice": "tool_call_parser",
    "tool_call_parser": "tool_call_parser",
    "reasoning_parser": "reasoning_parser",
    "enable_prefix_caching": "prefix_caching",
}

KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
# The module vLLM loads its NixlConnector from in both phases (kv_connector_module_path): vLLM's own,
# with decode's wait for a KV read bounded (serve_app/kv_wait.py), and the key that carries the bound.
KV_WAIT_MODULE = "serve_app.kv_wait"
STALL_TIMEOUT_KEY = "stall_timeout_s"
ENGINE_CALLBACK = "serve_app.callbacks:EngineCallbacks"
# The key of decode's experimental_configs that carries pd_min_prompt_tokens to serve_app/selective.py
# (Ray carries it and reads it not).
SELECTIVE_THRESHOLD_KEY = "pd_min_prompt_tokens"
# The key that carries pd_max_local_prefill_tokens beside it.
SELECTIVE_CAP_KEY = "pd_max_local_prefill_tokens"
# The longest prefill decode can run beside a batch of 8 streams while its step stays within a 100 ms
# ITL target, for the default model (Qwen2.5-7B-Instruct, bf16) on its GPU (g6.8xlarge, one L4), in
# the advisor's step model (planner.advisor.recommended_threshold; tests derive it again).
DEFAULT_LOCAL_PREFILL_CAP = 512
# vLLM's front-end flag (FrontendArgs, which Ray Serve LLM fills from engine_kwargs) that adds
# usage.prompt_tokens_details.cached_tokens to every answer.
PROMPT_TOKENS_DETAILS = "enable_prompt_tokens_details"
# The key of decode's experimental_configs that turns Ray Serve LLM's P/D prewarm on (pd_server.py).
PREWARM_KEY = "_prewarm_prefill_decode"
# What Secrets Manager accepts (CreateSecret: Name, and the ARN it returns, which ends in -XXXXXX).
SECRET_NAME = re.compile(r"^[A-Za-z0-9/_+=.@-]+$")
SECRET_ARN = re.compile(r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]+-[A-Za-z0-9]{6}$")
# vLLM's tool-call and reasoning parsers by name: the keys of its registries
# (vllm/tool_parsers/__init__.py _TOOL_PARSERS_TO_REGISTER, vllm/reasoning/__init__.py
# _REASONING_PARSERS_TO_REGISTER) in the serving image's vLLM, PARSER_REGISTRY_VLLM_VERSION. Pinned
# here because the spec is checked at synth, where vLLM is not installed; the tests install the
# image's vLLM and keep these equal to its registries and this version equal to the image's
# (tests/serve_app/test_tool_calling.py). A name only a newer vLLM knows fails the engine's start on
# the cluster, so it is refused at synth.
PARSER_REGISTRY_VLLM_VERSION = "0.26.0"
TOOL_CALL_PARSERS = frozenset(
    {
        "apertus",
        "cohere_command3",
        "cohere_command4",
        "deepseek_v3",
        "deepseek_v31",
        "deepseek_v32",
        "deepseek_v4",
        "ernie45",
        "functiongemma",
        "gemma4",
        "gigachat3",
        "glm45",
        "glm47",
        "granite",
        "granite-20b-fc",
        "granite4",
        "hermes",
        "hunyuan_a13b",
        "hy_v3",
        "inkling",
        "internlm",
        "jamba",
        "kimi_k2",
        "lfm2",
        "llama3_json",
        "llama4_json",
        "llama4_pythonic",
        "longcat",
        "mimo",
        "minicpm5",
        "minimax_m2",
        "minimax_m3",
        "mistral",
        "olmo3",
        "openai",
        "phi4_mini_json",
        "poolside_v1",
        "pythonic",
        "qwen3_coder",
        "qwen3_xml",
        "seed_oss",
        "step3",
        "step3p5",
        "xlam",
    }
)
REASONING_PARSERS = frozenset(
    {
        "cohere_command3",
        "cohere_command4",
        "deepseek_r1",
        "deepseek_v3",
        "deepseek_v4",
        "ernie45",
        "gemma4",
        "glm45",
        "glm47",
        "granite",
        "holo2",
        "hunyuan_a13b",
        "hy_v3",
        "inkling",
        "kimi_k2",
        "mimo",
        "minimax_m2",
        "minimax_m2_append_think",
        "minimax_m3",
        "mistral",
        "nemotron_v3",
        "olmo3",
        "openai_gptoss",
        "poolside_v1",
        "qwen3",
        "seed_oss",
        "step3",
        "step3p5",
    }
)
# The tool-call parser of each model family the docs name, by a pattern of the model's source or id.
FAMILY_TOOL_CALL_PARSERS = ((re.compile(r"qwen2[._-]?5", re.IGNORECASE), "hermes"),)
# tool_call_parser's value that turns tool calling off for a family that has a default.
NO_PARSER = "none"
# The request routers a phase may name: the class Ray Serve imports for the deployment's handles
# (None: Serve's default, power of two choices), all in Ray 2.58.0, the cluster image's.
# prefix_affinity is Ray Serve LLM's PrefixCacheAffinityRouter (python/ray/serve/llm/request_router.py,
# PublicAPI beta) made safe for prompts that are not text (serve_app/routers.py); session_affinity is
# Serve's ConsistentHashRouter (serve/experimental/consistent_hash_router.py), keyed on the session
# header (SESSION_HEADER), which Ray's ingress and P/D decode pass on to the next hop.
REQUEST_ROUTER_CLASSES: dict[str, str | None] = {
    "power_of_two": None,
    "prefix_affinity": "serve_app.routers:PrefixAffinityRouter",
    "session_affinity": "ray.serve.experimental.consistent_hash_router:ConsistentHashRouter",
}
# The oldest Ray whose source was read to hold each router class (older ones are refused at synth).
REQUEST_ROUTER_SINCE_RAY = {"prefix_affinity": (2, 58), "session_affinity": (2, 58)}
# The Ray Serve class each of those routers is (prefix_affinity's subclasses it).
REQUEST_ROUTER_RAY_CLASS = {"prefix_affinity": "PrefixCacheAffinityRouter", "session_affinity": "ConsistentHashRouter"}
# The HTTP header session_affinity keys on: Ray Serve's default (RAY_SERVE_SESSION_ID_HEADER_KEY unset;
# serve/_private/constants.py SERVE_SESSION_ID).
SESSION_HEADER = "x-session-id"
# The text each replica's entry in the prefix-affinity router's tree may hold before its least recently
# used prefixes are dropped: about what the default model's KV cache holds on one L4 (Qwen2.5-7B,
# 56 KiB of KV per token, about 7 GiB of KV: some 125,000 tokens, 4 characters each, rounded down),
# Ray's own figure when eviction is on. Dropped down to 90 % of it, as Ray's defaults do.
PREFIX_TREE_CHARS_PER_REPLICA = 400_000
PREFIX_TREE_EVICTION_TARGET = 0.9
# Ray Serve LLM's own defaults put decode's NIXL handshake ports 2000 above prefill's.
DECODE_SIDE_CHANNEL_OFFSET = 2000


def secret_reference_problem(field: str, value: str) -> str | None:
    """What is wrong with ``value`` as the name or complete ARN of a Secrets Manager secret, if anything."""
    if value.startswith("arn:"):
        if not SECRET_ARN.match(value):
            return (
                f"{field} {value!r} is not a complete Secrets Manager ARN "
                "(arn:aws:secretsmanager:<region>:<account>:secret:<name>-<6 characters>); copy it from "
                "`aws secretsmanager describe-secret --secret-id NAME --query ARN`, or give the name"
            )
        return None
    if not 1 <= len(value) <= 512 or not SECRET_NAME.match(value):
        return (
            f"{field} {value!r} is not a Secrets Manager secret name: use 1-512 characters, "
            "letters, digits and /_+=.@- only"
        )
    return None


class SpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(SpecModel):
    model_id: str = Field(
        description="Name clients use in the OpenAI `model` field, e.g. qwen2.5-7b-instruct.",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$",
    )
    source: str = Field(
        description=(
            "Where the weights come from: a Hugging Face repo id (Qwen/Qwen2.5-7B-Instruct), an "
            "S3 mirror (s3://bucket/prefix) or, locally, a directory path."
        )
    )
    hf_token_secret: str | None = Field(
        default=None,
        description=(
            "Name or complete ARN of an AWS Secrets Manager secret (in the cluster's region) whose value "
            "is a Hugging Face token, for gated models. Only the name travels: the Secrets Store CSI "
            "driver mounts the value as a file in each GPU worker pod, read with the workers' own role."
        ),
    )
    gated: bool = Field(
        default=False,
        description="The Hugging Face repo requires accepting a licence and a token.",
    )
    config_json: str | None = Field(
        default=None,
        description="Local config.json of the model, for the planner when the model is not in its table.",
    )
    hub_id: str | None = Field(
        default=None,
        description=(
            "The Hugging Face repo the weights come from when source is not one (an S3 mirror): "
            "`make mirror-model` copies it and the planner reads its architecture from it."
        ),
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$",
    )
    source_region: str | None = Field(
        default=None,
        description=(
            "Region of an S3 source that is not the stack's own mirror (an s3:// URI carries none, and "
            "synth makes no AWS call to find it). It must be the cluster's region: cross-region weights "
            "are slow and paid per GB."
        ),
    )
    load_format: Literal["auto", "runai_streamer"] | None = Field(
        default=None,
        description=(
            "How the engines read the weights. runai_streamer streams the safetensors straight from S3 into "
            "memory (vLLM's Run:ai Model Streamer; Ray Serve LLM then skips its copy to local disk); auto "
            "copies them to the node first. Left empty: runai_streamer for an s3:// source, auto otherwise."
        ),
    )

    @property
    def is_s3(self) -> bool:
        return self.source.startswith("s3://")

    @property
    def hub_repo(self) -> str | None:
        """The Hugging Face repo of the weights: hub_id, or source when it is a repo id (not S3, not a path)."""
        if self.hub_id:
            return self.hub_id
        return None if self.is_s3 or self.source.startswith(("/", ".")) else self.source

    @property
    def streams(self) -> bool:
        """Whether the engines stream the weights from S3 (the load format, explicit or derived)."""
        return (self.load_format or ("runai_streamer" if self.is_s3 else "auto")) == "runai_streamer"

    @field_validator("hf_token_secret")
    @classmethod
    def _secret_name(cls, value: str | None) -> str | None:
        problem = secret_reference_problem("hf_token_secret", value) if value is not None else None
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _token_for_gated(self) -> ModelSpec:
        if self.gated and not self.hf_token_secret and not self.is_s3:
            raise ValueError(
                f"model {self.source} is gated but hf_token_secret is not set: store a Hugging "
                "Face token in AWS Secrets Manager and set serving.model.hf_token_secret to its name"
            )
        if self.is_s3 and not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", self.source):
            raise ValueError(f"source {self.source!r} is not an S3 URI such as s3://bucket/models/qwen")
        if self.load_format == "runai_streamer" and not self.is_s3:
            raise ValueError(
                f"load_format runai_streamer streams from S3; serving.model.source is {self.source}: mirror the "
                "model (make mirror-model) and use its s3:// URI, or set load_format: auto"
            )
        return self


class KvTransferSpec(SpecModel):
    connector: Literal["NixlConnector"] = Field(
        default="NixlConnector", description="vLLM KV connector that moves KV from prefill to decode."
    )
    backend: Literal["LIBFABRIC", "UCX"] = Field(
        default="LIBFABRIC",
        description=(
            "NIXL backend. LIBFABRIC uses EFA's provider; UCX is the fallback (on EFA it runs at "
            "TCP speed) and what the CPU build uses over loopback."
        ),
    )
    buffer_device: Literal["cpu", "cuda"] = Field(
        default="cpu",
        description=(
            "Where NIXL stages KV blocks. `cpu` (host memory) is required on instances without "
            "GPUDirect RDMA, such as g6; `cuda` needs GPUDirect RDMA (p4d, p5)."
        ),
    )
    load_failure_policy: Literal["recompute", "fail"] = Field(
        default="recompute",
        description=(
            "What decode does when a KV transfer fails or stalls (stall_timeout_s): recompute the prompt "
            "locally (slower, but the request completes) or fail the request with an error."
        ),
    )
    stall_timeout_s: float = Field(
        default=30,
        ge=1,
        le=300,
        description=(
            "How long decode waits for a KV read that makes no progress before it fails the read and "
            "load_failure_policy applies (counted as pd_kv_transfer_stalls, logged with the prefill peer). "
            "NIXL reports a read only as in progress or done, so this bounds each read's whole time: keep it "
            "well above the longest legitimate transfer (a max_model_len prompt's KV at the backend's rate; "
            "`make plan` prints it). It cannot interrupt a read NIXL never manages to post "
            '(docs/troubleshooting.md, "The KV path").'
        ),
    )
    side_channel_host: str | None = Field(
        default=None,
        description=(
            "Address NIXL's handshake listens on. Unset on the cluster (Ray uses the node IP); 127.0.0.1 on a laptop."
        ),
    )
    # Read by vLLM 0.26.0 (the cluster image's) and 0.32.0 alike: kv_connector/v1/nixl/base_worker.py
    # passes get_from_extra_config("num_threads", 4) to nixl_agent_config only when no backend but
    # UCX is configured (0.26.0: lines 324-341).
    nixl_threads: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "NIXL's worker threads per engine (kv_connector_extra_config.num_threads). vLLM applies it only "
            "when every NIXL backend is UCX (its default there is 4), so it matters for the local run and "
            "not for LIBFABRIC on the cluster. On a small CPU, fewer threads compete less with the engines."
        ),
    )
    side_channel_port_base: int = Field(
        default=20000,
        ge=1024,
        le=63000,
        description=(
            "First port of NIXL's handshake listeners: prefill engines listen from this port, decode "
            f"engines from it plus {DECODE_SIDE_CHANNEL_OFFSET} (Ray Serve LLM adds a per-replica offset; "
            "its defaults are 20000 and 22000). It matters where both phases share a host, as in the "
            "local run; move it when something else holds those ports."
        ),
    )


class PhaseSpec(SpecModel):
    min_replicas: int = Field(default=1, ge=0, description="Fewest engine replicas (Serve autoscaling).")
    max_replicas: int = Field(default=1, ge=1, description="Most engine replicas (Serve autoscaling).")
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs per engine replica.")
    target_ongoing_requests: int = Field(
        default=16, ge=1, description="Requests per replica that Serve autoscaling aims for."
    )
    cpus_per_replica: float = Field(default=4, gt=0, description="Ray CPUs reserved with each replica's first bundle.")
    gpu_fraction: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description=(
            "Share of a GPU each engine takes. Below 1, engines share a GPU (a small model, or "
            "both phases on one GPU for a check); only with tensor_parallel_size 1."
        ),
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra vLLM engine arguments for this phase (e.g. enforce_eager, max_num_seqs).",
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Environment variables for this phase's engine replicas only, over the spec's env_vars (e.g. "
            "VLLM_CPU_OMP_THREADS_BIND, which must differ per phase on a CPU). Never secrets."
        ),
    )
    request_router: Literal["power_of_two", "prefix_affinity", "session_affinity"] = Field(
        default="power_of_two",
        description=(
            "How Serve picks one of this phase's replicas for a request (it matters from two replicas on). "
            "power_of_two: Serve's default, the less loaded of two random replicas; a conversation's turns land "
            "on replicas that may never have seen its history. prefix_affinity: Ray Serve LLM's "
            "PrefixCacheAffinityRouter (Ray 2.58+), the replica whose earlier prompts share the longest prefix "
            "with this one, unless the replicas' queues differ by more than prefix_affinity_max_imbalance "
            "(then power of two); needs serving.prefix_caching. session_affinity: Ray Serve's "
            f"ConsistentHashRouter (Ray 2.58+), every request with the same {SESSION_HEADER} header on the same "
            "replica while the replica set stays (requests without it spread evenly). For decode it picks "
            "among decode replicas, for prefill among prefill's."
        ),
    )
    prefix_affinity_max_imbalance: int | None = Field(
        default=None,
        ge=0,
        description=(
            "With request_router prefix_affinity: the difference in ongoing requests between the busiest and "
            "the idlest replica above which a request is routed by power of two instead of by prefix, so a "
            "prefix most requests share (a system prompt, a RAG context) cannot pin them all to one replica "
            "while others idle. Empty: half of target_ongoing_requests (at least 1)."
        ),
    )
    prefix_affinity_chars_per_replica: int = Field(
        default=PREFIX_TREE_CHARS_PER_REPLICA,
        ge=1_000,
        description=(
            "With request_router prefix_affinity: the prompt text the router remembers per replica; past it, "
            "the least recently used prefixes are forgotten (down to 90 %), as the replica's KV cache evicts "
            "them. The default is about what the default model's KV cache holds on one L4."
        ),
    )
    max_surge_percent: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description=(
            "Ray Serve's max_surge_percent (Ray 2.60+): during an in-place rollout, start this share of "
            "extra replicas before stopping old ones, so the phase keeps serving (needs room for them). "
            "Ray 2.58 does not know it and ignores it silently, so synth refuses it with an older image."
        ),
    )

    @model_validator(mode="after")
    def _prefix_affinity_fields_need_its_router(self) -> PhaseSpec:
        # Told by value, not by whether the field was given: the rendered spec (serveConfigV2's args)
        # carries every field, defaults too, and is validated again in the cluster.
        if self.request_router != "prefix_affinity":
            for field in ("prefix_affinity_max_imbalance", "prefix_affinity_chars_per_replica"):
                if getattr(self, field) != type(self).model_fields[field].default:
                    raise ValueError(
                        f"{field} applies to request_router: prefix_affinity, and this phase's router is "
                        f"{self.request_router}; remove {field} or set request_router: prefix_affinity"
                    )
        return self

    @property
    def prefix_affinity_imbalance(self) -> int:
        """The queue difference above which prefix_affinity routes by power of two."""
        if self.prefix_affinity_max_imbalance is not None:
            return self.prefix_affinity_max_imbalance
        return max(1, self.target_ongoing_requests // 2)

    def request_router_kwargs(self) -> dict[str, Any]:
        """What the phase's router class's ``initialize_state`` receives (nothing: its defaults)."""
        if self.request_router != "prefix_affinity":
            return {}
        # Ray's defaults are an infinite threshold (never power of two) and no eviction (the tree
        # actor keeps every prompt's text for as long as the app runs).
        return {
            "imbalanced_threshold": self.prefix_affinity_imbalance,
            "do_eviction": True,
            "eviction_threshold_chars": self.prefix_affinity_chars_per_replica,
            "eviction_target_chars": int(self.prefix_affinity_chars_per_replica * PREFIX_TREE_EVICTION_TARGET),
        }

    @model_validator(mode="after")
    def _replicas(self) -> PhaseSpec:
        if self.gpu_fraction < 1 and self.tensor_parallel_size > 1:
            raise ValueError(
                "gpu_fraction below 1 shares one GPU and cannot combine with tensor_parallel_size "
                f"{self.tensor_parallel_size}; set gpu_fraction: 1 or tensor_parallel_size: 1"
            )
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas}); "
                "raise max_replicas or lower min_replicas"
            )
        return self

    @field_validator("engine_kwargs")
    @classmethod
    def _unmanaged(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if key in MANAGED_ENGINE_KWARGS:
                raise ValueError(
                    f"engine_kwargs.{key} is set by the spec; use serving.{MANAGED_ENGINE_KWARGS[key]} instead"
                )
        return value


class ServingSpec(SpecModel):
    mode: Literal["disaggregated", "colocated"] = Field(
        default="disaggregated",
        description=(
            "disaggregated: prefill and decode engines on their own nodes, KV moved by NIXL. "
            "colocated: one engine does both (the A/B baseline and the fallback)."
        ),
    )
    app_name: str = Field(
        default="llm", description="Name of the Serve application.", pattern=r"^[a-z0-9][a-z0-9-]{0,30}$"
    )
    model: ModelSpec = Field(description="The one model served.")
    max_model_len: int = Field(default=8192, ge=16, description="Longest prompt + output in tokens.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Weight and activation dtype."
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0.1, le=0.98, description="Share of GPU memory vLLM may use (weights + KV cache)."
    )
    device: Literal["cuda", "cpu"] = Field(
        default="cuda",
        description="Where engines run. `cpu` is the laptop/CI run with the vLLM CPU build.",
    )
    prefill: PhaseSpec = Field(default_factory=PhaseSpec, description="Prefill engines.")
    decode: PhaseSpec = Field(default_factory=PhaseSpec, description="Decode engines.")
    colocated: PhaseSpec = Field(
        default_factory=PhaseSpec, description="The engines of colocated mode (either GPU group)."
    )
    kv_transfer: KvTransferSpec = Field(default_factory=KvTransferSpec, description="How KV moves between phases.")
    prewarm_nixl: bool = Field(
        default=True,
        description="Send a dummy request through every prefill replica at start-up so the NIXL "
        "handshake is done before the first user request. It runs beside decode's start, retried until "
        "prefill answers: a late prefill never fails decode (serve_app/pd_decode.py).",
    )
    stream_batching_interval_ms: float = Field(
        default=10,
        ge=0,
        le=1000,
        description=(
            "How long Ray Serve LLM gathers a stream's tokens before it sends them on "
            "(experimental_configs.stream_batching_interval_ms; Ray's default is 50). Every first token "
            "waits for the next tick, so the interval is added to TTFT, up to its full length; 0 sends each "
            "token at once, at the cost of one message per token per stream. 10 ms keeps TTFT's rounding "
            "small while a busy engine still batches its streams' tokens."
        ),
    )
    prefix_caching: bool = Field(
        default=True,
        description=(
            "vLLM's automatic prefix caching in every engine (enable_prefix_caching), rendered explicitly "
            "for each phase. A prompt that starts with blocks an engine already computed (a conversation's "
            "earlier turns, a shared system prompt or document) reuses them: prefill computes only the rest, "
            "and decode pulls over NIXL only the blocks it does not hold. Off, every prompt is computed and "
            "moved whole; only for a measurement without reuse."
        ),
    )
    pd_tokenize_once: bool = Field(
        default=True,
        description=(
            "P/D only: prefill hands decode the prompt's token ids, so decode does not tokenize the prompt "
            "again (experimental_configs.pd_tokenize_once in Ray's P/D server). Off, decode re-tokenizes "
            "every prompt: time on the critical path of the first token, growing with the prompt."
        ),
    )
    pd_min_prompt_tokens: int = Field(
        default=0,
        ge=0,
        description=(
            "P/D only: a prompt whose uncached remainder (its tokens less the full KV blocks decode's engine "
            "is estimated to hold from the prompts it served before) is shorter than this many tokens is "
            "prefilled by decode itself, with no remote prefill and no KV transfer (serve_app/selective.py); "
            "any other goes through prefill and NIXL. So a short prompt, and a conversation's next turn "
            "(a long history decode holds, a short new message), stay on decode. Remote prefill adds a "
            "second engine call and a transfer before the first token, which pays only for a long "
            "computation. 0: every request goes through P/D (Ray's build_pd_openai_app as it is). "
            "`make plan` recommends a value for a workload."
        ),
    )
    pd_max_local_prefill_tokens: int = Field(
        default=DEFAULT_LOCAL_PREFILL_CAP,
        gt=0,
        description=(
            "P/D with pd_min_prompt_tokens only: the most tokens of one prompt that selective P/D lets decode "
            "compute itself, whatever pd_min_prompt_tokens says (the lower of the two decides). A prefill on "
            "decode lengthens the step of every stream decode runs; the default, 512, keeps that step within "
            "a 100 ms ITL target beside 8 streams for the default model on its GPU (Qwen2.5-7B on one L4). "
            "`make plan` prints the figure for this config's model, GPU and planner targets. It governs "
            "only selective P/D's choice: a request P/D cannot split, and a request whose prefill is gone, "
            "run on decode whatever their length."
        ),
    )
    request_timeout_s: float = Field(
        default=600,
        gt=0,
        description=(
            "Longest a request may take end to end before Serve answers it with HTTP 408. It "
            "bounds what a client waits when a phase dies mid-request (its replacement takes "
            "minutes to load the model); keep it above your longest legitimate generation."
        ),
    )
    drain_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "How long a replica that Serve stops (an in-place rollout, a scale-down) keeps serving the "
            "requests it already has before it is killed (Serve's graceful_shutdown_timeout_s, 20 s by "
            "default), for the engines and the ingress alike. Empty: request_timeout_s, so no generation "
            "that Serve allows is cut. A lower value shortens an in-place rollout with a long generation "
            "in flight (a phase with one replica cannot start its replacement before the old one has "
            "gone), at the price of cutting generations longer than it."
        ),
    )
    tool_call_parser: str | None = Field(
        default=None,
        description=(
            "vLLM's tool-call parser for the model, on every phase alike (vLLM's enable_auto_tool_choice and "
            "tool_call_parser): requests with `tools` may then use tool_choice auto, required or a named "
            "function, and get `tool_calls` back. Empty: the parser of the model's family where one is known "
            "(Qwen2.5: hermes), else tool calling is off; `none`: off."
        ),
    )
    reasoning_parser: str | None = Field(
        default=None,
        description=(
            "vLLM's reasoning parser, on every phase alike, for a model that reasons before it answers "
            "(e.g. qwen3, deepseek_r1): its reasoning comes back apart from the answer. Empty: none."
        ),
    )
    api_key_dir: str | None = Field(
        default=None,
        description=(
            "A directory of the ingress's node whose files hold the endpoint's API keys, one key per file: "
            "a request without `Authorization: Bearer <one of them>` gets HTTP 401 (serve_app/ingress.py). "
            "The stack sets it when ray_service.endpoint.api_key_secrets names secrets, and mounts them "
            "there; `make local API_KEY=…` for the local run. Empty: no key is asked for."
        ),
    )
    cache_salt_file: str | None = Field(
        default=None,
        description=(
            "With api_key_dir: a file of the ingress's node holding a secret under which each API key's "
            "requests get a cache_salt of their own, so keys never share cached prompt blocks "
            "(serve_app/ingress.py). The stack sets it with ray_service.endpoint.cache_isolation per_key "
            "(the default) and mounts a secret it generates; `make local API_KEY=…` writes one per run. "
            "Empty: every key shares the prefix cache."
        ),
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description="Extra environment variables for every engine replica (never secrets).",
    )

    @model_validator(mode="after")
    def _device_consistency(self) -> ServingSpec:
        if self.device == "cpu" and self.kv_transfer.buffer_device == "cuda":
            raise ValueError("kv_transfer.buffer_device is cuda but device is cpu; set kv_transfer.buffer_device: cpu")
        named = [(f"env_vars.{k}", k) for k in self.env_vars] + [
            (f"{phase}.env_vars.{k}", k)
            for phase in ("prefill", "decode", "colocated")
            for k in self.phase(phase).env_vars
        ]
        for where, key in named:
            if key.upper().startswith("RAY_AUTH_"):
                raise ValueError(
                    f"{where}: Ray's token authentication is the cluster's, set by KubeRay in every Ray "
                    "process (ray_service.auth_token_generation rotates it); remove it"
                )
            if re.search(r"TOKEN|SECRET|PASSWORD|KEY", key, re.IGNORECASE):
                raise ValueError(
                    f"{where} looks like a secret; secrets never go into the serve config "
                    "(use model.hf_token_secret for a Hugging Face token)"
                )
        return self

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_call_parser(cls, value: str | None) -> str | None:
        if value is not None and value != NO_PARSER and value not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"{value!r} is not a tool-call parser of vLLM {PARSER_REGISTRY_VLLM_VERSION}, the serving image's; use one of "
                f"{', '.join(sorted(TOOL_CALL_PARSERS))}, "
                f"or {NO_PARSER} to turn tool calling off"
            )
        return value

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, value: str | None) -> str | None:
        if value is not None and value not in REASONING_PARSERS:
            raise ValueError(
                f"{value!r} is not a reasoning parser of vLLM {PARSER_REGISTRY_VLLM_VERSION}, the serving image's; use one of "
                f"{', '.join(sorted(REASONING_PARSERS))}, "
                "or leave it empty"
            )
        return value

    @model_validator(mode="after")
    def _prefix_affinity_needs_the_prefix_cache(self) -> ServingSpec:
        for phase in ("prefill", "decode", "colocated"):
            if self.phase(phase).request_router == "prefix_affinity" and not self.prefix_caching:
                raise ValueError(
                    f"{phase}.request_router is prefix_affinity, but prefix_caching is false, so no replica would "
                    f"reuse the prefix it is chosen for; set prefix_caching: true or {phase}.request_router: "
                    "power_of_two"
                )
        return self

    @model_validator(mode="after")
    def _salt_needs_keys(self) -> ServingSpec:
        if self.cache_salt_file and not self.api_key_dir:
            raise ValueError(
                "cache_salt_file salts each API key's requests, but api_key_dir is empty, so no request has a "
                "key; set api_key_dir or remove cache_salt_file"
            )
        return self

    @model_validator(mode="after")
    def _no_cached_tokens_in_pd(self) -> ServingSpec:
        # Decode's engine counts the prompt tokens it pulled over NIXL as cached (vLLM 0.26, the
        # image's: num_cached_tokens = local + external in v1/metrics/stats.py), so the field would
        # report nearly every P/D prompt as a cache hit; colocated reports true hits.
        if self.mode == "disaggregated":
            for phase in ("prefill", "decode"):
                if self.phase(phase).engine_kwargs.get(PROMPT_TOKENS_DETAILS):
                    raise ValueError(
                        f"{phase}.engine_kwargs.{PROMPT_TOKENS_DETAILS} would report the KV decode pulls from "
                        "prefill as cached tokens (usage.prompt_tokens_details.cached_tokens near the whole "
                        "prompt on every P/D request); remove it, or use mode: colocated, where it counts "
                        "true prefix-cache hits"
                    )
        return self

    @model_validator(mode="after")
    def _selective_threshold_below_the_context(self) -> ServingSpec:
        if self.pd_min_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"pd_min_prompt_tokens ({self.pd_min_prompt_tokens}) is not below max_model_len "
                f"({self.max_model_len}), so no request would ever be disaggregated; lower it, or use "
                "mode: colocated"
            )
        return self

    @model_validator(mode="after")
    def _stall_bound_within_the_request_timeout(self) -> ServingSpec:
        if self.mode == "disaggregated" and self.kv_transfer.stall_timeout_s >= self.request_timeout_s:
            raise ValueError(
                f"kv_transfer.stall_timeout_s ({self.kv_transfer.stall_timeout_s:g}) is not below request_timeout_s "
                f"({self.request_timeout_s:g}): a stalled KV read would end the request before "
                "load_failure_policy could serve it; lower kv_transfer.stall_timeout_s"
            )
        return self

    @model_validator(mode="after")
    def _drain_within_the_request_timeout(self) -> ServingSpec:
        if self.drain_timeout_s is not None and self.drain_timeout_s > self.request_timeout_s:
            raise ValueError(
                f"drain_timeout_s ({self.drain_timeout_s:g}) is longer than request_timeout_s "
                f"({self.request_timeout_s:g}), which ends every request first; leave drain_timeout_s empty "
                "or lower it"
            )
        return self

    # -- what Ray Serve LLM receives ------------------------------------------------------------

    def phase(self, name: str) -> PhaseSpec:
        return getattr(self, name)

    def placement_bundles(self, phase: str) -> list[dict[str, float]]:
        spec = self.phase(phase)
        resource = PHASE_RESOURCE.get(phase)
        bundles = []
        for index in range(spec.tensor_parallel_size):
            bundle: dict[str, float] = {"CPU": spec.cpus_per_replica if index == 0 else 1}
            if self.device == "cuda":
                bundle["GPU"] = spec.gpu_fraction
            if resource:
                bundle[resource] = PHASE_RESOURCE_PER_BUNDLE
            bundles.append(bundle)
        return bundles

    def kv_transfer_config(self, phase: str) -> dict[str, Any]:
        kv = self.kv_transfer
        return {
            "kv_connector": kv.connector,
            "kv_connector_module_path": KV_WAIT_MODULE,
            "kv_role": KV_ROLE[phase],
            "kv_buffer_device": kv.buffer_device,
            "kv_load_failure_policy": kv.load_failure_policy,
            "kv_connector_extra_config": {
                "backends": [kv.backend],
                STALL_TIMEOUT_KEY: kv.stall_timeout_s,
                **({"num_threads": kv.nixl_threads} if kv.nixl_threads is not None else {}),
            },
        }

    def engine_kwargs(self, phase: str) -> dict[str, Any]:
        spec = self.phase(phase)
        kwargs: dict[str, Any] = {
            "max_model_len": self.max_model_len,
            "dtype": self.dtype,
            "tensor_parallel_size": spec.tensor_parallel_size,
            # vLLM's default depends on the model and platform; the spec says what every engine does.
            "enable_prefix_caching": self.prefix_caching,
        }
        if self.device == "cuda":
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        if phase in KV_ROLE:
            kwargs["kv_transfer_config"] = self.kv_transfer_config(phase)
        if self.model.streams:
            kwargs["load_format"] = "runai_streamer"
        # Every phase alike: in P/D, prefill renders the request as decode does.
        if self.tool_calling_parser:
            kwargs["enable_auto_tool_choice"] = True
            kwargs["tool_call_parser"] = self.tool_calling_parser
        if self.reasoning_parser:
            kwargs["reasoning_parser"] = self.reasoning_parser
        kwargs.update(spec.engine_kwargs)
        return kwargs

    @property
    def tool_calling_parser(self) -> str | None:
        """The tool-call parser the engines use: the one named, else the model family's; None when off."""
        if self.tool_call_parser is not None:
            return None if self.tool_call_parser == NO_PARSER else self.tool_call_parser
        for family, parser in FAMILY_TOOL_CALL_PARSERS:
            if family.search(self.model.source) or family.search(self.model.model_id):
                return parser
        return None

    def runtime_env(self, phase: str | None = None) -> dict[str, Any]:
        env = dict(self.env_vars)
        if phase:
            env.update(self.phase(phase).env_vars)
        if self.kv_transfer.side_channel_host:
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = self.kv_transfer.side_channel_host
        return {"env_vars": env} if env else {}

    @property
    def selective(self) -> bool:
        """Whether short prompts skip remote prefill (P/D with a ``pd_min_prompt_tokens``)."""
        return self.mode == "disaggregated" and self.pd_min_prompt_tokens > 0

    @property
    def drain_seconds(self) -> float:
        """What a stopped replica may take to finish its requests (``drain_timeout_s``, else the request timeout)."""
        return self.drain_timeout_s if self.drain_timeout_s is not None else self.request_timeout_s

    def model_loading_config(self) -> dict[str, Any]:
        source: Any = {"bucket_uri": self.model.source} if self.model.is_s3 else self.model.source
        return {"model_id": self.model.model_id, "model_source": source}

    def llm_config(self, phase: str) -> dict[str, Any]:
        """The ``ray.serve.llm.LLMConfig`` dict of one phase (``prefill``, ``decode``, ``colocated``)."""
        spec = self.phase(phase)
        config: dict[str, Any] = {
            "model_loading_config": self.model_loading_config(),
            "engine_kwargs": self.engine_kwargs(phase),
            "placement_group_config": {
                "bundles": self.placement_bundles(phase),
                "strategy": "STRICT_PACK" if spec.tensor_parallel_size > 1 else "PACK",
            },
            "deployment_config": {
                "autoscaling_config": {
                    "min_replicas": spec.min_replicas,
                    "max_replicas": spec.max_replicas,
                    "target_ongoing_requests": spec.target_ongoing_requests,
                },
                # The replica's own CPU would be merged into the first bundle; the bundles above
                # already reserve what the engine needs.
                "ray_actor_options": {"num_cpus": 0},
                "graceful_shutdown_timeout_s": self.drain_seconds,
                **({"max_surge_percent": spec.max_surge_percent} if spec.max_surge_percent is not None else {}),
                **self.request_router_config(phase),
            },
            "log_engine_metrics": True,
        }
        if self.device == "cpu":
            config["accelerator_config"] = {"kind": "cpu"}
        runtime_env = self.runtime_env(phase)
        if runtime_env:
            config["runtime_env"] = runtime_env
        experimental = self.experimental_configs(phase)
        if experimental:
            config["experimental_configs"] = experimental
        callback_kwargs: dict[str, Any] = {}
        if phase in KV_ROLE:
            # NIXL's import would close Serve's log handlers in the replica (serve_app/callbacks.py).
            callback_kwargs["kv_transfer"] = True
        if self.model.streams:
            # Ray 2.58 skips its download for a streaming load format and then hands vLLM the model
            # id, not the S3 URI (2.60 resolves it); the callback names the URI in both.
            callback_kwargs["model_uri"] = self.model.source
        if callback_kwargs:
            config["callback_config"] = {"callback_class": ENGINE_CALLBACK, "callback_kwargs": callback_kwargs}
        return config

    def request_router_config(self, phase: str) -> dict[str, Any]:
        """The ``request_router_config`` of a phase's deployment_config, or nothing for Serve's default."""
        spec = self.phase(phase)
        router_class = REQUEST_ROUTER_CLASSES[spec.request_router]
        if router_class is None:
            return {}
        config: dict[str, Any] = {"request_router_class": router_class}
        if kwargs := spec.request_router_kwargs():
            config["request_router_kwargs"] = kwargs
        return {"request_router_config": config}

    def side_channel_port(self, phase: str) -> int:
        """The first NIXL handshake port of a phase's engines (Ray adds a per-replica offset)."""
        offset = DECODE_SIDE_CHANNEL_OFFSET if phase == "decode" else 0
        return self.kv_transfer.side_channel_port_base + offset

    def experimental_configs(self, phase: str) -> dict[str, Any]:
        """Ray Serve LLM's ``LLMConfig.experimental_configs`` of a phase (keys read by Ray 2.58 and 2.60)."""
        experimental: dict[str, Any] = {"stream_batching_interval_ms": self.stream_batching_interval_ms}
        if phase in KV_ROLE:
            experimental["NIXL_SIDE_CHANNEL_PORT_BASE"] = self.side_channel_port(phase)
        if phase == "decode" and self.prewarm_nixl:
            experimental[PREWARM_KEY] = True
        if phase == "decode" and self.pd_tokenize_once:
            experimental["pd_tokenize_once"] = True
        if phase == "decode" and self.pd_min_prompt_tokens:
            experimental[SELECTIVE_THRESHOLD_KEY] = self.pd_min_prompt_tokens
            experimental[SELECTIVE_CAP_KEY] = self.pd_max_local_prefill_tokens
        return experimental

    def builder_args(self) -> tuple[str, dict[str, Any]]:
        """(Ray builder name, its argument dict) for this spec's mode."""
        # The ingress only proxies HTTP, but every request passes through it: never on the head (no
        # CPU, no phase resource), whose restart would cut every stream. In P/D it sits beside decode,
        # the phase it calls, on a sliver of the phase resource (decode's bundles leave most of it);
        # colocated, on any node with a CPU to spare, which the head has none of.
        placement = (
            {"num_cpus": 0, "resources": {PHASE_RESOURCE["decode"]: PHASE_RESOURCE_PER_BUNDLE}}
            if self.mode == "disaggregated"
            else {"num_cpus": INGRESS_CPUS}
        )
        # A stopped ingress replica drains its streams as long as the engines behind it do.
        ingress: dict[str, Any] = {
            "ingress_deployment_config": {
                "ray_actor_options": placement,
                "graceful_shutdown_timeout_s": self.drain_seconds,
            }
        }
        if self.api_key_dir:
            ingress["ingress_cls_config"] = {
                "ingress_cls": KEYED_INGRESS,
                "ingress_extra_kwargs": {
                    "api_key_dir": self.api_key_dir,
                    **({"cache_salt_file": self.cache_salt_file} if self.cache_salt_file else {}),
                },
            }
        if self.mode == "disaggregated":
            return "build_pd_openai_app", {
                "prefill_config": self.llm_config("prefill"),
                "decode_config": self.llm_config("decode"),
                **ingress,
            }
        return "build_openai_app", {"llm_configs": [self.llm_config("colocated")], **ingress}


def load_spec(path: str) -> ServingSpec:
    """Reads a serving spec from YAML (a file whose top level is the spec)."""
    import yaml

    with open(path) as handle:
        return ServingSpec.model_validate(yaml.safe_load(handle))
