"""Shared fixtures: synthesizing an environment is the slow part, so each one is synthesized once."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

# The split by cost (pytest.ini's markers): a test that runs one of these programs carries
# `consumer`, so that `make test-unit` leaves it to `make test-consumers` and `make test`. They take
# seconds each (a Node.js CLI, a scanner loading its rules, jsii and aws-cdk-lib loaded afresh by a
# new app.py); a test that starts one without the marker fails, naming it, instead of slowing the
# fast tier unseen.
CONSUMER_PROGRAMS = {"cdk": "the CDK CLI", "checkov": "checkov", "cfn-guard": "cfn-guard", "helm": "Helm"}
COST_MARKERS = ("consumer", "live", "serving")


def consumer_program(args) -> str | None:
    """What a command line starts of CONSUMER_PROGRAMS, pip (or venv) and app.py, or None."""
    if isinstance(args, (str, bytes, os.PathLike)):
        args = [args]
    argv = [os.fsdecode(a) for a in args]
    if not argv:
        return None
    name = Path(argv[0]).name
    if name in CONSUMER_PROGRAMS:
        return CONSUMER_PROGRAMS[name]
    if name in ("pip", "pip3") or argv[1:3] in (["-m", "pip"], ["-m", "venv"]):
        return "pip"
    if any(Path(arg).name == "app.py" for arg in argv[1:]):
        return "app.py in a new interpreter"
    return None


_running: list[pytest.Item] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Which test is running, its fixtures' set-up and tear-down included (for the guard below)."""
    _running.append(item)
    try:
        yield
    finally:
        _running.pop()


class _GuardedPopen(subprocess.Popen):
    """subprocess.Popen (and so subprocess.run) refusing a consumer's program in an unmarked test."""

    def __init__(self, args, *rest, **kwargs):
        test = _running[-1] if _running else None
        program = consumer_program(args)
        if program and test is not None and not any(test.get_closest_marker(m) for m in COST_MARKERS):
            pytest.fail(
                f"{test.nodeid} runs {program}: mark it @pytest.mark.consumer "
                "(make test-unit leaves such tests to make test-consumers and make test)",
                pytrace=False,
            )
        super().__init__(args, *rest, **kwargs)


_POPEN = subprocess.Popen


def pytest_configure(config):
    subprocess.Popen = _GuardedPopen  # type: ignore[misc]


def pytest_unconfigure(config):
    subprocess.Popen = _POPEN  # type: ignore[misc]


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CONFIG_DIR = ROOT / "config"
# KubeRay 1.7.0's RayService CRD, vendored so the schema tests run in any clone.
RAYSERVICE_CRD = ROOT / "tests" / "fixtures" / "kuberay-crds" / "ray.io_rayservices.yaml"
RAYSERVICE_CRD_SHA256 = "0a8fc325e6e22b9231c1f282b309555e2ecf94227ca20a03df3d1d9a403907ab"
SHIPPED_ENVIRONMENTS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if not p.stem.startswith("local"))


def checked_schema_validator(schema: dict):
    """A validator of ``schema``, the schema itself checked once here: jsonschema.validate checks it
    again on every call, which takes seconds for a CRD's schema."""
    import jsonschema

    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema)


def best_schema_error(validator, instance):
    """What jsonschema.validate would raise for ``instance`` (its best-matching error), or None."""
    import jsonschema

    return jsonschema.exceptions.best_match(validator.iter_errors(instance))


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory):
    """Synthesize an environment by name (once per session) and return (config, stack, template)."""
    from aws_cdk.assertions import Template

    from app import build_app

    cache: dict[str, tuple] = {}

    def get(env: str):
        if env not in cache:
            outdir = tmp_path_factory.mktemp(f"cdk-{env}")
            app = build_app(str(CONFIG_DIR / f"{env}.yaml"), outdir=str(outdir))
            stack = app.node.children[0]
            cache[env] = (stack.config, stack, Template.from_stack(stack), app, outdir)
        return cache[env]

    return get


@pytest.fixture
def dev_data():
    import yaml

    return yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())


def with_changes(data: dict, changes: dict) -> dict:
    """A copy of a config (as a dict) with dotted keys ("serving.mode") set to new values."""
    import copy

    data = copy.deepcopy(data)
    for path, value in changes.items():
        target = data
        *parents, leaf = path.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    return data


# Stands in for the ElastiCache primary endpoint (a CloudFormation token at synth).
GCS_STORE_HOST = "master.pd-gcs.abc123.use2.cache.amazonaws.com"


def rendered_ray_service(config, working_dir: str = "s3://bucket/code.zip") -> dict:
    """The RayService manifest of a config, rendered as the construct renders it."""
    from manifests.contract import RAY_HEAD_SERVICE_ACCOUNT, RAY_WORKER_SERVICE_ACCOUNT
    from manifests.ray_service import ray_service
    from serve_app.serve_config import serve_config_yaml

    return ray_service(
        config,
        serve_config_v2=serve_config_yaml(config.serving, working_dir=working_dir),
        head_service_account=RAY_HEAD_SERVICE_ACCOUNT,
        worker_service_account=RAY_WORKER_SERVICE_ACCOUNT,
        gcs_store_host=GCS_STORE_HOST if config.gcs_fault_tolerant else None,
    )


def synth_variant(tmp_path, data: dict, name: str, facts=None):
    """Synthesizes a variant of a config (as a dict) and returns (stack, template); ``facts``
    (DeployFacts) as `make deploy` passes them."""
    import yaml
    from aws_cdk.assertions import Template

    from app import build_app

    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    facts_path = None
    if facts is not None:
        facts_path = tmp_path / f"{name}-deploy-facts.json"
        facts_path.write_text(facts.model_dump_json(exclude_defaults=True))
    stack = build_app(
        str(path), outdir=str(tmp_path / f"{name}-out"), deploy_facts=str(facts_path) if facts_path else None
    ).node.children[0]
    return stack, Template.from_stack(stack)


@pytest.fixture(scope="session")
def variant(tmp_path_factory):
    """Synthesizes a named variant of a config (as a dict) once per session, for every test that
    asks for the same name with the same data (and deploy facts); returns (stack, template, outdir)."""
    cache: dict[str, tuple[dict, tuple]] = {}

    def get(name: str, data: dict, facts=None):
        if name in cache:
            built_from, built = cache[name]
            assert built_from == (data, facts), f"variant {name!r} asked for with two different configs"
            return built
        folder = tmp_path_factory.mktemp(f"variant-{name}")
        stack, template = synth_variant(folder, data, name, facts)
        cache[name] = ((data, facts), (stack, template, folder / f"{name}-out"))
        return cache[name][1]

    return get


@contextmanager
def loopback_http_server(handler):
    """Serves ``handler`` (an http.server request handler class) on 127.0.0.1 at a free port for the
    block; yields its base URL (no trailing slash) and stops it, its thread joined, after."""
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def network_and_cluster(stack, config):
    """The VPC and the EKS cluster of ``config`` in ``stack``, as the stack wires them (no deploy facts)."""
    from cdk_constructs.cluster import EksCluster
    from cdk_constructs.log_groups import EncryptedLogs
    from cdk_constructs.network import Network
    from config.schema import DeployFacts

    network = Network(stack, "Network", config=config.network, logs=EncryptedLogs(stack, "Logs", description="unit"))
    eks_cluster = EksCluster(
        stack,
        "Eks",
        config=config.cluster,
        cluster_name="unit",
        vpc=network.vpc,
        subnets=network.private_subnets,
        deployer=DeployFacts(),
        logs=stack.node.find_child("Logs"),
    )
    return network, eks_cluster
