"""The Pod Security Standards checks (consumers/pod_security.py) against the Go package's own cases,
and the project's pods against them.

The violating cases and their expected texts come from k8s.io/pod-security-admission v0.36.2's
policy/check_*_test.go where it has one (cited per test); the checks also agree with every pass and
fail fixture of its test/testdata/{baseline,restricted}/v1.35 (checked when the mirror was written).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from consumers.pod_security import (
    BASELINE_CAPABILITIES,
    BASELINE_SYSCTLS,
    CHECK_IDS,
    LEVELS,
    RESTRICTED_VOLUME_TYPES,
    Violation,
    as_admitted,
    evaluate,
    message,
    namespace_labels,
    strictest_level,
    violations,
)
from tests.conftest import CONFIG_DIR, SHIPPED_ENVIRONMENTS, with_changes

# A container that passes every restricted check (and so every baseline one).
HARDENED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def container(name: str = "app", **security_context: Any) -> dict[str, Any]:
    """A container with ``securityContext`` exactly as given (none when nothing is)."""
    found: dict[str, Any] = {"name": name, "image": "registry.k8s.io/pause"}
    if security_context:
        found["securityContext"] = security_context
    return found


def hardened(name: str = "app", **overrides: Any) -> dict[str, Any]:
    return container(name, **{**copy.deepcopy(HARDENED), **overrides})


def pod(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"containers": list(containers) or [hardened()], **spec}


def the(check: str, spec: dict[str, Any], metadata: dict[str, Any] | None = None) -> Violation | None:
    """The one violation of ``check`` in ``spec``, or None."""
    found = [v for v in violations(spec, metadata) if v.check == check]
    assert len(found) <= 1
    return found[0] if found else None


def test_a_hardened_pod_is_restricted_and_a_bare_one_baseline():
    assert violations(pod()) == []
    assert strictest_level(pod()) == "restricted"
    bare = pod(container())
    assert strictest_level(bare) == "baseline"
    assert [v.check for v in violations(bare)] == [
        "allowPrivilegeEscalation",
        "capabilities_restricted",
        "runAsNonRoot",
        "seccompProfile_restricted",
    ]


def test_the_checks_are_the_go_packages_in_its_order():
    # registry.go populate: baseline IDs sorted, then restricted IDs sorted.
    assert CHECK_IDS == (
        "appArmorProfile",
        "capabilities_baseline",
        "hostNamespaces",
        "hostPathVolumes",
        "hostPorts",
        "hostProbesAndHostLifecycle",
        "privileged",
        "procMount",
        "seLinuxOptions",
        "seccompProfile_baseline",
        "sysctls",
        "windowsHostProcess",
        "allowPrivilegeEscalation",
        "capabilities_restricted",
        "procMount_restricted",
        "restrictedVolumes",
        "runAsNonRoot",
        "runAsUser",
        "seccompProfile_restricted",
    )


# --- baseline -------------------------------------------------------------------------------------


def test_host_namespaces():
    assert the("hostNamespaces", pod(hostNetwork=False)) is None
    assert the("hostNamespaces", pod(hostNetwork=True, hostPID=True, hostIPC=True)) == Violation(
        "hostNamespaces", "baseline", None, "host namespaces (hostNetwork=true, hostPID=true, hostIPC=true)"
    )


def test_privileged():
    assert the("privileged", pod(hardened(privileged=False))) is None
    # check_privileged_test.go
    spec = pod(container("a", privileged=True), container("b"), container("c", privileged=False))
    assert the("privileged", spec) == Violation(
        "privileged", "baseline", "a", 'privileged (container "a" must not set securityContext.privileged=true)'
    )


def test_capabilities_baseline():
    allowed = sorted(BASELINE_CAPABILITIES)
    assert the("capabilities_baseline", pod(container(capabilities={"add": allowed, "drop": ["NET_RAW"]}))) is None
    spec = pod(container("ray-worker", capabilities={"add": ["IPC_LOCK"]}))
    assert the("capabilities_baseline", spec) == Violation(
        "capabilities_baseline",
        "baseline",
        "ray-worker",
        'non-default capabilities (container "ray-worker" must not include "IPC_LOCK" in '
        "securityContext.capabilities.add)",
    )
    # check_capabilities_baseline_test.go: the capabilities print sorted and once.
    several = pod(
        container("a", capabilities={"add": ["FOO", "BAR"]}),
        container("b", capabilities={"add": ["BAR", "BAZ"]}),
        container("c", capabilities={"add": ["CHOWN"]}),
    )
    found = the("capabilities_baseline", several)
    assert found is not None and found.container is None
    assert found.detail == (
        'non-default capabilities (containers "a", "b" must not include "BAR", "BAZ", "FOO" in '
        "securityContext.capabilities.add)"
    )


def test_host_path_volumes():
    assert the("hostPathVolumes", pod(volumes=[{"name": "a", "emptyDir": {}}])) is None
    spec = pod(volumes=[{"name": "a", "emptyDir": {}}, {"name": "b", "hostPath": {"path": "/"}}])
    assert the("hostPathVolumes", spec) == Violation(
        "hostPathVolumes", "baseline", None, 'hostPath volumes (volume "b")'
    )


def test_host_ports():
    assert the("hostPorts", pod({**hardened(), "ports": [{"containerPort": 80, "hostPort": 0}]})) is None
    # check_hostPorts_test.go: containers named in order, ports sorted as strings.
    spec = pod(
        {**container("a"), "ports": [{"containerPort": 1, "hostPort": 0}]},
        {**container("b"), "ports": [{"containerPort": 1}, {"containerPort": 2, "hostPort": 10}, {"hostPort": 20}]},
        {**container("c"), "ports": [{"hostPort": 10}, {"hostPort": 30}]},
    )
    assert the("hostPorts", spec) == Violation(
        "hostPorts", "baseline", None, 'hostPort (containers "b", "c" use hostPorts 10, 20, 30)'
    )


def test_host_probes_and_host_lifecycle():
    probe = {"httpGet": {"port": 8080, "path": "/healthz"}}
    assert the("hostProbesAndHostLifecycle", pod({**hardened(), "livenessProbe": probe})) is None
    # check_hostProbesAndhostLifecycle_test.go: containers and hosts print sorted.
    spec = pod(
        {**hardened("invalid2"), "readinessProbe": {"tcpSocket": {"port": 1, "host": "b.com"}}},
        {**hardened("invalid1"), "lifecycle": {"preStop": {"httpGet": {"port": 1, "host": "a.com"}}}},
    )
    assert the("hostProbesAndHostLifecycle", spec) == Violation(
        "hostProbesAndHostLifecycle",
        "baseline",
        None,
        'probe or lifecycle host (containers "invalid1", "invalid2" use probe or lifecycle hosts "a.com", "b.com")',
    )


def test_app_armor_profile():
    ok = pod(
        hardened(appArmorProfile={"type": "RuntimeDefault"}),
        securityContext={"appArmorProfile": {"type": "Localhost", "localhostProfile": "p"}},
    )
    allowed_annotation = {"container.apparmor.security.beta.kubernetes.io/app": "runtime/default"}
    assert the("appArmorProfile", ok, {"annotations": allowed_annotation}) is None
    spec = pod(hardened("foo", appArmorProfile={"type": "Unconfined"}))
    assert the("appArmorProfile", spec) == Violation(
        "appArmorProfile",
        "baseline",
        "foo",
        'forbidden AppArmor profile (container "foo" must not set AppArmor profile type to "Unconfined")',
    )
    # check_appArmorProfile_test.go "multiple containers": the deprecated annotations count too.
    annotations = {
        "container.apparmor.security.beta.kubernetes.io/": "bogus",
        "container.apparmor.security.beta.kubernetes.io/a": "",
        "container.apparmor.security.beta.kubernetes.io/b": "runtime/default",
        "container.apparmor.security.beta.kubernetes.io/c": "localhost/",
        "container.apparmor.security.beta.kubernetes.io/e": "unconfined",
        "container.apparmor.security.beta.kubernetes.io/f": "unknown",
    }
    found = the("appArmorProfile", pod(), {"annotations": annotations})
    assert found is not None and found.container is None
    assert found.detail == (
        "forbidden AppArmor profiles (annotations must not set AppArmor profile type to "
        '"container.apparmor.security.beta.kubernetes.io/="bogus"", '
        '"container.apparmor.security.beta.kubernetes.io/e="unconfined"", '
        '"container.apparmor.security.beta.kubernetes.io/f="unknown"")'
    )


def test_se_linux_options():
    ok = pod(hardened(seLinuxOptions={"type": "container_engine_t", "level": "s0:c1"}))
    assert the("seLinuxOptions", ok) is None
    # check_seLinuxOptions_test.go
    spec = pod(
        hardened("e", seLinuxOptions={"type": "bar"}),
        hardened("f", seLinuxOptions={"user": "user"}),
        hardened("g", seLinuxOptions={"role": "role"}),
        securityContext={"seLinuxOptions": {"type": "foo", "user": "user", "role": "role"}},
    )
    assert the("seLinuxOptions", spec) == Violation(
        "seLinuxOptions",
        "baseline",
        None,
        'seLinuxOptions (pod and containers "e", "f", "g" set forbidden securityContext.seLinuxOptions: '
        'types "bar", "foo"; user may not be set; role may not be set)',
    )


def test_proc_mount_and_its_user_namespace_relaxation():
    assert the("procMount", pod(hardened(procMount="Default"))) is None
    spec = pod(hardened("a", procMount="Unmasked"))
    unmasked = 'procMount (container "a" must not set securityContext.procMount to "Unmasked")'
    assert the("procMount", spec) == Violation("procMount", "baseline", "a", unmasked)
    # check_procMount_baseline.go (v1.35): a pod in a user namespace may unmask /proc at baseline,
    # not at restricted (check_procMount_restricted.go).
    in_user_namespace = {**spec, "hostUsers": False}
    assert the("procMount", in_user_namespace) is None
    assert the("procMount_restricted", in_user_namespace) == Violation(
        "procMount_restricted", "restricted", "a", unmasked
    )
    assert strictest_level(in_user_namespace) == "baseline"


def test_seccomp_profile_baseline():
    assert the("seccompProfile_baseline", pod(container())) is None  # unset is fine at baseline
    spec = pod(
        container("a", seccompProfile={"type": "Unconfined"}),
        securityContext={"seccompProfile": {"type": "Unconfined"}},
    )
    assert the("seccompProfile_baseline", spec) == Violation(
        "seccompProfile_baseline",
        "baseline",
        None,
        'seccompProfile (pod and container "a" must not set securityContext.seccompProfile.type to "Unconfined")',
    )


def test_sysctls():
    safe = [{"name": name, "value": "1"} for name in sorted(BASELINE_SYSCTLS)]
    assert the("sysctls", pod(securityContext={"sysctls": safe})) is None
    assert "net.ipv4.tcp_rmem" in BASELINE_SYSCTLS  # v1.32's additions are in "latest"
    spec = pod(securityContext={"sysctls": [{"name": "net.core.somaxconn"}, {"name": "kernel.msgmax"}]})
    assert the("sysctls", spec) == Violation(
        "sysctls", "baseline", None, "forbidden sysctls (net.core.somaxconn, kernel.msgmax)"
    )


def test_windows_host_process():
    assert the("windowsHostProcess", pod(hardened(windowsOptions={"hostProcess": False}))) is None
    spec = pod(
        container("a", windowsOptions={"hostProcess": True}),
        container("b", windowsOptions={"hostProcess": True}),
        securityContext={"windowsOptions": {"hostProcess": True}},
    )
    assert the("windowsHostProcess", spec) == Violation(
        "windowsHostProcess",
        "baseline",
        None,
        'hostProcess (pod and containers "a", "b" must not set securityContext.windowsOptions.hostProcess=true)',
    )


# --- restricted -----------------------------------------------------------------------------------


def test_allow_privilege_escalation():
    assert the("allowPrivilegeEscalation", pod()) is None
    spec = pod(hardened("a", allowPrivilegeEscalation=True), container("b"), hardened("c"))
    assert the("allowPrivilegeEscalation", spec) == Violation(
        "allowPrivilegeEscalation",
        "restricted",
        None,
        'allowPrivilegeEscalation != false (containers "a", "b" must set securityContext.allowPrivilegeEscalation=false)',
    )
    # v1.25+: a windows pod is exempt (the field cannot be set there).
    assert the("allowPrivilegeEscalation", {**spec, "os": {"name": "windows"}}) is None


def test_capabilities_restricted():
    assert (
        the("capabilities_restricted", pod(hardened(capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]})))
        is None
    )
    # check_capabilities_restricted_test.go "multiple containers"
    spec = pod(
        container("a", capabilities={"add": ["FOO", "BAR"]}),
        container("b", capabilities={"add": ["BAR", "BAZ"]}),
        container("c", capabilities={"add": ["NET_BIND_SERVICE", "CHOWN"], "drop": ["ALL", "FOO"]}),
    )
    assert the("capabilities_restricted", spec) == Violation(
        "capabilities_restricted",
        "restricted",
        None,
        'unrestricted capabilities (containers "a", "b" must set securityContext.capabilities.drop=["ALL"]; '
        'containers "a", "b", "c" must not include "BAR", "BAZ", "CHOWN", "FOO" in securityContext.capabilities.add)',
    )
    # A baseline-allowed capability is still refused at restricted.
    chown = pod(hardened("a", capabilities={"drop": ["ALL"], "add": ["CHOWN"]}))
    assert the("capabilities_baseline", chown) is None
    assert the("capabilities_restricted", chown) == Violation(
        "capabilities_restricted",
        "restricted",
        "a",
        'unrestricted capabilities (container "a" must not include "CHOWN" in securityContext.capabilities.add)',
    )


def test_restricted_volumes():
    allowed = [{"name": kind, kind: {}} for kind in RESTRICTED_VOLUME_TYPES]
    assert the("restrictedVolumes", pod(volumes=allowed)) is None
    spec = pod(volumes=[{"name": "a", "hostPath": {"path": "/"}}, {"name": "b", "nfs": {"server": "s", "path": "/"}}])
    assert the("restrictedVolumes", spec) == Violation(
        "restrictedVolumes",
        "restricted",
        None,
        'restricted volume types (volumes "a", "b" use restricted volume types "hostPath", "nfs")',
    )


def test_run_as_non_root():
    assert the("runAsNonRoot", pod()) is None
    # check_runAsNonRoot_test.go "pod nil, container fallthrough"
    spec = pod(container("a"), container("b"))
    assert the("runAsNonRoot", spec) == Violation(
        "runAsNonRoot",
        "restricted",
        None,
        'runAsNonRoot != true (pod or containers "a", "b" must set securityContext.runAsNonRoot=true)',
    )
    # v1.35: hostUsers: false (a user namespace) is exempt.
    assert the("runAsNonRoot", {**spec, "hostUsers": False}) is None


def test_run_as_user():
    assert the("runAsUser", pod(hardened(runAsUser=1000), securityContext={"runAsUser": 1000})) is None
    spec = pod(hardened("a", runAsUser=0), securityContext={"runAsUser": 0})
    assert the("runAsUser", spec) == Violation(
        "runAsUser", "restricted", None, 'runAsUser=0 (pod and container "a" must not set runAsUser=0)'
    )
    assert the("runAsUser", {**spec, "hostUsers": False}) is None


def test_seccomp_profile_restricted():
    assert the("seccompProfile_restricted", pod()) is None
    # check_seccompProfile_restricted_test.go "no explicit seccomp"
    spec = pod(container("a"))
    assert the("seccompProfile_restricted", spec) == Violation(
        "seccompProfile_restricted",
        "restricted",
        "a",
        'seccompProfile (pod or container "a" must set securityContext.seccompProfile.type to "RuntimeDefault" or '
        '"Localhost")',
    )
    assert the("seccompProfile_restricted", {**spec, "os": {"name": "windows"}}) is None


# --- the pod-level fields and the containers they cover -------------------------------------------


def test_a_pod_level_run_as_non_root_covers_the_containers_that_leave_it_unset():
    without = {k: v for k, v in HARDENED.items() if k != "runAsNonRoot"}
    spec = pod(container("a", **without), container("b", **without), securityContext={"runAsNonRoot": True})
    assert the("runAsNonRoot", spec) is None
    # A container's own false wins over the pod's true.
    spec["containers"][1]["securityContext"]["runAsNonRoot"] = False
    assert the("runAsNonRoot", spec) == Violation(
        "runAsNonRoot",
        "restricted",
        "b",
        'runAsNonRoot != true (container "b" must not set securityContext.runAsNonRoot=false)',
    )
    # The pod's false is refused even when every container says true (check_runAsNonRoot_test.go).
    explicit = pod(hardened("a"), securityContext={"runAsNonRoot": False})
    assert the("runAsNonRoot", explicit) == Violation(
        "runAsNonRoot", "restricted", None, "runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false)"
    )


def test_a_pod_level_seccomp_profile_covers_the_containers_that_leave_it_unset():
    without = {k: v for k, v in HARDENED.items() if k != "seccompProfile"}
    spec = pod(container("a", **without), securityContext={"seccompProfile": {"type": "RuntimeDefault"}})
    assert the("seccompProfile_restricted", spec) is None
    assert strictest_level(spec) == "restricted"
    # A container's own profile wins: Unconfined is refused at baseline already.
    spec["containers"][0]["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    detail = 'seccompProfile (container "a" must not set securityContext.seccompProfile.type to "Unconfined")'
    assert the("seccompProfile_restricted", spec) == Violation("seccompProfile_restricted", "restricted", "a", detail)
    assert the("seccompProfile_baseline", spec) == Violation("seccompProfile_baseline", "baseline", "a", detail)
    assert strictest_level(spec) == "privileged"
    # A bad pod-level profile covers nothing: the containers that leave it unset are named too.
    bad_pod = pod(container("a", **without), securityContext={"seccompProfile": {"type": "Unconfined"}})
    assert the("seccompProfile_restricted", bad_pod) == Violation(
        "seccompProfile_restricted",
        "restricted",
        None,
        'seccompProfile (pod must not set securityContext.seccompProfile.type to "Unconfined")',
    )


def test_capabilities_and_allow_privilege_escalation_have_no_pod_level_field():
    # PodSecurityContext has neither: only the container's own securityContext counts.
    spec = pod(
        container("a", runAsNonRoot=True, seccompProfile={"type": "RuntimeDefault"}),
        securityContext={"runAsNonRoot": True},
    )
    assert {v.check for v in violations(spec)} == {"allowPrivilegeEscalation", "capabilities_restricted"}


def test_init_containers_and_ephemeral_containers_count():
    spec = pod(
        hardened("main"),
        initContainers=[container("init", capabilities={"add": ["IPC_LOCK"]})],
        ephemeralContainers=[container("debug", privileged=True)],
    )
    assert the("capabilities_baseline", spec) == Violation(
        "capabilities_baseline",
        "baseline",
        "init",
        'non-default capabilities (container "init" must not include "IPC_LOCK" in securityContext.capabilities.add)',
    )
    assert the("privileged", spec) == Violation(
        "privileged", "baseline", "debug", 'privileged (container "debug" must not set securityContext.privileged=true)'
    )
    # visitContainers' order: init containers, containers, ephemeral containers.
    found = the("allowPrivilegeEscalation", spec)
    assert found is not None
    assert found.detail == (
        'allowPrivilegeEscalation != false (containers "init", "debug" must set '
        "securityContext.allowPrivilegeEscalation=false)"
    )


# --- levels, overrides, messages, labels ----------------------------------------------------------


def test_a_restricted_check_replaces_the_baseline_check_it_overrides():
    spec = pod(hardened("a", capabilities={"add": ["IPC_LOCK"]}), volumes=[{"name": "h", "hostPath": {"path": "/"}}])
    at_baseline = [v.check for v in evaluate("baseline", spec)]
    at_restricted = [v.check for v in evaluate("restricted", spec)]
    assert at_baseline == ["capabilities_baseline", "hostPathVolumes"]
    assert at_restricted == ["capabilities_restricted", "restrictedVolumes"]
    assert evaluate("privileged", spec) == []
    assert [v.check for v in violations(spec)] == [*at_baseline, *at_restricted]
    assert strictest_level(spec) == "privileged"
    assert strictest_level(pod(hostNetwork=True)) == "privileged"


def test_the_message_is_podsecuritys():
    spec = pod(container("a"))
    assert message("baseline", spec) is None
    assert message("restricted", spec) == (
        'would violate PodSecurity "restricted:latest": allowPrivilegeEscalation != false (container "a" must set '
        'securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container "a" must set '
        'securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or container "a" must set '
        'securityContext.runAsNonRoot=true), seccompProfile (pod or container "a" must set '
        'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'
    )
    assert (message("restricted", spec, enforce=True) or "").startswith('violates PodSecurity "restricted:latest": ')


def test_the_api_servers_defaults_come_first():
    # SetDefaults_Volume: a volume naming no source is an emptyDir (restricted/v1.35/pass/restrictedvolumes0.yaml).
    assert the("restrictedVolumes", pod(volumes=[{"name": "scratch"}])) is None
    assert as_admitted({"volumes": [{"name": "scratch"}]})["volumes"] == [{"name": "scratch", "emptyDir": {}}]
    # SetDefaults_Pod: with hostNetwork, a port's hostPort defaults to its containerPort.
    spec = pod({**hardened("a"), "ports": [{"containerPort": 8080}]}, hostNetwork=True)
    assert the("hostPorts", spec) == Violation(
        "hostPorts", "baseline", "a", 'hostPort (container "a" uses hostPort 8080)'
    )


def test_namespace_labels():
    assert LEVELS == ("privileged", "baseline", "restricted")
    assert namespace_labels("baseline", warn="restricted", audit="restricted") == {
        "pod-security.kubernetes.io/enforce": "baseline",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/audit-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/warn-version": "latest",
    }
    assert namespace_labels("restricted", version="v1.36") == {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "v1.36",
    }
    with pytest.raises(ValueError, match="unknown Pod Security level"):
        namespace_labels("strict")
    with pytest.raises(ValueError, match='must be "latest" or "v1.x"'):
        namespace_labels("baseline", version="1.36")


# --- the project's pods ---------------------------------------------------------------------------

# The baseline violations the project accepts, by pod kind, each with its reason; any other
# baseline violation on any project pod fails test_the_projects_pods_break_baseline_only_where_allowed.
GPU_WORKER_BASELINE_ALLOWED = {
    # EFA: libfabric's efa provider registers (pins) the NIXL KV buffers with the device, which
    # needs CAP_IPC_LOCK (an unlimited memlock); manifests/ray_service.py worker_group adds it.
    (
        "capabilities_baseline",
        'non-default capabilities (container "ray-worker" must not include "IPC_LOCK" in '
        "securityContext.capabilities.add)",
    ),
}
OTHER_PODS_BASELINE_ALLOWED: set[tuple[str, str]] = set()  # the head, the mirror Job: nothing

# Every shipped config, and the variant whose workers gain an init container (the model streamer).
PROJECT_CONFIGS = (*SHIPPED_ENVIRONMENTS, "streaming")


def _config_data(name: str) -> dict:
    if name == "streaming":
        from tests.manifests.test_ray_service import streaming_data

        return streaming_data()
    return yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())


def project_pod_templates(config_name: str = "dev") -> dict[str, tuple[dict, dict, bool]]:
    """{pod name: (template metadata, pod spec, on a GPU)}: the RayService's head and worker groups,
    rendered as the project renders them (tests/manifests/test_ray_service.py manifest_for), and the
    model-mirror Job's pod."""
    from config.loader import parse_config
    from manifests.mirror_job import manifests as mirror_manifests
    from tests.conftest import rendered_ray_service

    data = _config_data(config_name)
    config = parse_config(data)
    cluster = rendered_ray_service(config)["spec"]["rayClusterConfig"]
    pods: dict[str, tuple[dict, dict, bool]] = {}
    head = cluster["headGroupSpec"]["template"]
    pods["head"] = (head.get("metadata") or {}, head["spec"], False)
    for group in cluster["workerGroupSpecs"]:
        template = group["template"]
        gpu = any(
            "nvidia.com/gpu" in (c.get("resources") or {}).get("limits", {}) for c in template["spec"]["containers"]
        )
        pods[group["groupName"]] = (template.get("metadata") or {}, template["spec"], gpu)
    mirror_config = parse_config(with_changes(data, {"model_mirror.enabled": True}))
    for item in mirror_manifests(mirror_config, repo="Qwen/Qwen2.5-7B-Instruct", prefix="qwen2.5-7b-instruct"):
        if item["kind"] == "Job":
            template = item["spec"]["template"]
            pods[f"job/{item['metadata']['name']}"] = (template.get("metadata") or {}, template["spec"], False)
    return pods


def project_pod_levels(config_name: str = "dev") -> dict[str, tuple[str, list[Violation]]]:
    """{pod name: (strictest level PodSecurity admits it at, every violation)} for the project's pods."""
    return {
        name: (strictest_level(spec, metadata), violations(spec, metadata))
        for name, (metadata, spec, _) in project_pod_templates(config_name).items()
    }


def report(levels: dict[str, tuple[str, list[Violation]]]) -> str:
    lines = []
    for name, (level, found) in levels.items():
        lines.append(f"{name}: {level}")
        lines += [f"  [{v.level}] {v.check}: {v.detail}" for v in found]
    return "\n".join(lines)


@pytest.mark.parametrize("config_name", PROJECT_CONFIGS)
def test_the_projects_pods_break_baseline_only_where_allowed(config_name, capsys):
    levels = project_pod_levels(config_name)
    with capsys.disabled():
        print(f"\n--- Pod Security levels of the {config_name} pods (templates) ---\n{report(levels)}")
    templates = project_pod_templates(config_name)
    assert any(gpu for _, _, gpu in templates.values()), "no GPU worker group rendered"
    for name, (_, found) in levels.items():
        allowed = GPU_WORKER_BASELINE_ALLOWED if templates[name][2] else OTHER_PODS_BASELINE_ALLOWED
        unexpected = [v for v in found if v.level == "baseline" and (v.check, v.detail) not in allowed]
        assert unexpected == [], f"{name}: a baseline violation not in the allow-list: {unexpected}"


# --- the pods as KubeRay creates them -------------------------------------------------------------


def as_kuberay_creates(spec: dict, *, head: bool, cluster: dict) -> dict:
    """A group's pod spec with what KubeRay 1.7.0 adds to it (ray-operator/controllers/ray/common/pod.go):
    the head's autoscaler sidecar when in-tree autoscaling is on (BuildAutoscalerContainer: no
    securityContext unless autoscalerOptions.securityContext sets one, mergeAutoscalerOverrides) with
    its ray-logs emptyDir, and the workers' wait-gcs-ready init container (DefaultWorkerPodTemplate,
    on unless the operator sets ENABLE_INIT_CONTAINER_INJECTION=false), which copies the Ray
    container's securityContext. The /dev/shm emptyDir is added only where nothing is mounted there."""
    spec = copy.deepcopy(spec)
    ray = spec["containers"][0]
    volumes = spec.setdefault("volumes", [])
    if not any(m.get("mountPath") == "/dev/shm" for m in ray.get("volumeMounts", [])):
        volumes.append({"name": "shared-mem", "emptyDir": {"medium": "Memory"}})
    if head and cluster.get("enableInTreeAutoscaling"):
        autoscaler: dict[str, Any] = {"name": "autoscaler", "image": ray["image"]}
        context = (cluster.get("autoscalerOptions") or {}).get("securityContext")
        if context is not None:
            autoscaler["securityContext"] = copy.deepcopy(context)
        spec["containers"].append(autoscaler)
        volumes.append({"name": "ray-logs", "emptyDir": {}})
    if not head:
        init = {"name": "wait-gcs-ready", "image": ray["image"]}
        if ray.get("securityContext") is not None:
            init["securityContext"] = copy.deepcopy(ray["securityContext"])
        spec.setdefault("initContainers", []).append(init)
    return spec


@pytest.mark.parametrize("config_name", PROJECT_CONFIGS)
def test_the_pods_kuberay_creates_reach_the_level_of_their_templates(config_name, capsys):
    """KubeRay's injected containers add no check the template does not already fail: the worker's
    init container copies its securityContext, but the head's autoscaler sidecar does not copy the
    head's, so hardening the head needs autoscalerOptions.securityContext too."""
    from config.loader import parse_config
    from tests.conftest import rendered_ray_service

    cluster = rendered_ray_service(parse_config(_config_data(config_name)))["spec"]["rayClusterConfig"]
    groups = {"head": (cluster["headGroupSpec"]["template"], True)}
    groups.update({g["groupName"]: (g["template"], False) for g in cluster["workerGroupSpecs"]})
    created = {}
    for name, (template, head) in groups.items():
        metadata = template.get("metadata") or {}
        spec = as_kuberay_creates(template["spec"], head=head, cluster=cluster)
        created[name] = (strictest_level(spec, metadata), violations(spec, metadata))
        assert created[name][0] == strictest_level(template["spec"], metadata), name
        assert {v.check for v in created[name][1]} == {v.check for v in violations(template["spec"], metadata)}, name
    with capsys.disabled():
        print(f"\n--- Pod Security levels of the {config_name} pods as KubeRay creates them ---\n{report(created)}")


@pytest.mark.parametrize("config_name", PROJECT_CONFIGS)
def test_the_namespace_enforces_the_strictest_level_every_pod_passes(config_name):
    """The serving namespace's labels follow the pods: harden the workers past IPC_LOCK and this test
    asks for the stricter label; break a pod and it asks for a looser one."""
    from manifests.ray_service import POD_SECURITY_LABELS

    levels = [level for level, _ in project_pod_levels(config_name).values()]
    strictest_for_all = min(levels, key=LEVELS.index)
    assert POD_SECURITY_LABELS["pod-security.kubernetes.io/enforce"] == strictest_for_all
    assert POD_SECURITY_LABELS == namespace_labels(strictest_for_all, warn="baseline", audit="baseline")
