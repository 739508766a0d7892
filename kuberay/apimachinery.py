"""The syntax KubeRay's validation calls from ``k8s.io/apimachinery``: DNS-1035 labels, qualified
names, label values (``pkg/util/validation``) and resource quantities (``pkg/api/resource``).

Each ``*_errors`` function returns apimachinery's error strings; an empty list means valid.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from kuberay import KubeRayRejection

_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def dns1035_label_errors(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not _DNS1035_LABEL.match(value):
        errors.append(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
            "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
            "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
        )
    return errors


def qualified_name_errors(value: str) -> list[str]:
    errors = []
    prefix, slash, name = value.rpartition("/")
    if slash and not prefix:
        errors.append("prefix part must be non-empty")
    elif prefix:
        if len(prefix) > 253:
            errors.append("prefix part must be no more than 253 characters")
        if not _DNS1123_SUBDOMAIN.match(prefix):
            errors.append(
                "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters"
            )
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if name and not _QUALIFIED_NAME.match(name):
        errors.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character"
        )
    return errors


def label_value_errors(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not _LABEL_VALUE.match(value):
        errors.append(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        )
    return errors


# --- resource quantities (k8s.io/apimachinery/pkg/api/resource) ---------------------------------

_SUFFIXES = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")


def parse_quantity(text: str) -> Decimal:
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise KubeRayRejection(f"quantities must match the regular expression (got {text!r})")
    return Decimal(match.group(1)) * _SUFFIXES[match.group(2) or ""]


def quantity_value(text: str) -> int:
    """``Quantity.Value()``: the quantity rounded up to a whole number."""
    return int(math.ceil(parse_quantity(text)))
