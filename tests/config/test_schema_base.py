"""config/schema/base.py: the types and checks more than one section uses, and the package's shape
(everything importable from config.schema, and config importing none of the layers built on it)."""

from __future__ import annotations

import ast
import functools
import os
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

from config.loader import describe_validation_error
from config.schema import (
    IAM_PRINCIPAL_ARN,
    ClusterConfig,
    DeployFacts,
    LogRetentionDays,
    NetworkConfig,
    ObservabilityConfig,
    check_cidrs,
)
from tests.config.helpers import problems_for
from tests.conftest import ROOT

ROLE_WITH_PATH = "arn:aws:iam::123456789012:role/aws-reserved/sso.amazonaws.com/us-east-2/AWSReservedSSO_Admin_0a1b"


# IAM principal ARNs: cluster admins and the deployer ------------------------------------------------


def test_admins_and_deployer_share_one_arn_pattern():
    assert DeployFacts.model_json_schema()["properties"]["deployer_principal"]["anyOf"][0]["pattern"] == (
        IAM_PRINCIPAL_ARN.pattern
    )
    assert IAM_PRINCIPAL_ARN.pattern == r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$"


@pytest.mark.parametrize("arn", [ROLE_WITH_PATH, "arn:aws-us-gov:iam::123456789012:user/deployer"])
def test_role_and_user_arns_are_accepted_in_both_places(dev_data, arn):
    from config.loader import parse_config

    dev_data["cluster"]["admin_principals"] = [arn]
    assert parse_config(dev_data).cluster.admin_principals == [arn]
    assert DeployFacts(deployer_principal=arn).deployer_principal == arn


@pytest.mark.parametrize("arn", ["arn:aws:iam::123:role/X", "arn:aws:iam::123456789012:group/X"])
def test_other_arns_are_refused_in_both_places_with_their_own_messages(dev_data, arn):
    dev_data["cluster"]["admin_principals"] = [arn]
    assert problems_for(dev_data) == (
        f"test.yaml: cluster.admin_principals: {arn!r} is not an IAM role or user ARN such as "
        "arn:aws:iam::123456789012:role/Admin"
    )
    with pytest.raises(ValidationError) as caught:
        DeployFacts(deployer_principal=arn)
    assert describe_validation_error(DeployFacts, caught.value) == [
        f"deployer_principal: String should match pattern '{IAM_PRINCIPAL_ARN.pattern}' (got {arn!r})"
    ]


# CIDR lists: the API endpoint's and the NLB's --------------------------------------------------------


def test_check_cidrs():
    assert check_cidrs(["10.0.0.0/8", "2001:db8::/32"], example="x") == ["10.0.0.0/8", "2001:db8::/32"]
    with pytest.raises(ValueError, match=r"^'10.0.0.1/8' is not a CIDR such as 10.0.0.0/8$"):
        check_cidrs(["10.0.0.0/8", "10.0.0.1/8"], example="10.0.0.0/8")  # host bits set
    with pytest.raises(ValueError, match=r"^where: 'x' is not a CIDR such as y$"):
        check_cidrs(["x"], example="y", prefix="where: ")


def test_endpoint_cidrs_are_checked(dev_data):
    dev_data["cluster"]["endpoint"]["public_cidrs"] = ["10.0.0.0/33", "x"]
    assert problems_for(dev_data) == (
        "test.yaml: cluster.endpoint.public_cidrs: '10.0.0.0/33' is not a CIDR such as 203.0.113.0/24"
    )


def test_nlb_cidrs_are_checked(dev_data):
    dev_data["ray_service"] = {"endpoint": {"internal_nlb": True, "allowed_cidrs": ["nope"]}}
    assert problems_for(dev_data) == (
        "test.yaml: ray_service.endpoint: allowed_cidrs: 'nope' is not a CIDR such as 10.0.0.0/8"
    )


# Log retention: flow logs, the cluster's logs, the metrics backend's logs ---------------------------


@pytest.mark.parametrize(
    ("model", "field", "section"),
    [
        (NetworkConfig, "flow_log_retention_days", "network"),
        (ClusterConfig, "log_retention_days", "cluster"),
        (ObservabilityConfig, "log_retention_days", "observability"),
    ],
)
def test_every_retention_is_the_one_type(dev_data, model, field, section):
    assert model.model_fields[field].annotation == LogRetentionDays
    dev_data.setdefault(section, {})[field] = 2
    assert problems_for(dev_data) == (
        f"test.yaml: {section}.{field}: Input should be 1, 3, 5, 7, 14, 30, 60, 90, 180 or 365 (got 2)"
    )


def test_retention_periods_are_cloudwatchs():
    assert typing.get_args(LogRetentionDays) == (1, 3, 5, 7, 14, 30, 60, 90, 180, 365)


# The package ---------------------------------------------------------------------------------------


@functools.cache
def _python_files() -> list[Path]:
    """The repository's Python files, not those of .venv, node_modules or other dot and output folders."""
    found = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [
            d for d in subfolders if not d.startswith((".", "__")) and d not in {"node_modules", "cdk.out"}
        ]
        found += [Path(folder) / name for name in files if name.endswith(".py")]
    return found


def _imports(path: Path):
    """(module, names) of each import in a file; ``names`` empty for a plain ``import module``."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (SyntaxError, UnicodeDecodeError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def test_every_name_imported_from_config_schema_is_there():
    import config.schema

    wanted = {
        (name, str(path.relative_to(ROOT)))
        for path in _python_files()
        for module, names in _imports(path)
        if module == "config.schema"
        for name in names
    }
    assert {"AppConfig", "DeployFacts", "GpuNodeGroupConfig"} <= {name for name, _ in wanted}
    assert [(name, where) for name, where in sorted(wanted) if not hasattr(config.schema, name)] == []
    assert set(config.schema.__all__) <= set(dir(config.schema))


def test_no_module_imports_the_old_observability_module():
    assert [
        str(path.relative_to(ROOT))
        for path in _python_files()
        for module, _ in _imports(path)
        if module == "config.observability"
    ] == []


FORBIDDEN = {"cdk_constructs", "manifests", "stacks", "planner", "local", "cli", "verify", "bench"}


def test_config_imports_no_layer_built_on_it():
    found = [
        (str(path.relative_to(ROOT)), module)
        for path in (ROOT / "config").rglob("*.py")
        for module, _ in _imports(path)
        if module.split(".")[0] in FORBIDDEN
    ]
    assert found == []
