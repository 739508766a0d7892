"""The config schema: shipped files load, and each mistake gets a message naming field and fix."""

from __future__ import annotations

import copy
import datetime as dt

import pytest

from config import versions
from config.loader import ConfigError, config_path_for, load_config, parse_config
from tests.conftest import CONFIG_DIR, SHIPPED_ENVIRONMENTS


def problems_for(data: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="test.yaml")
    return str(caught.value)


def test_shipped_environments_exist():
    assert {"dev", "prod"} <= set(SHIPPED_ENVIRONMENTS)


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_every_shipped_config_loads(env):
    config = load_config(CONFIG_DIR / f"{env}.yaml")
    assert config.network.gpu_availability_zone in config.network.availability_zones
    assert config.cluster.kubernetes_version == versions.DEFAULT_KUBERNETES_VERSION


def test_models_are_frozen(dev_data):
    config = parse_config(dev_data)
    with pytest.raises(Exception):
        config.name = "other"  # type: ignore[misc]


def test_gpu_zone_outside_vpc_zones(dev_data):
    dev_data["network"]["gpu_availability_zone"] = "us-east-2c"
    message = problems_for(dev_data)
    assert "network: gpu_availability_zone 'us-east-2c' is not one of availability_zones" in message
    assert "pick one of those or add it" in message


def test_instance_type_without_efa(dev_data):
    dev_data["cluster"]["gpu_node_groups"]["decode"]["instance_type"] = "g6.xlarge"
    message = problems_for(dev_data)
    assert "cluster.gpu_node_groups.decode.instance_type: g6.xlarge does not support EFA" in message
    assert "g6.8xlarge" in message


def test_unknown_instance_type(dev_data):
    dev_data["cluster"]["gpu_node_groups"]["prefill"]["instance_type"] = "x9.huge"
    message = problems_for(dev_data)
    assert "cluster.gpu_node_groups.prefill.instance_type: 'x9.huge' is not in the instance table" in message


def test_cpu_instance_type_for_gpu_group(dev_data):
    dev_data["cluster"]["gpu_node_groups"]["prefill"]["instance_type"] = "m7i.xlarge"
    assert "m7i.xlarge has no GPU" in problems_for(dev_data)


@pytest.mark.parametrize("version", ["1.30", "1.31"])
def test_kubernetes_version_eks_no_longer_creates(dev_data, version):
    dev_data["cluster"]["kubernetes_version"] = version
    message = problems_for(dev_data)
    assert f"EKS no longer creates Kubernetes {version} clusters" in message
    assert "use 1.36" in message


def test_kubernetes_version_without_installed_layer(dev_data):
    release = versions.KUBERNETES_RELEASES["1.35"]
    assert release.end_of_extended_support > dt.date.today()
    dev_data["cluster"]["kubernetes_version"] = "1.35"
    message = problems_for(dev_data)
    assert "needs the kubectl layer package aws-cdk.lambda-layer-kubectl-v35" in message


def test_unknown_kubernetes_version(dev_data):
    dev_data["cluster"]["kubernetes_version"] = "1.99"
    assert "Kubernetes 1.99 is unknown" in problems_for(dev_data)


@pytest.mark.parametrize(
    "sizes",
    [(2, 1, 3), (1, 3, 2), (3, 2, 1)],
    ids=["min>desired", "desired>max", "min>desired>max"],
)
def test_node_group_sizes_out_of_order(dev_data, sizes):
    group = dev_data["cluster"]["gpu_node_groups"]["prefill"]
    group["min_size"], group["desired_size"], group["max_size"] = sizes
    message = problems_for(dev_data)
    assert "cluster.gpu_node_groups.prefill: sizes must satisfy min_size <= desired_size <= max_size" in message


def test_unknown_key_is_rejected_with_allowed_keys(dev_data):
    dev_data["cluster"]["system_node_group"]["instanceType"] = "m7i.large"
    message = problems_for(dev_data)
    assert "cluster.system_node_group.instanceType: unknown key; remove it" in message
    assert "instance_type" in message


def test_unknown_top_level_key(dev_data):
    dev_data["vpc"] = {}
    assert "vpc: unknown key; remove it (allowed here: aws, charts, cluster" in problems_for(dev_data)


@pytest.mark.parametrize("name", ["PD_Dev", "-dev", "dev-", "d" * 64])
def test_name_must_be_dns_label(dev_data, name):
    dev_data["name"] = name
    message = problems_for(dev_data)
    assert "name:" in message
    assert ("DNS-1123 label" in message) or ("use at most 40" in message)


def test_public_endpoint_needs_cidrs(dev_data):
    dev_data["cluster"]["endpoint"].update(public_cidrs=[], allow_deployer_address=False)
    message = problems_for(dev_data)
    assert "cluster.endpoint: public is true but public_cidrs is empty" in message
    assert "set allow_deployer_address: true" in message


def test_zones_must_be_in_region(dev_data):
    dev_data["network"]["availability_zones"] = ["us-west-2a", "us-west-2b"]
    dev_data["network"]["gpu_availability_zone"] = "us-west-2a"
    assert "are not in aws.region us-east-2" in problems_for(dev_data)


def test_vpc_needs_two_zones(dev_data):
    dev_data["network"]["availability_zones"] = ["us-east-2a"]
    assert "network.availability_zones" in problems_for(dev_data)


def test_root_volume_too_small_for_serving_image(dev_data):
    dev_data["cluster"]["gpu_node_groups"]["decode"]["root_volume_gib"] = 50
    message = problems_for(dev_data)
    assert "cluster.gpu_node_groups.decode.root_volume_gib" in message
    assert "greater than or equal to 200" in message


def test_missing_required_section(dev_data):
    del dev_data["aws"]
    assert "test.yaml: aws: required; add it" in problems_for(dev_data)


def test_every_problem_is_reported_at_once(dev_data):
    broken = copy.deepcopy(dev_data)
    broken["name"] = "Bad_Name"
    broken["cluster"]["kubernetes_version"] = "1.31"
    message = problems_for(broken)
    assert "name:" in message and "kubernetes_version" in message


def test_unknown_environment_lists_known_ones():
    with pytest.raises(ConfigError) as caught:
        config_path_for("staging")
    assert "no environment 'staging'; use one of dev, prod" in str(caught.value)


def test_local_spec_is_not_an_environment():
    with pytest.raises(ConfigError, match="serving spec that `make local` runs, not an environment"):
        config_path_for("local")


def test_file_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "must hold a YAML mapping" in str(caught.value)


def test_every_field_has_a_description():
    from pydantic import BaseModel

    from config.schema import AppConfig

    seen, missing = set(), []

    def walk(model: type[BaseModel]):
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(f"{model.__name__}.{name}")
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation)

    walk(AppConfig)
    assert len(seen) > 5
    assert missing == []


# Serving mistakes caught at synth ------------------------------------------------------------------


def test_prefill_and_decode_cannot_name_different_models(dev_data):
    dev_data["serving"]["prefill"]["model"] = {"source": "Qwen/Qwen3-8B"}
    message = problems_for(dev_data)
    assert "serving.prefill.model: unknown key; remove it" in message


def test_tensor_parallel_larger_than_instance_gpus(dev_data):
    dev_data["serving"]["decode"]["tensor_parallel_size"] = 2
    message = problems_for(dev_data)
    assert "serving.decode.tensor_parallel_size=2 needs more GPUs than g6.8xlarge has (1)" in message


def test_gpu_kv_buffer_without_gpudirect_rdma(dev_data):
    dev_data["serving"]["kv_transfer"]["buffer_device"] = "cuda"
    message = problems_for(dev_data)
    assert "buffer_device is cuda but g6.8xlarge has no GPUDirect RDMA; set buffer_device: cpu" in message


def test_more_replicas_than_node_group_can_hold(dev_data):
    dev_data["serving"]["prefill"]["max_replicas"] = 3
    message = problems_for(dev_data)
    assert "serving.prefill.max_replicas=3 can never be scheduled: the node group holds at most 2" in message


def test_gated_model_without_secret(dev_data):
    dev_data["serving"]["model"] = {"model_id": "llama", "source": "meta-llama/Llama-3.1-8B-Instruct", "gated": True}
    message = problems_for(dev_data)
    assert "serving.model: model meta-llama/Llama-3.1-8B-Instruct is gated but hf_token_secret is not set" in message


def test_world_open_endpoint_in_production(dev_data):
    dev_data["production"] = True
    dev_data["cluster"]["endpoint"]["public_cidrs"] = ["0.0.0.0/0"]
    assert "public_cidrs contains 0.0.0.0/0 in a production environment" in problems_for(dev_data)


@pytest.mark.parametrize("model_source", ["Qwen/Qwen2.5-7B-Instruct", "s3://my-models/qwen"])
def test_no_nat_is_refused_because_charts_and_images_need_it(dev_data, model_source):
    dev_data["network"]["nat_gateways"] = 0
    dev_data["network"]["interface_endpoints"] = ["ecr.api", "ecr.dkr", "sts", "eks", "eks-auth", "logs"]
    dev_data["serving"]["model"]["source"] = model_source
    (line,) = [line for line in problems_for(dev_data).splitlines() if "nat_gateways" in line]
    assert "network.nat_gateways is 0, but the Helm charts come from public chart repositories" in line
    assert line.endswith("set nat_gateways: 1")


@pytest.mark.parametrize("key", ["aws:owner", "AWS:cost-center"])
def test_reserved_tag_prefix_is_refused(dev_data, key):
    dev_data["tags"][key] = "platform"
    assert f"tags: key {key!r} starts with 'aws:', which AWS reserves for its own tags; rename it" in problems_for(dev_data)


def test_system_root_volume_too_small_for_the_head_image(dev_data):
    dev_data["cluster"]["system_node_group"]["root_volume_gib"] = 50
    message = problems_for(dev_data)
    assert "cluster.system_node_group.root_volume_gib: root_volume_gib=50 leaves no room for the serving image" in message
    assert "use at least 100" in message


def test_gp3_throughput_needs_its_iops(dev_data):
    dev_data["cluster"]["gpu_node_groups"]["prefill"].update(root_volume_throughput_mibps=1000, root_volume_iops=3000)
    message = problems_for(dev_data)
    assert "cluster.gpu_node_groups.prefill: root_volume_throughput_mibps=1000 needs at least 4000 root_volume_iops" in message


def test_amp_scrape_interval_under_30_seconds_is_refused(dev_data):
    dev_data["observability"] = {"backend": "amp", "scrape_interval_seconds": 15}
    assert "Amazon Managed Prometheus scrapers refuse intervals under 30 s; use 30 or 60" in problems_for(dev_data)
    dev_data["observability"]["backend"] = "cloudwatch"
    parse_config(dev_data)


@pytest.mark.parametrize("image", ["rayproject/ray-llm:latest", "rayproject/ray-llm", "my.registry/ray:stable"])
def test_image_without_version_tag(dev_data, image):
    dev_data["ray_service"] = {"image": image}
    assert "has no version tag; pin a versioned tag" in problems_for(dev_data)


def test_image_pinned_by_digest_is_accepted(dev_data):
    dev_data["ray_service"] = {"image": "rayproject/ray-llm@sha256:" + "a" * 64}
    assert parse_config(dev_data).ray_service.image.endswith("a" * 64)


def test_cpu_device_is_for_local_runs_only(dev_data):
    dev_data["serving"]["device"] = "cpu"
    assert "serving.device is cpu, which only `make local` runs" in problems_for(dev_data)


def test_engine_kwargs_cannot_override_managed_fields(dev_data):
    dev_data["serving"]["decode"]["engine_kwargs"] = {"kv_transfer_config": {}}
    message = problems_for(dev_data)
    assert "engine_kwargs.kv_transfer_config is set by the spec; use serving.kv_transfer instead" in message


def test_secret_looking_env_var_is_rejected(dev_data):
    dev_data["serving"]["env_vars"] = {"HF_TOKEN": "abc"}
    assert "env_vars.HF_TOKEN looks like a secret" in problems_for(dev_data)


def test_replica_bounds_out_of_order(dev_data):
    dev_data["serving"]["decode"]["min_replicas"] = 2
    dev_data["serving"]["decode"]["max_replicas"] = 1
    assert "serving.decode: min_replicas (2) > max_replicas (1)" in problems_for(dev_data)


def test_nlb_without_allowed_cidrs(dev_data):
    dev_data["ray_service"] = {"endpoint": {"internal_nlb": True}}
    assert "internal_nlb is on but allowed_cidrs is empty" in problems_for(dev_data)
