"""The VPC: its CIDR, zones, NAT gateways and endpoints."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator, model_validator

from config.schema.base import LogRetentionDays, StrictModel

InterfaceEndpoint = Literal["ecr.api", "ecr.dkr", "sts", "eks", "eks-auth", "logs", "secretsmanager"]


def _ecr_endpoints() -> list[InterfaceEndpoint]:
    return ["ecr.api", "ecr.dkr"]


class NetworkConfig(StrictModel):
    vpc_cidr: str = Field(description="IPv4 CIDR of the VPC, /16 to /24.", default="10.40.0.0/16")
    availability_zones: list[str] = Field(
        description=(
            "Availability zones of the VPC (at least two: EKS requires it). They are written "
            "into the app's context so synth never looks them up."
        ),
        min_length=2,
    )
    gpu_availability_zone: str = Field(
        description=(
            "The one AZ that holds every GPU node: EFA traffic does not cross AZs and a cluster "
            "placement group lives in one AZ. Choose an AZ that has the GPU instance type."
        )
    )
    nat_gateways: int = Field(
        description="NAT gateways for the private subnets (1 is cheap, one per AZ is resilient).",
        ge=0,
        default=1,
    )
    interface_endpoints: list[InterfaceEndpoint] = Field(
        description=(
            "Interface VPC endpoints. ECR's two keep the multi-GB serving image off the NAT "
            "gateway; an S3 gateway endpoint (free) is always created for the image layers."
        ),
        default_factory=_ecr_endpoints,
    )
    flow_log_retention_days: LogRetentionDays = Field(
        description="Days to keep VPC flow logs (one of the periods CloudWatch Logs accepts).",
        default=30,
    )

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an IPv4 CIDR such as 10.40.0.0/16 ({exc})") from None
        if not 16 <= network.prefixlen <= 24:
            raise ValueError(f"{value} has prefix /{network.prefixlen}; use /16 to /24")
        return value

    @model_validator(mode="after")
    def _gpu_zone_in_vpc(self) -> NetworkConfig:
        if len(set(self.availability_zones)) != len(self.availability_zones):
            raise ValueError("availability_zones lists a zone twice; list each zone once")
        if self.gpu_availability_zone not in self.availability_zones:
            raise ValueError(
                f"gpu_availability_zone {self.gpu_availability_zone!r} is not one of "
                f"availability_zones {self.availability_zones}; pick one of those or add it"
            )
        if self.nat_gateways > len(self.availability_zones):
            raise ValueError(
                f"nat_gateways={self.nat_gateways} exceeds the {len(self.availability_zones)} "
                "availability zones; use at most one per zone"
            )
        return self
