"""config/schema/ray_service.py: the RayService's image and endpoint."""

from __future__ import annotations

import pytest

from config.loader import parse_config
from tests.config.helpers import problems_for


@pytest.mark.parametrize("image", ["rayproject/ray-llm:latest", "rayproject/ray-llm", "my.registry/ray:stable"])
def test_image_without_version_tag(dev_data, image):
    dev_data["ray_service"] = {"image": image}
    assert "has no version tag; pin a versioned tag" in problems_for(dev_data)


def test_image_pinned_by_digest_is_accepted(dev_data):
    dev_data["ray_service"] = {"image": "rayproject/ray-llm@sha256:" + "a" * 64}
    assert parse_config(dev_data).ray_service.image.endswith("a" * 64)


def test_nlb_without_allowed_cidrs(dev_data):
    dev_data["ray_service"] = {"endpoint": {"internal_nlb": True}}
    assert "internal_nlb is on but allowed_cidrs is empty" in problems_for(dev_data)


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
