"""Add-on and node AMI releases: the pins in config/versions.py, and the floors a deploy takes from them."""

from __future__ import annotations

import pytest
import yaml

from config import versions
from config.loader import ConfigError, parse_config
from config.releases import (
    addon_order,
    addon_versions,
    ami_minor,
    ami_order,
    ami_release,
    node_releases,
)
from config.schema import DeployFacts
from config.upgrade import MAX_NODE_SKEW, VersionStepRefused, minor, step_of, version_of
from tests.conftest import CONFIG_DIR


def dev(**cluster_changes):
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    for key, value in cluster_changes.items():
        target = data["cluster"]
        *path, last = key.split(".")
        for part in path:
            target = target.setdefault(part, {})
        target[last] = value
    return parse_config(data, source="dev.yaml")


# --- the pins -------------------------------------------------------------------------------------


def test_each_pin_is_of_its_minor_and_names_where_it_was_read():
    for kubernetes, pins in versions.EKS_ADDON_RELEASES.items():
        assert set(pins) <= set(versions.EKS_ADDONS)
        for name, pin in pins.items():
            addon_order(pin.version)  # parses
            assert pin.source.startswith("https://"), (kubernetes, name)
        # kube-proxy is built per Kubernetes patch release: its minor is the cluster's.
        assert pins["kube-proxy"].version.startswith(f"v{kubernetes}."), kubernetes
    for kubernetes, pin in versions.NODE_AMI_RELEASES.items():
        assert ami_minor(pin.version) == kubernetes
        assert pin.source.startswith("https://github.com/awslabs/amazon-eks-ami/"), kubernetes


def test_every_minor_a_node_group_may_run_beside_the_default_control_plane_has_an_ami_release():
    newest = minor(versions.DEFAULT_KUBERNETES_VERSION)
    for number in range(newest - MAX_NODE_SKEW, newest + 1):
        assert version_of(number) in versions.NODE_AMI_RELEASES, version_of(number)
    assert versions.DEFAULT_KUBERNETES_VERSION in versions.EKS_ADDON_RELEASES


def test_release_versions_order_by_minor_then_date_then_patch():
    assert ami_order("1.36.3-20260903") > ami_order("1.36.2-20260714")
    assert ami_order("1.37.1-20261023") > ami_order("1.36.3-20260903")
    assert addon_order("v1.36.0-eksbuild.21") > addon_order("v1.36.0-eksbuild.14") > addon_order("v1.35.3-eksbuild.13")


# --- add-ons: a floor, an override ------------------------------------------------------------------


def test_an_add_on_takes_the_pin_or_the_newer_version_it_runs():
    chosen = addon_versions(
        control_plane="1.36",
        overrides={},
        live={"kube-proxy": "v1.36.0-eksbuild.21", "coredns": "v1.13.2-eksbuild.11", "vpc-cni": "v1.21.1-eksbuild.7"},
    )
    assert chosen["kube-proxy"] == "v1.36.0-eksbuild.21"  # newer than the pin: kept
    assert chosen["coredns"] == "v1.14.3-eksbuild.3"  # older: the pin moves it
    assert chosen["vpc-cni"] == "v1.21.1-eksbuild.7"  # no 1.36 pin: what runs stays in the template
    assert "eks-pod-identity-agent" not in chosen  # neither: EKS's default, as before


def test_a_control_plane_step_moves_kube_proxy_to_the_new_minors_pin():
    chosen = addon_versions(control_plane="1.36", overrides={}, live={"kube-proxy": "v1.35.3-eksbuild.13"})
    assert chosen["kube-proxy"] == versions.EKS_ADDON_RELEASES["1.36"]["kube-proxy"].version


def test_an_override_wins_but_never_takes_an_add_on_back():
    assert (
        addon_versions(
            control_plane="1.36", overrides={"coredns": "v1.14.3-eksbuild.16"}, live={"coredns": "v1.14.3-eksbuild.3"}
        )["coredns"]
        == "v1.14.3-eksbuild.16"
    )
    with pytest.raises(VersionStepRefused) as refused:
        addon_versions(
            control_plane="1.36",
            overrides={"kube-proxy": "v1.36.0-eksbuild.9"},
            live={"kube-proxy": "v1.36.0-eksbuild.21"},
        )
    assert str(refused.value) == (
        "cluster.addon_versions.kube-proxy is v1.36.0-eksbuild.9 but the cluster runs v1.36.0-eksbuild.21: an older "
        "version would take the add-on back; set v1.36.0-eksbuild.21 or later, or remove it"
    )


# --- node AMI releases ------------------------------------------------------------------------------


def test_a_group_takes_the_pin_or_the_newer_release_it_runs():
    pin = versions.NODE_AMI_RELEASES["1.36"].version
    field = "cluster.gpu_node_groups.prefill.ami_release_version"
    assert ami_release(field=field, kubernetes_version="1.36", override=None, live=None) == pin
    assert ami_release(field=field, kubernetes_version="1.36", override=None, live="1.36.2-20260714") == pin
    assert (
        ami_release(field=field, kubernetes_version="1.36", override=None, live="1.36.5-20261119") == "1.36.5-20261119"
    )
    # A release of the minor the group leaves says nothing about the one it moves to.
    assert ami_release(field=field, kubernetes_version="1.36", override=None, live="1.35.6-20260714") == pin


def test_a_group_the_template_left_unpinned_stays_so_at_the_release_it_runs():
    """Adding ReleaseVersion at the value the group runs would send EKS an update to that same release."""
    kwargs = {"field": "f", "kubernetes_version": "1.36", "override": None, "unpinned": True}
    assert ami_release(live="1.36.5-20261119", **kwargs) is None
    assert ami_release(live="1.36.2-20260714", **kwargs) == versions.NODE_AMI_RELEASES["1.36"].version


def test_an_older_release_than_the_group_runs_is_refused_in_one_line():
    with pytest.raises(VersionStepRefused) as refused:
        ami_release(
            field="cluster.gpu_node_groups.decode.ami_release_version",
            kubernetes_version="1.36",
            override="1.36.2-20260714",
            live="1.36.3-20260903",
        )
    assert str(refused.value) == (
        "cluster.gpu_node_groups.decode.ami_release_version is 1.36.2-20260714 but the nodes run 1.36.3-20260903: an "
        "older release would take them back; set 1.36.3-20260903 or later, or remove it"
    )


def facts(**releases) -> DeployFacts:
    return DeployFacts(
        kubernetes_version="1.36",
        node_group_versions={"system": "1.36", "prefill": "1.36", "decode": "1.36"},
        node_ami_releases=releases,
    )


def test_one_node_group_rolls_to_a_new_release_per_deploy():
    config = dev()
    live = facts(system="1.36.3-20260903", prefill="1.36.2-20260714", decode="1.36.2-20260714")
    releases = node_releases(config.cluster, step_of(config.cluster, live), live)
    assert releases.rolls == "prefill"
    assert releases.releases == {"system": "1.36.3-20260903", "prefill": "1.36.3-20260903", "decode": "1.36.2-20260714"}
    assert releases.then == ("decode nodes to AMI release 1.36.3-20260903",)


def test_no_release_rolls_while_a_kubernetes_step_moves_a_version():
    config = dev()
    live = DeployFacts(
        kubernetes_version="1.36",
        node_group_versions={"system": "1.36", "prefill": "1.35", "decode": "1.35"},
        node_ami_releases={"system": "1.36.2-20260714", "prefill": "1.35.6-20260714", "decode": "1.35.6-20260714"},
    )
    step = step_of(config.cluster, live)
    assert step.rolls == "prefill"
    releases = node_releases(config.cluster, step, live)
    # prefill moves to 1.36 and takes 1.36's release with it; system's newer release waits.
    assert releases.rolls is None
    assert releases.releases["prefill"] == versions.NODE_AMI_RELEASES["1.36"].version
    assert releases.releases["system"] == "1.36.2-20260714"
    assert releases.releases["decode"] == "1.35.6-20260714"


def test_an_override_takes_a_newer_release_than_the_pin():
    config = dev(**{"gpu_node_groups.decode.ami_release_version": "1.36.5-20261119"})
    live = facts(system="1.36.3-20260903", prefill="1.36.3-20260903", decode="1.36.3-20260903")
    releases = node_releases(config.cluster, step_of(config.cluster, live), live)
    assert releases.rolls == "decode" and releases.releases["decode"] == "1.36.5-20261119"


# --- the config ---------------------------------------------------------------------------------------


def test_a_release_of_another_minor_is_refused_at_load():
    with pytest.raises(
        ConfigError,
        match=r"cluster\.gpu_node_groups\.prefill\.ami_release_version 1\.35\.6-20260714 is "
        r"not a release of Kubernetes 1\.36, which the group runs; set a 1\.36 release or leave it out",
    ):
        dev(**{"gpu_node_groups.prefill.ami_release_version": "1.35.6-20260714"})


def test_a_group_at_a_minor_without_a_pinned_release_must_name_one():
    with pytest.raises(
        ConfigError,
        match=r"the system nodes run Kubernetes 1\.33, for which config/versions\.py pins no "
        r"AMI release",
    ):
        with pytest.MonkeyPatch.context() as patch:
            patch.delitem(versions.NODE_AMI_RELEASES, "1.33")
            dev(**{"system_node_group.kubernetes_version": "1.33"})
    assert dev(**{"system_node_group.kubernetes_version": "1.33"}).cluster.node_group_versions()["system"] == "1.33"
