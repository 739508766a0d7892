"""The config as a whole: shipped files load, and each mistake gets a message naming field and fix.

Each section's own checks are in test_schema_<section>.py, the rules across sections in test_rules.py.
"""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

from config import versions
from config.loader import ConfigError, config_path_for, load_config, parse_config
from tests.config.helpers import problems_for
from tests.conftest import CONFIG_DIR, SHIPPED_ENVIRONMENTS


def test_shipped_environments_exist():
    assert {"dev", "prod"} <= set(SHIPPED_ENVIRONMENTS)


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_every_shipped_config_loads(env):
    config = load_config(CONFIG_DIR / f"{env}.yaml")
    assert config.network.gpu_availability_zone in config.network.availability_zones
    assert config.cluster.kubernetes_version == versions.DEFAULT_KUBERNETES_VERSION


def test_models_are_frozen(dev_data):
    config = parse_config(dev_data)
    with pytest.raises(ValidationError, match="Instance is frozen"):
        config.name = "other"  # type: ignore[misc]


def test_unknown_key_is_rejected_with_allowed_keys(dev_data):
    dev_data["cluster"]["system_node_group"]["instanceType"] = "m7i.large"
    message = problems_for(dev_data)
    assert "cluster.system_node_group.instanceType: unknown key; remove it" in message
    assert "instance_type" in message


def test_unknown_top_level_key(dev_data):
    dev_data["vpc"] = {}
    assert "vpc: unknown key; remove it (allowed here: aws, charts, cluster" in problems_for(dev_data)


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


@pytest.mark.parametrize("name", ["PD_Dev", "-dev", "dev-", "d" * 64])
def test_name_must_be_dns_label(dev_data, name):
    dev_data["name"] = name
    message = problems_for(dev_data)
    assert "name:" in message
    assert ("DNS-1123 label" in message) or ("use at most 40" in message)


@pytest.mark.parametrize("key", ["aws:owner", "AWS:cost-center"])
def test_reserved_tag_prefix_is_refused(dev_data, key):
    dev_data["tags"][key] = "platform"
    assert f"tags: key {key!r} starts with 'aws:', which AWS reserves for its own tags; rename it" in problems_for(
        dev_data
    )
