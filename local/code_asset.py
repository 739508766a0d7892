"""The synthesized serve_app asset, published by the CDK CLI to an S3-compatible server on loopback.

On the cluster, Ray fetches ``serve_app`` from the ``s3://`` working_dir that the RayService's
``serveConfigV2`` names: the zip that ``cdk deploy`` uploaded. This module reproduces that path on
one machine, with the real parts:

- ``moto`` in server mode on 127.0.0.1 stands in for S3 (plus the STS and SSM calls the CLI makes);
- :func:`bootstrap` leaves what ``cdk bootstrap`` would: the assets bucket and its version parameter;
- :func:`publish_assets` runs the CDK CLI's own ``cdk publish-assets`` on the cloud assembly, so
  the zip is packaged by the same code that ``cdk deploy`` uses;
- :func:`working_dir` reads the URI back out of the synthesized RayService.

Processes given :attr:`LocalS3.env` (Ray's runtime_env agent among them) download from it with
boto3, as Ray does on the cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CDK_CLI = ROOT / "node_modules" / ".bin" / "cdk"
BOOTSTRAP_QUALIFIER = "hnb659fds"
# What `cdk bootstrap` version 30 records; the CLI refuses to publish into an unbootstrapped account.
BOOTSTRAP_VERSION = "30"


@dataclass
class LocalS3:
    """An S3-compatible server (moto) on loopback, for as long as the ``with`` block runs.

    Moto keeps its state per process, not per server: each server starts from an empty state so
    that one ``with`` block never sees what an earlier one left. Run one at a time per process.
    """

    region: str = "us-east-2"
    server: object | None = field(default=None, repr=False)
    endpoint: str = ""

    def __enter__(self) -> LocalS3:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        urllib.request.urlopen(
            urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=10
        ).close()
        return self

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    @property
    def env(self) -> dict[str, str]:
        """Environment that points the AWS SDKs (boto3 and the CDK CLI's) at this server only."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, service: str, *, account: str | None = None):
        """A boto3 client of this server, acting in ``account`` (moto's default account if None)."""
        import boto3

        kwargs = {
            "endpoint_url": self.endpoint,
            "region_name": self.region,
            "aws_access_key_id": "local",
            "aws_secret_access_key": "local",
        }
        if account:
            role = f"arn:aws:iam::{account}:role/cdk-{BOOTSTRAP_QUALIFIER}-file-publishing-role-{account}-{self.region}"
            credentials = boto3.client("sts", **kwargs).assume_role(RoleArn=role, RoleSessionName="local-bootstrap")[
                "Credentials"
            ]
            kwargs.update(
                aws_access_key_id=credentials["AccessKeyId"],
                aws_secret_access_key=credentials["SecretAccessKey"],
                aws_session_token=credentials["SessionToken"],
            )
        return boto3.client(service, **kwargs)


def assets_bucket(account: str, region: str) -> str:
    return f"cdk-{BOOTSTRAP_QUALIFIER}-assets-{account}-{region}"


def bootstrap(s3: LocalS3, account: str) -> None:
    """The assets bucket and the bootstrap version parameter that `cdk bootstrap` would create."""
    for acting_as in (None, account):  # the CLI reads the parameter before and after assuming roles
        s3.client("ssm", account=acting_as).put_parameter(
            Name=f"/cdk-bootstrap/{BOOTSTRAP_QUALIFIER}/version", Value=BOOTSTRAP_VERSION, Type="String", Overwrite=True
        )
    s3.client("s3", account=account).create_bucket(
        Bucket=assets_bucket(account, s3.region), CreateBucketConfiguration={"LocationConstraint": s3.region}
    )


def publish_assets(s3: LocalS3, cloud_assembly: Path, timeout: float = 300) -> None:
    """Runs the CDK CLI's ``publish-assets`` on a synthesized cloud assembly, against ``s3`` only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        s3.env,
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        CDK_DISABLE_CLI_TELEMETRY="true",
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
    )
    done = subprocess.run(
        [
            str(CDK_CLI),
            "publish-assets",
            "--unstable=publish-assets",
            "--app",
            str(cloud_assembly),
            "--no-notices",
            "--no-version-reporting",
            "--concurrency",
            "2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cdk publish-assets failed:\n{(done.stdout + done.stderr)[-3000:]}")


def rayservice_manifest(cloud_assembly: Path, stack_name: str) -> dict:
    """The RayService exactly as the synthesized template hands it to the cluster."""
    template = json.loads((cloud_assembly / f"{stack_name}.template.json").read_text())
    for resource in template["Resources"].values():
        if resource["Type"] != "Custom::AWSCDK-EKS-KubernetesResource":
            continue
        manifest = resource["Properties"]["Manifest"]
        if not isinstance(manifest, str):
            continue  # a manifest with tokens; the RayService has none with an explicit environment
        for item in json.loads(manifest):
            if item.get("kind") == "RayService":
                return item
    raise LookupError(f"no RayService in {stack_name}.template.json")


def working_dir(cloud_assembly: Path, stack_name: str) -> str:
    """The ``s3://`` working_dir of the serve application, read from the synthesized RayService."""
    serve_config = yaml.safe_load(rayservice_manifest(cloud_assembly, stack_name)["spec"]["serveConfigV2"])
    (application,) = serve_config["applications"]
    return application["runtime_env"]["working_dir"]


def synthesize(config_path: Path, outdir: Path, timeout: float = 600) -> None:
    """`cdk synth` of an environment through the CDK CLI, offline, as `make synth` runs it."""
    env = {**os.environ, "CDK_DISABLE_CLI_TELEMETRY": "true", "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    done = subprocess.run(
        [
            str(CDK_CLI),
            "synth",
            "--app",
            f"{sys.executable} app.py",
            "-c",
            f"config={config_path}",
            "--no-notices",
            "--no-version-reporting",
            "--quiet",
            "--output",
            str(outdir),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cdk synth of {config_path} failed:\n{done.stderr[-3000:]}")
