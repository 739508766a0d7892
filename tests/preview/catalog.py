"""The edits a user makes after the first deploy, each as the config before and after it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tests.preview.conftest import dev, edited

ADMIN_A = "arn:aws:iam::000000000000:role/PlatformAdmin"
ADMIN_B = "arn:aws:iam::000000000000:role/OnCall"


def _set(path: str, value) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        target = data
        *parents, leaf = path.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value

    return apply


def _all(*edits) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        for edit in edits:
            edit(data)

    return apply


@dataclass(frozen=True)
class Edit:
    name: str
    what: str
    after: Callable[[dict], None]
    before: Callable[[dict], None] | None = None  # None: the shipped dev config

    def before_data(self) -> tuple[str, dict | None]:
        return ("dev", None) if self.before is None else (f"before-{self.name}", edited(dev(), self.before))

    def after_data(self) -> tuple[str, dict]:
        """Named as the other tests name the same variant of dev, so that it is synthesized once."""
        base = dev() if self.before is None else edited(dev(), self.before)
        return (self.name if self.before is None else f"after-{self.name}", edited(base, self.after))


def _gated(data: dict) -> None:
    from tests.cdk_constructs.test_hf_token import GATED_MODEL, SECRET

    data["serving"]["model"] = {**GATED_MODEL, "hf_token_secret": SECRET}


CATALOG = [
    Edit("scale-max", "raise decode's max_size", _set("cluster.gpu_node_groups.decode.max_size", 4)),
    Edit("desired-size", "change decode's desired size", _set("cluster.gpu_node_groups.decode.desired_size", 2)),
    Edit(
        "shrink-max",
        "lower decode's max_size below the size it has",
        _all(
            _set("cluster.gpu_node_groups.decode.max_size", 1), _set("cluster.gpu_node_groups.decode.desired_size", 1)
        ),
        before=_all(
            _set("cluster.gpu_node_groups.decode.max_size", 3), _set("cluster.gpu_node_groups.decode.desired_size", 2)
        ),
    ),
    Edit("add-admin", "add an admin principal", _set("cluster.admin_principals", [ADMIN_A])),
    Edit(
        "remove-first-admin",
        "remove the first of two admin principals",
        _set("cluster.admin_principals", [ADMIN_B]),
        before=_set("cluster.admin_principals", [ADMIN_A, ADMIN_B]),
    ),
    Edit(
        "change-model",
        "serve another model",
        _set("serving.model", {"model_id": "mistral-7b-instruct", "source": "mistralai/Mistral-7B-Instruct-v0.3"}),
    ),
    Edit("max-model-len", "change max_model_len", _set("serving.max_model_len", 4096)),
    Edit("chart-bump", "bump a chart version", _set("charts.nvidia_device_plugin", "0.20.1")),
    Edit(
        "kubernetes-minor",
        "upgrade Kubernetes one minor",
        _set("cluster.kubernetes_version", "1.36"),
        before=_set("cluster.kubernetes_version", "1.35"),
    ),
    Edit("cloudwatch", "switch the observability backend", _set("observability.backend", "cloudwatch")),
    Edit("mirror-dev", "enable the S3 model mirror", _set("model_mirror.enabled", True)),
    Edit("gated", "serve a gated model", _gated),
    Edit(
        "internal-nlb",
        "turn on the internal NLB",
        _set(
            "ray_service.endpoint",
            {"internal_nlb": True, "allowed_cidrs": ["10.40.0.0/16"], "open_to_vpc_without_key": True},
        ),
    ),
    Edit("cost-tag", "add a cost tag", _set("tags.cost-center", "ml-42")),
    Edit(
        "gpu-instance-type",
        "change decode's GPU instance type",
        _set("cluster.gpu_node_groups.decode.instance_type", "g6.12xlarge"),
    ),
]
