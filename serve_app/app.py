"""``serve_app.app:build_app`` is the import path of the Serve application.

Ray Serve calls it with the ``args`` of the Serve config, which are a :class:`ServingSpec`.
A gated model's token is not this function's business: it is mounted as a file in every Ray pod
and named by ``HF_TOKEN_PATH`` (cdk_constructs/hf_token.py), so no secret is ever put in an
environment that Ray would copy into task runtime_envs.
"""

from __future__ import annotations

from typing import Any

from serve_app.spec import ServingSpec


def build_app(args: dict[str, Any]):
    """Returns the Ray Serve application for ``args`` (a :class:`ServingSpec` as a dict)."""
    from ray.serve import llm

    spec = ServingSpec.model_validate(args)
    builder_name, builder_args = spec.builder_args()
    if spec.selective:
        from serve_app.selective import build_selective_pd_app

        return build_selective_pd_app(builder_args)
    if spec.mode == "disaggregated":
        from serve_app.pd_decode import build_pd_app

        # Prefill's request must be valid wherever the client's is, and decode's start must not wait
        # for prefill (serve_app/pd_decode.py).
        return build_pd_app(builder_args, background_prewarm=spec.prewarm_nixl)
    return getattr(llm, builder_name)(builder_args)
