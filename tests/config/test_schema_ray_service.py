"""config/schema/ray_service.py: the RayService's image and endpoint."""

from __future__ import annotations

import pytest

from config.loader import parse_config
from tests.config.helpers import problems_for


@pytest.mark.parametrize("image", ["rayproject/ray-llm:latest", "rayproject/ray-llm", "my.registry/ray:stable"])
def test_image_without_version_tag(dev_data, image):
    dev_data["ray_service"] = {"image": image}
    assert "has no version tag; pin a versioned tag" in problems_for(dev_data)


# What the stack must know of an image it has no table entry for (Ubuntu's CA path, an older glibc).
UBUNTU_FACTS = {
    "image_python_version": "3.12",
    "image_ca_bundle": "/etc/ssl/certs/ca-certificates.crt",
    "image_wheel_platform": "manylinux_2_28_x86_64",
}


def test_image_pinned_by_digest_is_accepted_with_its_facts(dev_data):
    dev_data["ray_service"] = {"image": "rayproject/ray-llm@sha256:" + "a" * 64, **UBUNTU_FACTS}
    assert parse_config(dev_data).ray_service.image.endswith("a" * 64)


def test_an_image_the_project_does_not_know_needs_its_facts(dev_data):
    dev_data["ray_service"] = {"image": "123456789012.dkr.ecr.us-east-2.amazonaws.com/my-ray:v2.58.0-ubuntu"}
    assert (
        "ray_service: image '123456789012.dkr.ecr.us-east-2.amazonaws.com/my-ray:v2.58.0-ubuntu' is not one "
        "config/versions.py knows (SERVING_IMAGES: ray:serve-llm-cuda-v1.0.0): set "
        "ray_service.image_python_version, image_ca_bundle, image_wheel_platform for it, or use a known image"
    ) in problems_for(dev_data)
    dev_data["ray_service"].update(UBUNTU_FACTS)
    facts = parse_config(dev_data).ray_service.serving_image_facts()
    assert (facts.ca_bundle, facts.wheel_platform, facts.python_version) == (
        "/etc/ssl/certs/ca-certificates.crt",
        "manylinux_2_28_x86_64",
        "3.12",
    )


def test_the_known_images_facts_come_from_its_table_entry_whatever_registry_serves_it(dev_data):
    from config import versions

    dev_data["ray_service"] = {"image": "123456789012.dkr.ecr.us-east-2.amazonaws.com/ray:serve-llm-cuda-v1.0.0"}
    facts = parse_config(dev_data).ray_service.serving_image_facts()
    assert facts == versions.SERVING_IMAGES["ray:serve-llm-cuda-v1.0.0"]
    assert facts.ca_bundle == "/etc/pki/tls/certs/ca-bundle.crt"  # Amazon Linux 2023, the DLC's base


@pytest.mark.parametrize(
    ("region", "registry"),
    [
        ("us-east-2", "763104351884.dkr.ecr.us-east-2.amazonaws.com"),
        ("af-south-1", "626614931356.dkr.ecr.af-south-1.amazonaws.com"),
        ("eu-south-2", "503227376785.dkr.ecr.eu-south-2.amazonaws.com"),
        ("cn-north-1", "727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn"),
    ],
)
def test_the_default_image_comes_from_the_regions_own_dlc_registry(dev_data, region, registry):
    dev_data["aws"]["region"] = region
    dev_data["network"]["availability_zones"] = [f"{region}a", f"{region}b"]
    dev_data["network"]["gpu_availability_zone"] = f"{region}a"
    config = parse_config(dev_data)
    assert config.ray_service.image_for(region) == f"{registry}/ray:serve-llm-cuda-v1.0.0"


def test_a_region_without_a_dlc_registry_is_refused_in_one_line(dev_data):
    dev_data["aws"]["region"] = "us-gov-west-1"
    dev_data["network"]["availability_zones"] = ["us-gov-west-1a", "us-gov-west-1b"]
    dev_data["network"]["gpu_availability_zone"] = "us-gov-west-1a"
    message = problems_for(dev_data)
    assert "aws.region us-gov-west-1 has no AWS Deep Learning Containers registry" in message
    assert "set ray_service.image to a copy of the image in a registry of yours" in message


def test_the_default_regions_registry_named_in_an_opt_in_region_is_refused(dev_data):
    dev_data["aws"]["region"] = "af-south-1"
    dev_data["network"]["availability_zones"] = ["af-south-1a", "af-south-1b"]
    dev_data["network"]["gpu_availability_zone"] = "af-south-1a"
    dev_data["ray_service"] = {"image": "763104351884.dkr.ecr.{region}.amazonaws.com/ray:serve-llm-cuda-v1.0.0"}
    assert (
        "ray_service.image names the Deep Learning Containers registry of account 763104351884, but aws.region "
        "af-south-1 serves them from 626614931356: write {registry} for the registry host"
    ) in problems_for(dev_data)


def test_nlb_without_allowed_cidrs(dev_data):
    dev_data["ray_service"] = {"endpoint": {"internal_nlb": True}}
    assert "internal_nlb is on but allowed_cidrs is empty" in problems_for(dev_data)


KEY = ["pd-llm/api-key"]


@pytest.mark.parametrize("internal_nlb", [False, True])
@pytest.mark.parametrize("keys", [[], KEY])
@pytest.mark.parametrize("open_to_vpc", [False, True])
def test_an_endpoint_open_to_the_vpc_without_a_key_is_chosen_in_writing(dev_data, internal_nlb, keys, open_to_vpc):
    """Every combination of the NLB, keys and the opt-out: only a keyless NLB without the opt-out
    is refused, and the opt-out beside a key (a name that would be untrue) is refused too."""
    endpoint = {"internal_nlb": internal_nlb, "api_key_secrets": keys, "open_to_vpc_without_key": open_to_vpc}
    dev_data["ray_service"] = {"endpoint": endpoint | ({"allowed_cidrs": ["10.0.0.0/8"]} if internal_nlb else {})}
    if internal_nlb and not keys and not open_to_vpc:
        problem = problems_for(dev_data)
        assert "\n" not in problem and problem.startswith("test.yaml: ray_service.endpoint: ")
        assert "api_key_secrets" in problem and "open_to_vpc_without_key: true" in problem
    elif open_to_vpc and keys:
        problem = problems_for(dev_data)
        assert "\n" not in problem and "open_to_vpc_without_key" in problem and "api_key_secrets" in problem
    else:
        assert parse_config(dev_data).ray_service.endpoint.open_to_vpc_without_key == open_to_vpc


def test_namespace_is_a_dns_label(dev_data):
    dev_data["ray_service"] = {"namespace": "LLM"}
    assert problems_for(dev_data) == (
        "test.yaml: ray_service.namespace: 'LLM' is not a valid DNS-1123 label: use at most 63 lower-case letters, "
        "digits and '-', starting and ending with a letter or digit"
    )


def test_name_kuberay_refuses(dev_data):
    dev_data["ray_service"] = {"name": "9abc"}
    assert problems_for(dev_data) == (
        "test.yaml: ray_service.name: '9abc' is a name KubeRay refuses; use a DNS-1035 label of at most 47 "
        "characters: lower-case letters, digits and '-', starting with a letter and ending with a letter or digit, "
        "for example pd-llm"
    )


@pytest.mark.parametrize(
    ("section", "key"),
    [("ray_service", "auth_token"), ("ray_service.endpoint", "api_key"), ("ray_service.endpoint", "api_keys")],
)
def test_a_secret_written_as_a_value_is_refused_naming_the_field(dev_data, section, key):
    target = dev_data
    for part in section.split("."):
        target = target.setdefault(part, {})
    target[key] = "sk-live-0123456789abcdef"
    problem = problems_for(dev_data)
    assert problem.startswith(f"test.yaml: {section}.{key}: a secret is never a config value")
    assert "sk-live" not in problem


def test_an_api_key_in_place_of_its_secrets_name_is_refused(dev_data):
    dev_data["ray_service"] = {"endpoint": {"api_key_secrets": ["pd/api-key", "sk-live-0123456789abcdef"]}}
    assert problems_for(dev_data) == (
        "test.yaml: ray_service.endpoint.api_key_secrets: entry 1 looks like an API key, not the name of a secret: "
        "a key never goes into the config; put it in Secrets Manager (`aws secretsmanager create-secret --name NAME "
        "--secret-string …`) and name the secret here"
    )


def test_api_key_secrets_are_names_or_arns_in_the_region(dev_data):
    dev_data["ray_service"] = {"endpoint": {"api_key_secrets": ["bad name!"]}}
    assert "entry 0 'bad name!' is not a Secrets Manager secret name" in problems_for(dev_data)
    other = "arn:aws:secretsmanager:eu-west-1:000000000000:secret:pd/api-key-AbCdEf"
    dev_data["ray_service"] = {"endpoint": {"api_key_secrets": [other]}}
    assert problems_for(dev_data).endswith(
        f"ray_service.endpoint.api_key_secrets[0] {other} is in eu-west-1; the pods read it in "
        "us-east-2: use a secret in us-east-2 (or a replica of it there)"
    )


def test_at_most_four_api_key_secrets(dev_data):
    dev_data["ray_service"] = {"endpoint": {"api_key_secrets": [f"pd/api-key-{i}" for i in range(5)]}}
    assert "ray_service.endpoint.api_key_secrets" in problems_for(dev_data)


def test_the_auth_token_generation_only_grows_from_one(dev_data):
    dev_data["ray_service"] = {"auth_token_generation": 0}
    assert "ray_service.auth_token_generation" in problems_for(dev_data)


def test_client_cidrs_that_are_not_cidrs_are_refused_naming_the_field(dev_data):
    dev_data["ray_service"] = {"endpoint": {"internal_nlb": True, "allowed_cidrs": ["10.0.0.0/8", "10.1.2.300/32"]}}
    assert problems_for(dev_data) == (
        "test.yaml: ray_service.endpoint: allowed_cidrs: '10.1.2.300/32' is not a CIDR such as 10.0.0.0/8"
    )
