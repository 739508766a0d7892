"""What a run can take from S3, as the cluster does: the code asset and the model's weights.

One S3-compatible server on loopback (moto, local/code_asset.py) serves both; this process and the
Ray processes it starts are pointed at it through the environment.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

from local.errors import StartupFailure
from local.paths import RUN_DIR
from serve_app.spec import ServingSpec

LOCAL_MODEL_BUCKET = "local-models"


def loopback_s3(stack: ExitStack, asset_config=None):
    """One S3-compatible server on loopback for whatever the run takes from S3 (code, weights), in
    the code asset's region (``asset_config``); this process and the Ray processes it starts are
    pointed at it."""
    from local.code_asset import LocalS3

    s3 = stack.enter_context(LocalS3(region=asset_config.aws.region) if asset_config else LocalS3())
    # The streamer's S3 client (AWS CRT) and its file listing (boto3) read these; moto wants path-style URLs.
    os.environ.update(s3.env, RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0")
    return s3


def published_code(config_path: str, config, s3) -> str:
    """Synthesizes ``config_path`` (loaded as ``config``) and publishes its assets to the loopback
    S3 with the CDK CLI; returns the working_dir the RayService would name."""
    from local.code_asset import bootstrap, publish_assets, synthesize, working_dir

    outdir = RUN_DIR / "asset-cdk.out"
    synthesize(Path(config_path).resolve(), outdir)
    bootstrap(s3, config.aws.account)
    publish_assets(s3, outdir)
    return working_dir(outdir, config.stack_name)


def streamed_spec(spec: ServingSpec, uri: str) -> ServingSpec:
    """``spec`` with its model streamed from ``uri`` by vLLM's Run:ai Model Streamer."""
    data = spec.model_dump()
    data["model"].update(source=uri, load_format="runai_streamer")
    return ServingSpec.model_validate(data)


def streamed_model(spec: ServingSpec, s3) -> ServingSpec:
    """The tiny model mirrored into the loopback S3 by the mirror Job's own script; the spec then
    names its s3:// URI, which the engines stream with vLLM's Run:ai Model Streamer."""
    from mirror.job import mirror

    client = s3.client("s3")
    client.create_bucket(Bucket=LOCAL_MODEL_BUCKET, CreateBucketConfiguration={"LocationConstraint": s3.region})
    prefix = spec.model.model_id
    if mirror(
        bucket=LOCAL_MODEL_BUCKET, prefix=prefix, from_dir=Path(spec.model.source), s3=client, out=lambda _: None
    ):
        raise StartupFailure("the tiny model could not be mirrored into the loopback S3")
    return streamed_spec(spec, f"s3://{LOCAL_MODEL_BUCKET}/{prefix}")
