"""``serve_app.app:build_app`` is the import path of the Serve application.

Ray Serve calls it with the ``args`` of the Serve config, which are a :class:`ServingSpec`.
"""

from __future__ import annotations

import os
from typing import Any

from serve_app.spec import ServingSpec


def resolve_hf_token(spec: ServingSpec) -> None:
    """Puts a gated model's Hugging Face token into this process's environment.

    The token lives in AWS Secrets Manager and is read here, on the cluster, with the pod's
    EKS Pod Identity credentials; Ray Serve LLM forwards ``HF_TOKEN`` to the engine replicas.
    Nothing secret is ever part of the serve config or a CloudFormation template.
    """
    secret = spec.model.hf_token_secret
    if not secret or os.environ.get("HF_TOKEN"):
        return
    import boto3

    value = boto3.client("secretsmanager").get_secret_value(SecretId=secret)["SecretString"]
    os.environ["HF_TOKEN"] = value.strip()


def build_app(args: dict[str, Any]):
    """Returns the Ray Serve application for ``args`` (a :class:`ServingSpec` as a dict)."""
    from ray.serve import llm

    spec = ServingSpec.model_validate(args)
    resolve_hf_token(spec)
    builder_name, builder_args = spec.builder_args()
    return getattr(llm, builder_name)(builder_args)
