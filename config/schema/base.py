"""What every section of the schema shares: the strict base model and the types and checks used in more than one place."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# An IAM role (with its path) or user ARN: cluster admins and the deployer's principal.
IAM_PRINCIPAL_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")
# An EKS add-on version: the managed add-ons of the cluster and the CloudWatch observability add-on.
ADDON_VERSION = re.compile(r"^v\d+\.\d+\.\d+-eksbuild\.\d+$")
# The retention periods CloudWatch Logs offers, in days (the ones used here).
LogRetentionDays = Literal[1, 3, 5, 7, 14, 30, 60, 90, 180, 365]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def dns_label(value: str) -> str:
    if not DNS_1123_LABEL.match(value):
        raise ValueError(
            f"{value!r} is not a valid DNS-1123 label: use at most 63 lower-case letters, "
            "digits and '-', starting and ending with a letter or digit"
        )
    return value


def check_cidrs(values: list[str], *, example: str, prefix: str = "") -> list[str]:
    """``values`` if each is an IPv4 or IPv6 CIDR; else a ValueError naming the first bad one (after ``prefix``)."""
    for value in values:
        try:
            ipaddress.ip_network(value)
        except ValueError:
            raise ValueError(f"{prefix}{value!r} is not a CIDR such as {example}") from None
    return values
