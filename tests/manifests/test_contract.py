"""The shared names hold together: what the node groups carry is what the pods select and tolerate,
and the scrape configuration's phase regex reads back the group name the RayService gives."""

from __future__ import annotations

import re

from manifests import contract
from manifests.observability import scrape_config
from tests.conftest import CONFIG_DIR, rendered_ray_service


def test_the_phase_regex_reads_the_phase_back_from_every_worker_group_name():
    pattern = re.compile(f"^{contract.WORKER_GROUP_PHASE_REGEX}$")
    for phase in contract.PHASES:
        match = pattern.match(contract.worker_group_name(phase))
        assert match and match.group(1) == phase
    assert not pattern.match("colocated-gpu") and not pattern.match("prefill-cpu")


def test_the_scrape_config_relabels_with_the_contracts_regex():
    relabels = scrape_config(namespace="llm", interval_seconds=30)["scrape_configs"][0]["relabel_configs"]
    (phase_rule,) = [r for r in relabels if r.get("target_label") == "phase"]
    assert phase_rule["regex"] == contract.WORKER_GROUP_PHASE_REGEX


def test_gpu_nodes_taints_are_what_the_worker_pods_tolerate(synthesized):
    from config.loader import load_config

    _, _, template, *_ = synthesized("dev")
    worker_groups = rendered_ray_service(load_config(CONFIG_DIR / "dev.yaml"))["spec"]["rayClusterConfig"][
        "workerGroupSpecs"
    ]
    nodegroups = template.find_resources("AWS::EKS::Nodegroup")
    gpu = [
        p["Properties"]
        for p in nodegroups.values()
        if p["Properties"].get("Labels", {}).get(contract.ROLE_LABEL) == contract.GPU_ROLE
    ]
    assert {g["Labels"][contract.PHASE_LABEL] for g in gpu} == set(contract.PHASES)
    for group in worker_groups:
        pod = group["template"]["spec"]
        (node_group,) = [
            g for g in gpu if g["Labels"][contract.PHASE_LABEL] == contract.WORKER_GROUPS[group["groupName"]]
        ]
        assert pod["nodeSelector"].items() <= node_group["Labels"].items()
        tolerated = {t["key"] for t in pod["tolerations"]}
        assert {t["Key"] for t in node_group["Taints"]} <= tolerated
