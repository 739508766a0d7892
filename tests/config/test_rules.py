"""AppConfig's cross-field rules (config/schema/rules.py): each called on the dev config with one
change, and each refused through parse_config with the message it gave as a model validator."""

from __future__ import annotations

import pytest
import yaml

from config.loader import load_config, parse_config
from config.schema import rules
from tests.config.helpers import changed, dev_config, problems_for
from tests.conftest import CONFIG_DIR, SHIPPED_ENVIRONMENTS, with_changes

TOKEN_ARN = "arn:aws:secretsmanager:us-west-2:000000000000:secret:hf-token-AbCdEf"
S3_MODEL = {"model_id": "q", "source": "s3://my-models/qwen", "hub_id": "Qwen/Qwen2.5-7B-Instruct"}

ZONES = (
    "network.availability_zones ['us-east-2a', 'us-east-2b'] are not in aws.region us-west-2; use zones such as "
    "us-west-2a, us-west-2b"
)
WORLD_OPEN = (
    "cluster.endpoint.public_cidrs contains 0.0.0.0/0 in a production environment; list your own CIDRs or set "
    "cluster.endpoint.public: false"
)
NO_NAT = (
    "network.nat_gateways is 0, but the Helm charts come from public chart repositories and the device plugins' "
    "and KubeRay's images from nvcr.io, quay.io and other regions' ECR, which no VPC endpoint reaches; set "
    "nat_gateways: 1"
)
S3_NO_REGION = (
    "serving.model.source_region: required for an S3 source other than the stack's mirror (my-models): an s3:// "
    "URI carries no region; set it (it must be us-east-2)"
)
S3_OTHER_REGION = (
    "serving.model.source s3://my-models/qwen is in us-west-2, not us-east-2: every new replica would pull the "
    "weights across regions (slow, paid per GB); mirror the model into us-east-2 (model_mirror, make mirror-model)"
)
MIRROR_NAME = (
    f"model_mirror.bucket_name: the derived name '{'a' * 40}-models-000000000000-us-east-2' is one S3 refuses "
    "(use 3-63 characters); set model_mirror.bucket_name"
)
SURGE = (
    "serving.{phase}.max_surge_percent needs Ray 2.60 or newer (Serve starts replacements before it stops old "
    "replicas from 2.60 on; 2.58 silently ignores the key), but ray_service.ray_version is 2.58.0: remove it, or "
    "use an image with Ray 2.60+ and set ray_version"
)
TOKEN_REGION = (
    f"serving.model.hf_token_secret {TOKEN_ARN} is in us-west-2; the pods read it in us-east-2: use a secret in "
    "us-east-2 (or a replica of it there)"
)
AMP_INTERVAL = (
    "observability.scrape_interval_seconds=15, but Amazon Managed Prometheus scrapers refuse intervals under 30 s; "
    "use 30 or 60"
)
SERVING_MISFITS = {
    "cpu": (
        {"serving.device": "cpu"},
        "serving.device is cpu, which only `make local` runs; the cluster needs device: cuda",
    ),
    "tp": (
        {"serving.decode.tensor_parallel_size": 2},
        "serving.decode.tensor_parallel_size=2 needs more GPUs than g6.8xlarge has (1); lower it or use a larger "
        "instance type",
    ),
    "buffer": (
        {"serving.kv_transfer.buffer_device": "cuda"},
        "serving.kv_transfer.buffer_device is cuda but g6.8xlarge has no GPUDirect RDMA; set buffer_device: cpu "
        "(KV staged in host memory)",
    ),
    "replicas": (
        {"serving.prefill.max_replicas": 3},
        "serving.prefill.max_replicas=3 can never be scheduled: the node group holds at most 2 replicas of TP 1; "
        "lower max_replicas or raise the node group's max_size",
    ),
}


def dev_data() -> dict:
    return yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())


def refused(changes: dict) -> str:
    """The whole message parse_config gives the dev config (as a dict) with ``changes`` (dotted keys)."""
    return problems_for(with_changes(dev_data(), changes))


def top_level(message: str) -> str:
    """How the loader reports a rule's problem: it belongs to no single field."""
    return f"test.yaml: (top level): {message}"


def with_fields(config, changes: dict):
    """``config`` with several fields (dotted paths) changed, not validated."""
    for path, value in changes.items():
        config = changed(config, path, value)
    return config


# The order and the shipped configs ----------------------------------------------------------------


def test_rules_run_in_the_order_the_validators_ran():
    assert [rule.__name__ for rule in rules.RULES] == [
        "zones_in_region",
        "image_registry_in_region",
        "production_endpoint",
        "egress_for_charts_and_images",
        "s3_source_in_region",
        "mirror_name",
        "surge_needs_ray_2_60",
        "router_in_the_images_ray",
        "token_secret_in_region",
        "api_key_secrets_in_region",
        "amp_scrape_interval",
        "deletion_delay_outlives_requests",
        "gcs_fault_tolerance_has_a_store",
        "serving_fits_node_groups",
    ]


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_shipped_configs_break_no_rule(env):
    config = load_config(CONFIG_DIR / f"{env}.yaml")
    assert [rule.__name__ for rule in rules.RULES if rule(config)] == []
    assert rules.first_problem(config) is None


@pytest.mark.parametrize(
    ("changes", "first"),
    [
        ({"aws.region": "us-west-2", "network.nat_gateways": 0, "serving.device": "cpu"}, ZONES),
        (
            {
                "network.nat_gateways": 0,
                "observability.scrape_interval_seconds": 15,
                "serving.prefill.max_replicas": 3,
            },
            NO_NAT,
        ),
    ],
    ids=["zones-before-egress-and-serving", "egress-before-amp-and-serving"],
)
def test_a_config_breaking_several_rules_gets_the_first_ones_message(changes, first):
    assert refused(changes) == top_level(first)


def test_first_problem_is_that_of_the_earliest_rule():
    config = with_fields(dev_config(), {"aws.region": "us-west-2", "network.nat_gateways": 0})
    assert rules.egress_for_charts_and_images(config) == NO_NAT
    assert rules.first_problem(config) == ZONES


# zones_in_region ------------------------------------------------------------------------------------


def test_zones_in_region():
    assert rules.zones_in_region(dev_config()) is None
    assert rules.zones_in_region(changed(dev_config(), "aws.region", "us-west-2")) == ZONES


def test_zones_in_region_refused_by_parse_config():
    assert refused({"aws.region": "us-west-2"}) == top_level(ZONES)
    message = refused(
        {"network.availability_zones": ["us-west-2a", "us-west-2b"], "network.gpu_availability_zone": "us-west-2a"}
    )
    assert "are not in aws.region us-east-2" in message


# production_endpoint --------------------------------------------------------------------------------


@pytest.mark.parametrize("everyone", ["0.0.0.0/0", "::/0"])
def test_production_endpoint(everyone):
    open_dev = changed(dev_config(), "cluster.endpoint.public_cidrs", [everyone])
    assert rules.production_endpoint(open_dev) is None  # not production
    assert rules.production_endpoint(changed(open_dev, "production", True)) == WORLD_OPEN
    private = with_fields(open_dev, {"production": True, "cluster.endpoint.public": False})
    assert rules.production_endpoint(private) is None


def test_production_endpoint_refused_by_parse_config():
    assert refused({"production": True, "cluster.endpoint.public_cidrs": ["0.0.0.0/0"]}) == top_level(WORLD_OPEN)


# egress_for_charts_and_images -----------------------------------------------------------------------


def test_egress_for_charts_and_images():
    assert rules.egress_for_charts_and_images(dev_config()) is None
    assert rules.egress_for_charts_and_images(changed(dev_config(), "network.nat_gateways", 0)) == NO_NAT


@pytest.mark.parametrize("model_source", ["Qwen/Qwen2.5-7B-Instruct", "s3://my-models/qwen"])
def test_egress_for_charts_and_images_refused_by_parse_config(model_source):
    changes = {
        "network.nat_gateways": 0,
        "network.interface_endpoints": ["ecr.api", "ecr.dkr", "sts", "eks", "eks-auth", "logs"],
        "serving.model.source": model_source,
    }
    (line,) = [line for line in refused(changes).splitlines() if "nat_gateways" in line]
    assert line == top_level(NO_NAT)
    assert refused({"network.nat_gateways": 0}) == top_level(NO_NAT)


# s3_source_in_region --------------------------------------------------------------------------------


def test_s3_source_in_region():
    s3 = changed(dev_config(), "serving.model.source", "s3://my-models/qwen")
    assert rules.s3_source_in_region(dev_config()) is None  # a Hugging Face source
    assert rules.s3_source_in_region(s3) == S3_NO_REGION
    assert rules.s3_source_in_region(changed(s3, "serving.model.source_region", "us-west-2")) == S3_OTHER_REGION
    assert rules.s3_source_in_region(changed(s3, "serving.model.source_region", "us-east-2")) is None
    mirrored = changed(dev_config(), "model_mirror.enabled", True)
    in_mirror = changed(mirrored, "serving.model.source", f"s3://{mirrored.mirror_bucket}/qwen")
    assert rules.s3_source_in_region(in_mirror) is None  # the stack's own mirror is in its region


def test_s3_source_in_region_refused_by_parse_config():
    assert refused({"serving.model": S3_MODEL}) == top_level(S3_NO_REGION)
    assert refused({"serving.model": {**S3_MODEL, "source_region": "us-west-2"}}) == top_level(S3_OTHER_REGION)


# mirror_name ----------------------------------------------------------------------------------------


def test_mirror_name():
    long_name = changed(dev_config(), "name", "a" * 40)
    assert rules.mirror_name(long_name) is None  # no mirror
    assert rules.mirror_name(changed(long_name, "model_mirror.enabled", True)) == MIRROR_NAME
    named = with_fields(long_name, {"model_mirror.enabled": True, "model_mirror.bucket_name": "my-models"})
    assert rules.mirror_name(named) is None
    assert rules.mirror_name(changed(dev_config(), "model_mirror.enabled", True)) is None


def test_mirror_name_refused_by_parse_config():
    assert refused({"name": "a" * 40, "model_mirror.enabled": True}) == top_level(MIRROR_NAME)


# surge_needs_ray_2_60 -------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["prefill", "decode", "colocated"])
def test_surge_needs_ray_2_60(phase):
    surge = changed(dev_config(), f"serving.{phase}.max_surge_percent", 50)
    assert rules.surge_needs_ray_2_60(dev_config()) is None
    assert rules.surge_needs_ray_2_60(surge) == SURGE.format(phase=phase)
    assert rules.surge_needs_ray_2_60(changed(surge, "ray_service.ray_version", "2.60.0")) is None


def test_surge_needs_ray_2_60_refused_by_parse_config():
    assert refused({"serving.prefill.max_surge_percent": 50}) == top_level(SURGE.format(phase="prefill"))
    assert refused({"serving.colocated.max_surge_percent": 50}) == top_level(SURGE.format(phase="colocated"))


# token_secret_in_region -----------------------------------------------------------------------------


def test_token_secret_in_region():
    assert rules.token_secret_in_region(dev_config()) is None
    assert (
        rules.token_secret_in_region(changed(dev_config(), "serving.model.hf_token_secret", TOKEN_ARN)) == TOKEN_REGION
    )
    by_name = changed(dev_config(), "serving.model.hf_token_secret", "hf-token")
    assert rules.token_secret_in_region(by_name) is None  # a name is looked up in the cluster's region
    here = TOKEN_ARN.replace("us-west-2", "us-east-2")
    assert rules.token_secret_in_region(changed(dev_config(), "serving.model.hf_token_secret", here)) is None


def test_token_secret_in_region_refused_by_parse_config():
    assert refused({"serving.model.hf_token_secret": TOKEN_ARN}) == top_level(TOKEN_REGION)


# amp_scrape_interval --------------------------------------------------------------------------------


def test_amp_scrape_interval():
    fast = changed(dev_config(), "observability.scrape_interval_seconds", 15)
    assert dev_config().observability.backend == "amp"
    assert rules.amp_scrape_interval(dev_config()) is None
    assert rules.amp_scrape_interval(fast) == AMP_INTERVAL
    assert rules.amp_scrape_interval(changed(fast, "observability.backend", "cloudwatch")) is None


def test_amp_scrape_interval_refused_by_parse_config():
    assert refused({"observability": {"backend": "amp", "scrape_interval_seconds": 15}}) == top_level(AMP_INTERVAL)
    parse_config(with_changes(dev_data(), {"observability": {"backend": "cloudwatch", "scrape_interval_seconds": 15}}))


# serving_fits_node_groups ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", SERVING_MISFITS, ids=list(SERVING_MISFITS))
def test_serving_fits_node_groups(case):
    changes, message = SERVING_MISFITS[case]
    assert rules.serving_fits_node_groups(dev_config()) is None
    assert rules.serving_fits_node_groups(with_fields(dev_config(), changes)) == message


@pytest.mark.parametrize("case", SERVING_MISFITS, ids=list(SERVING_MISFITS))
def test_serving_fits_node_groups_refused_by_parse_config(case):
    changes, message = SERVING_MISFITS[case]
    assert refused(changes) == top_level(message)


def test_colocated_replicas_count_both_groups():
    colocated = with_fields(dev_config(), {"serving.mode": "colocated", "serving.colocated.max_replicas": 4})
    assert rules.serving_fits_node_groups(colocated) is None  # 2 nodes of each group, one replica per node
    too_many = changed(colocated, "serving.colocated.max_replicas", 5)
    assert rules.serving_fits_node_groups(too_many) == (
        "serving.colocated.max_replicas=5 can never be scheduled: the node group holds at most 4 replicas of TP 1; "
        "lower max_replicas or raise the node group's max_size"
    )


# deletion_delay_outlives_requests -------------------------------------------------------------------


def test_deletion_delay_outlives_requests():
    config = dev_config()
    assert config.ray_service.cluster_deletion_delay_seconds is None
    assert config.deletion_delay_seconds == 660  # the request timeout (600 s) and a minute
    assert rules.deletion_delay_outlives_requests(config) is None
    short = changed(config, "ray_service.cluster_deletion_delay_seconds", 120)
    assert rules.deletion_delay_outlives_requests(short) == (
        "ray_service.cluster_deletion_delay_seconds is 120, shorter than serving.request_timeout_s (600): a "
        "NewCluster upgrade would cut requests Serve still allows when it deletes the old cluster; set it to at "
        "least 600, or leave it out (600 + 60)"
    )
    assert (
        rules.deletion_delay_outlives_requests(changed(config, "ray_service.cluster_deletion_delay_seconds", 600))
        is None
    )


def test_deletion_delay_outlives_requests_refused_by_parse_config():
    message = refused({"ray_service.cluster_deletion_delay_seconds": 120})
    assert message == top_level(
        rules.deletion_delay_outlives_requests(changed(dev_config(), "ray_service.cluster_deletion_delay_seconds", 120))
    )
