"""ray_service.gcs_fault_tolerance: on in production, a switch elsewhere, a store from the catalog,
and bad input refused at load time in one line that names the field; and its cost in the plan."""

from __future__ import annotations

import pytest

from config import catalog
from config.loader import ConfigError, load_config, parse_config
from planner.from_config import plan_config, plan_inputs
from tests.conftest import CONFIG_DIR, with_changes


def test_on_with_a_replica_in_production_off_in_dev():
    prod, dev = load_config(CONFIG_DIR / "prod.yaml"), load_config(CONFIG_DIR / "dev.yaml")
    assert prod.gcs_fault_tolerant and prod.gcs_store_multi_az
    assert not dev.gcs_fault_tolerant


def test_dev_turns_it_on_with_one_switch_and_gets_a_single_node(dev_data):
    config = parse_config(with_changes(dev_data, {"ray_service.gcs_fault_tolerance.enabled": True}))
    assert config.gcs_fault_tolerant and not config.gcs_store_multi_az
    config = parse_config(
        with_changes(dev_data, {"ray_service.gcs_fault_tolerance": {"enabled": True, "store": {"multi_az": True}}})
    )
    assert config.gcs_store_multi_az


def one_problem(data: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="test.yaml")
    (line,) = caught.value.problems
    assert "\n" not in line
    return line


def test_fault_tolerance_without_a_store_is_refused_naming_the_field(dev_data):
    line = one_problem(with_changes(dev_data, {"ray_service.gcs_fault_tolerance": {"enabled": True, "store": None}}))
    assert "ray_service.gcs_fault_tolerance.store is empty, but fault tolerance is on (enabled: true)" in line
    # Off, no store is needed.
    parse_config(with_changes(dev_data, {"ray_service.gcs_fault_tolerance": {"enabled": False, "store": None}}))


def test_production_default_without_a_store_is_refused(dev_data):
    line = one_problem(with_changes(dev_data, {"production": True, "ray_service.gcs_fault_tolerance": {"store": None}}))
    assert "ray_service.gcs_fault_tolerance.store is empty" in line and "the default in production" in line


def test_a_node_type_outside_the_catalog_is_refused_naming_the_field(dev_data):
    line = one_problem(with_changes(dev_data, {"ray_service.gcs_fault_tolerance.store.node_type": "cache.t2.micro"}))
    assert line.startswith("ray_service.gcs_fault_tolerance.store.node_type: 'cache.t2.micro' is not in")
    assert "cache.t4g.small" in line


def test_every_field_is_described():
    from config.schema import GcsFaultToleranceConfig, GcsStoreConfig

    for model in (GcsFaultToleranceConfig, GcsStoreConfig):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"


def test_the_plan_prices_the_store_from_the_catalog(dev_data):
    price = catalog.CACHE_NODES["cache.t4g.small"].price_per_hour
    prod = plan_config(load_config(CONFIG_DIR / "prod.yaml"))
    (line,) = [line for line in prod.cost.lines if line.item.startswith("GCS store")]
    assert (line.count, line.unit_per_hour, line.per_hour) == (2, price, round(2 * price, 6))
    dev = load_config(CONFIG_DIR / "dev.yaml")
    assert plan_inputs(dev).gcs_store_nodes == 0
    dev_ft = parse_config(with_changes(dev_data, {"ray_service.gcs_fault_tolerance.enabled": True}))
    assert plan_inputs(dev_ft).gcs_store_nodes == 1
