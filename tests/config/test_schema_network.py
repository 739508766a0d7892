"""config/schema/network.py: the VPC section."""

from __future__ import annotations

from tests.config.helpers import problems_for


def test_gpu_zone_outside_vpc_zones(dev_data):
    dev_data["network"]["gpu_availability_zone"] = "us-east-2c"
    message = problems_for(dev_data)
    assert "network: gpu_availability_zone 'us-east-2c' is not one of availability_zones" in message
    assert "pick one of those or add it" in message


def test_vpc_needs_two_zones(dev_data):
    dev_data["network"]["availability_zones"] = ["us-east-2a"]
    assert "network.availability_zones" in problems_for(dev_data)


def test_zone_listed_twice(dev_data):
    dev_data["network"]["availability_zones"] = ["us-east-2a", "us-east-2a"]
    assert problems_for(dev_data) == "test.yaml: network: availability_zones lists a zone twice; list each zone once"


def test_more_nat_gateways_than_zones(dev_data):
    dev_data["network"]["nat_gateways"] = 5
    assert problems_for(dev_data) == (
        "test.yaml: network: nat_gateways=5 exceeds the 2 availability zones; use at most one per zone"
    )


def test_vpc_cidr_prefix_and_form(dev_data):
    dev_data["network"]["vpc_cidr"] = "10.0.0.0/8"
    assert problems_for(dev_data) == "test.yaml: network.vpc_cidr: 10.0.0.0/8 has prefix /8; use /16 to /24"
    dev_data["network"]["vpc_cidr"] = "nonsense"
    assert problems_for(dev_data) == (
        "test.yaml: network.vpc_cidr: 'nonsense' is not an IPv4 CIDR such as 10.40.0.0/16 "
        "(Expected 4 octets in 'nonsense')"
    )
