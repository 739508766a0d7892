"""The serving image's facts reach what depends on them: the CA bundle the GCS verifies the store's TLS
with, and the Python and platform the model streamer's wheels are fetched for. The known image's come
from config/versions.py's table; another image's from the config (config/schema/ray_service.py)."""

from __future__ import annotations

import yaml

from config.loader import parse_config
from manifests.gcs_store import CA_CERT_ENV
from manifests.mirror_job import manifests as mirror_manifests
from tests.conftest import CONFIG_DIR, rendered_ray_service

UBUNTU_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/my-ray:v2.58.0-ubuntu"
UBUNTU_FACTS = {
    "image_python_version": "3.12",
    "image_ca_bundle": "/etc/ssl/certs/ca-certificates.crt",
    "image_wheel_platform": "manylinux_2_28_x86_64",
}


def prod(**ray_service) -> object:
    data = yaml.safe_load((CONFIG_DIR / "prod.yaml").read_text())
    data["ray_service"].update(ray_service)
    return parse_config(data)


def head_ca(config) -> str:
    head = rendered_ray_service(config)["spec"]["rayClusterConfig"]["headGroupSpec"]
    (value,) = [e["value"] for e in head["template"]["spec"]["containers"][0]["env"] if e["name"] == CA_CERT_ENV]
    return value


def mirror_script(config) -> str:
    (job,) = [
        m for m in mirror_manifests(config, repo="Qwen/Qwen2.5-7B-Instruct", prefix="models/qwen") if m["kind"] == "Job"
    ]
    return " ".join(job["spec"]["template"]["spec"]["containers"][0]["command"])


def test_the_known_image_gets_amazon_linux_s_bundle_and_platform():
    config = prod()
    assert config.gcs_fault_tolerant
    assert head_ca(config) == "/etc/pki/tls/certs/ca-bundle.crt"
    assert "--platform manylinux_2_34_x86_64 --python-version 3.13" in mirror_script(config)


def test_another_image_gets_the_facts_the_config_states():
    config = prod(image=UBUNTU_IMAGE, **UBUNTU_FACTS)
    assert head_ca(config) == "/etc/ssl/certs/ca-certificates.crt"
    assert "--platform manylinux_2_28_x86_64 --python-version 3.12" in mirror_script(config)
