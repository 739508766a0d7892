"""Where the stack goes, and what `make deploy` resolves at deploy time (never at synth)."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator

from config.schema.base import IAM_PRINCIPAL_ARN, StrictModel

PLACEHOLDER_ACCOUNT = "000000000000"
# Stands in for the deployer's address until `make deploy` resolves it: RFC 5737 TEST-NET-1,
# which no client comes from, so a template deployed without the guard fails closed.
UNRESOLVED_DEPLOYER_CIDR = "192.0.2.1/32"


class AwsTarget(StrictModel):
    account: str = Field(
        description=(
            "12-digit AWS account id to deploy into. The placeholder 000000000000 synthesizes "
            "offline but `make deploy` refuses it."
        ),
        pattern=r"^\d{12}$",
    )
    region: str = Field(
        description="AWS region, for example us-east-2.",
        pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$",
    )


class DeployFacts(StrictModel):
    """What `make deploy` learns from AWS at deploy time and passes in; empty at offline synth."""

    deployer_principal: str | None = Field(
        default=None,
        description="IAM role (with its path) or user ARN of whoever runs `make deploy`.",
        pattern=IAM_PRINCIPAL_ARN.pattern,
    )
    deployer_cidr: str | None = Field(
        default=None, description="The public IPv4 address `make deploy` runs from, as a /32."
    )

    @field_validator("deployer_cidr")
    @classmethod
    def _single_address(cls, value: str | None) -> str | None:
        if value is not None and ipaddress.IPv4Network(value).prefixlen != 32:
            raise ValueError(f"deployer_cidr {value} is not a single IPv4 address (/32)")
        return value
