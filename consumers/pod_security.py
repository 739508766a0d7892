"""The Pod Security Standards as the kube-apiserver's PodSecurity admission checks them, mirrored.

The real consumer is Go: k8s.io/pod-security-admission (the `policy/check_*.go` files, also at
kubernetes/kubernetes `staging/src/k8s.io/pod-security-admission/policy/`), which cannot run here.
This module mirrors the checks of its v0.36.x tag (Kubernetes 1.36) at version "latest", and each
check's comment names the Go file and the check ID it mirrors; the levels and their fields are
documented at https://kubernetes.io/docs/concepts/security/pod-security-standards/.

What is mirrored, and how:

- "latest" means the newest revision of every check: the registry (`policy/registry.go`) caps
  "latest" at the highest `MinimumVersion` any check declares, v1.35 in Kubernetes 1.36 (the
  `procMount`, `procMount_restricted`, `runAsNonRoot` and `runAsUser` revisions for user-namespace
  pods). Older revisions (the seccomp annotations of v1.0-v1.18, the shorter sysctl lists) are not.
- Every check visits init containers, containers and ephemeral containers, in that order
  (`policy/visitor.go` `visitContainers`), so a KubeRay-injected init container counts as much as
  the Ray container.
- A baseline namespace runs the baseline checks; a restricted one runs the restricted checks plus
  the baseline checks that no restricted check overrides (`OverrideCheckIDs`): `capabilities_restricted`
  replaces `capabilities_baseline`, `restrictedVolumes` replaces `hostPathVolumes`,
  `seccompProfile_restricted` replaces `seccompProfile_baseline`, `procMount_restricted` replaces
  `procMount`. Checks run baseline IDs first, then restricted IDs, each sorted (`populate`), which
  is the order of the reasons in PodSecurity's message.
- A failed check reads "<reason> (<detail>)", and a level's message is those joined with ", "
  (`policy/checks.go` `ForbiddenDetail`), prefixed as `admission/admission.go` `EvaluatePod` does:
  `violates PodSecurity "baseline:latest": ...` when enforced, `would violate ...` as a warning or
  an audit annotation.

Where PodSecurity looks: enforce applies to Pods only; for the workload kinds it knows (Deployment,
Job, ...) it evaluates the pod template for warn and audit alone (`ValidatePodController`). A
RayService or RayCluster is none of them, so its pods are judged only when KubeRay creates them,
with the containers KubeRay injects (the head's autoscaler sidecar, the workers' `wait-gcs-ready`
init container), and a refusal shows as KubeRay failing to create the pod, not at `kubectl apply`.

CDK-free, and no Kubernetes client: pod specs are plain mappings in the API's JSON field names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LEVELS = ("privileged", "baseline", "restricted")
# The k8s.io/pod-security-admission tag mirrored (Kubernetes 1.36), and what "latest" evaluates.
MIRRORED_VERSION = "v0.36.2"
LATEST_POLICY_VERSION = "v1.35"

# api/constants.go: the namespace labels.
LABEL_PREFIX = "pod-security.kubernetes.io/"
# api/helpers.go ParseVersion: "latest" or "v1.x".
_VERSION = re.compile(r"^v1\.([0-9]|[1-9][0-9]*)$")


@dataclass(frozen=True)
class Violation:
    """One failed check, as PodSecurity reports it."""

    check: str  # the Go check's ID ("capabilities_baseline")
    level: str  # "baseline" or "restricted": the lowest level it violates
    # The one container at fault; None when the pod itself (a pod-level field, a volume, an
    # annotation) or more than one container is.
    container: str | None
    # "<reason> (<detail>)", as it reads in PodSecurity's message.
    detail: str


@dataclass(frozen=True)
class _Failure:
    reason: str
    detail: str
    containers: tuple[str, ...] = ()  # the containers at fault, in the order the detail names them
    pod: bool = False  # a pod-level field, a volume or an annotation is at fault


@dataclass(frozen=True)
class _Check:
    id: str
    level: str
    run: Callable[[Mapping[str, Any], Mapping[str, Any]], _Failure | None]
    overrides: tuple[str, ...] = ()  # baseline check IDs it replaces in a restricted namespace


# --- policy/helpers.go, policy/visitor.go ---------------------------------------------------------


def _join_quote(items: Sequence[str]) -> str:
    """``joinQuote``."""
    return '"' + '", "'.join(items) + '"' if items else ""


def _pluralize(singular: str, plural: str, count: int) -> str:
    """``pluralize``."""
    return singular if count == 1 else plural


def _go_quote(value: str) -> str:
    """Go's ``%q`` for the annotation values the checks print (printable text as is)."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    out = []
    for char in value:
        if char in escapes:
            out.append(escapes[char])
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x80:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) <= 0xFFFF:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return '"' + "".join(out) + '"'


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _containers(pod_spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """``visitContainers``: init containers, containers, then ephemeral containers (whose fields are
    the container's, inline)."""
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod_spec.get(key) or ():
            yield _map(container)


def _name(container: Mapping[str, Any]) -> str:
    return str(container.get("name", ""))


def _security_context(item: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A container's or the pod's ``securityContext``; None where it is nil."""
    context = item.get("securityContext")
    return context if isinstance(context, Mapping) else None


def _field(context: Mapping[str, Any] | None, key: str) -> Any:
    """A pointer field of a security context: None where the context or the field is nil."""
    return None if context is None else context.get(key)


def _set_of_containers(names: Sequence[str]) -> str:
    """``"container \"a\""`` / ``"containers \"a\", \"b\""``, the setter phrase many checks build."""
    return f"{_pluralize('container', 'containers', len(names))} {_join_quote(names)}"


def _relax_for_user_namespace(pod_spec: Mapping[str, Any]) -> bool:
    """``relaxPolicyForUserNamespacePod``: the pod sets ``hostUsers: false``."""
    return pod_spec.get("hostUsers") is False


def _windows(pod_spec: Mapping[str, Any]) -> bool:
    """``podSpec.OS != nil && podSpec.OS.Name == corev1.Windows``."""
    return _map(pod_spec.get("os")).get("name") == "windows"


# --- baseline -------------------------------------------------------------------------------------


def _host_namespaces(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # hostNamespaces (policy/check_hostNamespaces.go, hostNamespaces_1_0): spec.hostNetwork,
    # spec.hostPID and spec.hostIPC must be unset or false. PSS "Host Namespaces".
    found = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if pod_spec.get(key) is True]
    if found:
        return _Failure("host namespaces", ", ".join(found), pod=True)
    return None


def _privileged(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # privileged (policy/check_privileged.go, privileged_1_0): no container may set
    # securityContext.privileged=true. PSS "Privileged Containers".
    bad = [_name(c) for c in _containers(pod_spec) if _field(_security_context(c), "privileged") is True]
    if bad:
        return _Failure(
            "privileged", f"{_set_of_containers(bad)} must not set securityContext.privileged=true", tuple(bad)
        )
    return None


# policy/check_capabilities_baseline.go capabilities_allowed_1_0 (PSS "Capabilities"): what a
# container may add at baseline; the container runtime's default set.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)


def _capabilities_baseline(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # capabilities_baseline (policy/check_capabilities_baseline.go, capabilitiesBaseline_1_0): every
    # capability in securityContext.capabilities.add must be in BASELINE_CAPABILITIES; dropping is free.
    bad: list[str] = []
    added: set[str] = set()
    for container in _containers(pod_spec):
        capabilities = _field(_security_context(container), "capabilities")
        if not isinstance(capabilities, Mapping):
            continue
        forbidden = [str(c) for c in capabilities.get("add") or () if str(c) not in BASELINE_CAPABILITIES]
        if forbidden:
            added.update(forbidden)
            bad.append(_name(container))
    if bad:
        return _Failure(
            "non-default capabilities",
            f"{_set_of_containers(bad)} must not include {_join_quote(sorted(added))} in securityContext.capabilities.add",
            tuple(bad),
        )
    return None


def _host_path_volumes(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # hostPathVolumes (policy/check_hostPathVolumes.go, hostPathVolumes_1_0): no hostPath volume.
    # PSS "HostPath Volumes". Replaced by restrictedVolumes in a restricted namespace.
    bad = [str(v.get("name", "")) for v in map(_map, pod_spec.get("volumes") or ()) if v.get("hostPath") is not None]
    if bad:
        return _Failure("hostPath volumes", f"{_pluralize('volume', 'volumes', len(bad))} {_join_quote(bad)}", pod=True)
    return None


def _host_ports(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # hostPorts (policy/check_hostPorts.go, hostPorts_1_0): every containerPort's hostPort must be
    # unset or 0. PSS "Host Ports". The ports print sorted as strings (sets.String.List).
    bad: list[str] = []
    ports: set[str] = set()
    for container in _containers(pod_spec):
        used = [str(p.get("hostPort")) for p in map(_map, container.get("ports") or ()) if p.get("hostPort") or 0]
        if used:
            ports.update(used)
            bad.append(_name(container))
    if bad:
        return _Failure(
            "hostPort",
            f"{_set_of_containers(bad)} {_pluralize('uses', 'use', len(bad))} "
            f"{_pluralize('hostPort', 'hostPorts', len(ports))} {', '.join(sorted(ports))}",
            tuple(bad),
        )
    return None


def _host_probes_and_host_lifecycle(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # hostProbesAndHostLifecycle (policy/check_hostProbesAndhostLifecycle.go,
    # hostProbesAndHostLifecycleV1Dot34, v1.34+): no httpGet.host or tcpSocket.host in a liveness,
    # readiness or startup probe, nor in a postStart or preStop handler. PSS "Host Probes / Lifecycle
    # Hooks". Unlike the other checks it names the containers sorted (sets.List).
    def hosts(handler: Any) -> list[str]:
        handler = _map(handler)
        return [
            str(_map(handler.get(kind)).get("host"))
            for kind in ("httpGet", "tcpSocket")
            if handler.get(kind) is not None and _map(handler.get(kind)).get("host")
        ]

    bad: set[str] = set()
    forbidden: set[str] = set()
    for container in _containers(pod_spec):
        lifecycle = _map(container.get("lifecycle"))
        handlers = [container.get(p) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        handlers += [lifecycle.get("postStart"), lifecycle.get("preStop")]
        for handler in handlers:
            found = hosts(handler)
            if found:
                bad.add(_name(container))
                forbidden.update(found)
    if bad:
        names = sorted(bad)
        return _Failure(
            "probe or lifecycle host",
            f"{_set_of_containers(names)} {_pluralize('uses', 'use', len(names))} "
            f"{_pluralize('probe or lifecycle host', 'probe or lifecycle hosts', len(forbidden))} "
            f"{_join_quote(sorted(forbidden))}",
            tuple(names),
        )
    return None


# corev1: the deprecated AppArmor annotation (read by the check even though the field replaced it).
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"


def _app_armor_profile(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # appArmorProfile (policy/check_appArmorProfile.go, appArmorProfile_1_0): securityContext.appArmorProfile.type,
    # pod or container, must be RuntimeDefault or Localhost if set, and an AppArmor annotation must
    # be empty, "runtime/default" or "localhost/*". PSS "AppArmor".
    setters: list[str] = []
    values: set[str] = set()
    allowed = ("RuntimeDefault", "Localhost")
    profile = _field(_security_context(pod_spec), "appArmorProfile")
    if isinstance(profile, Mapping) and profile.get("type", "") not in allowed:
        setters.append("pod")
        values.add(str(profile.get("type", "")))
    bad: list[str] = []
    for container in _containers(pod_spec):
        profile = _field(_security_context(container), "appArmorProfile")
        if isinstance(profile, Mapping) and profile.get("type", "") not in allowed:
            bad.append(_name(container))
            values.add(str(profile.get("type", "")))
    if bad:
        setters.append(_set_of_containers(bad))
    annotations = sorted(
        f"{key}={_go_quote(str(value))}"
        for key, value in _map(metadata.get("annotations")).items()
        if str(key).startswith(APPARMOR_ANNOTATION_PREFIX)
        and not (value in ("", "runtime/default") or str(value).startswith("localhost/"))
    )
    listed = sorted(values) + annotations
    if annotations:
        setters.append(_pluralize("annotation", "annotations", len(annotations)))
    if setters:
        return _Failure(
            _pluralize("forbidden AppArmor profile", "forbidden AppArmor profiles", len(listed)),
            f"{' and '.join(setters)} must not set AppArmor profile type to {_join_quote(listed)}",
            tuple(bad),
            pod=setters[0] == "pod" or bool(annotations),
        )
    return None


# policy/check_seLinuxOptions.go selinuxAllowedTypes1_31 (PSS "SELinux"): the types allowed from v1.31.
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})


def _se_linux_options(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # seLinuxOptions (policy/check_seLinuxOptions.go, seLinuxOptions1_31): seLinuxOptions.type, pod
    # or container, must be in SELINUX_TYPES; user and role must not be set.
    types: set[str] = set()
    flags = {"user": False, "role": False}

    def valid(options: Mapping[str, Any]) -> bool:
        ok = True
        if options.get("type", "") not in SELINUX_TYPES:
            ok = False
            types.add(str(options.get("type", "")))
        for key in flags:
            if options.get(key):
                ok = False
                flags[key] = True
        return ok

    setters: list[str] = []
    options = _field(_security_context(pod_spec), "seLinuxOptions")
    if isinstance(options, Mapping) and not valid(options):
        setters.append("pod")
    bad: list[str] = []
    for container in _containers(pod_spec):
        options = _field(_security_context(container), "seLinuxOptions")
        if isinstance(options, Mapping) and not valid(options):
            bad.append(_name(container))
    if bad:
        setters.append(_set_of_containers(bad))
    if setters:
        data = []
        if types:
            data.append(f"{_pluralize('type', 'types', len(types))} {_join_quote(sorted(types))}")
        data += [f"{key} may not be set" for key, was_set in flags.items() if was_set]
        return _Failure(
            "seLinuxOptions",
            f"{' and '.join(setters)} set forbidden securityContext.seLinuxOptions: {'; '.join(data)}",
            tuple(bad),
            pod=setters[0] == "pod",
        )
    return None


def _unmasked_proc_mount(pod_spec: Mapping[str, Any]) -> _Failure | None:
    """``procMount_1_0``: securityContext.procMount must be unset or "Default"."""
    bad: list[str] = []
    kinds: set[str] = set()
    for container in _containers(pod_spec):
        proc_mount = _field(_security_context(container), "procMount")
        if proc_mount is not None and proc_mount != "Default":
            bad.append(_name(container))
            kinds.add(str(proc_mount))
    if bad:
        return _Failure(
            "procMount",
            f"{_set_of_containers(bad)} must not set securityContext.procMount to {_join_quote(sorted(kinds))}",
            tuple(bad),
        )
    return None


def _proc_mount(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # procMount (policy/check_procMount_baseline.go, procMount1_35baseline): procMount must be
    # unset or "Default", except in a pod with hostUsers: false (a user namespace) from v1.35.
    # PSS "/proc Mount Type".
    return None if _relax_for_user_namespace(pod_spec) else _unmasked_proc_mount(pod_spec)


def _seccomp_profile_baseline(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # seccompProfile_baseline (policy/check_seccompProfile_baseline.go, seccompProfileBaseline_1_19):
    # a seccompProfile.type set on the pod or a container must be RuntimeDefault or Localhost; unset is
    # fine at baseline. PSS "Seccomp". (The seccomp annotations were checked before v1.19 only.)
    return _seccomp(pod_spec, require=False)


# policy/check_sysctls.go sysctlsAllowedV1Dot32 (PSS "Sysctls"): the namespaced, safe sysctls a pod may set.
BASELINE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)


def _sysctls(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # sysctls (policy/check_sysctls.go, sysctlsV1Dot32): every spec.securityContext.sysctls[*].name
    # must be in BASELINE_SYSCTLS; listed in the pod's order.
    sysctls = _field(_security_context(pod_spec), "sysctls") or ()
    bad = [str(_map(s).get("name", "")) for s in sysctls if _map(s).get("name", "") not in BASELINE_SYSCTLS]
    if bad:
        return _Failure("forbidden sysctls", ", ".join(bad), pod=True)
    return None


def _windows_host_process(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # windowsHostProcess (policy/check_windowsHostProcess.go, windowsHostProcess_1_0):
    # securityContext.windowsOptions.hostProcess, pod or container, must be unset or false.
    # PSS "HostProcess".
    def host_process(item: Mapping[str, Any]) -> bool:
        return _map(_field(_security_context(item), "windowsOptions")).get("hostProcess") is True

    bad = [_name(c) for c in _containers(pod_spec) if host_process(c)]
    setters = ["pod"] if host_process(pod_spec) else []
    if bad:
        setters.append(_set_of_containers(bad))
    if setters:
        return _Failure(
            "hostProcess",
            f"{' and '.join(setters)} must not set securityContext.windowsOptions.hostProcess=true",
            tuple(bad),
            pod=setters[0] == "pod",
        )
    return None


# --- restricted -----------------------------------------------------------------------------------


def _allow_privilege_escalation(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # allowPrivilegeEscalation (policy/check_allowPrivilegeEscalation.go, allowPrivilegeEscalation_1_25):
    # every container must set securityContext.allowPrivilegeEscalation=false (unset fails); a pod
    # with spec.os.name: windows is exempt. PSS "Privilege Escalation".
    if _windows(pod_spec):
        return None
    bad = [
        _name(c) for c in _containers(pod_spec) if _field(_security_context(c), "allowPrivilegeEscalation") is not False
    ]
    if bad:
        return _Failure(
            "allowPrivilegeEscalation != false",
            f"{_set_of_containers(bad)} must set securityContext.allowPrivilegeEscalation=false",
            tuple(bad),
        )
    return None


def _capabilities_restricted(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # capabilities_restricted (policy/check_capabilities_restricted.go, capabilitiesRestricted_1_25):
    # every container must drop "ALL" and add nothing but NET_BIND_SERVICE; a windows pod is exempt.
    # Overrides capabilities_baseline. PSS "Capabilities" (restricted).
    if _windows(pod_spec):
        return None
    missing_drop: list[str] = []
    adding: list[str] = []
    forbidden: set[str] = set()
    for container in _containers(pod_spec):
        capabilities = _field(_security_context(container), "capabilities")
        if not isinstance(capabilities, Mapping):
            missing_drop.append(_name(container))
            continue
        if "ALL" not in [str(c) for c in capabilities.get("drop") or ()]:
            missing_drop.append(_name(container))
        added = [str(c) for c in capabilities.get("add") or () if str(c) != "NET_BIND_SERVICE"]
        if added:
            forbidden.update(added)
            adding.append(_name(container))
    details = []
    if missing_drop:
        details.append(f'{_set_of_containers(missing_drop)} must set securityContext.capabilities.drop=["ALL"]')
    if adding:
        details.append(
            f"{_set_of_containers(adding)} must not include {_join_quote(sorted(forbidden))} in "
            "securityContext.capabilities.add"
        )
    if details:
        culprits = tuple(dict.fromkeys([*missing_drop, *adding]))
        return _Failure("unrestricted capabilities", "; ".join(details), culprits)
    return None


def _proc_mount_restricted(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # procMount_restricted (policy/check_procMount_restricted.go, procMount_1_0 from v1.35): the
    # unconditional procMount check, user namespace or not. Overrides procMount.
    return _unmasked_proc_mount(pod_spec)


# policy/check_restrictedVolumes.go (PSS "Volume Types"): the volume sources allowed at restricted,
# and the names the check gives the others, in its switch's order.
RESTRICTED_VOLUME_TYPES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
_NAMED_VOLUME_TYPES = (
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "fc",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
)


def _restricted_volumes(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # restrictedVolumes (policy/check_restrictedVolumes.go, restrictedVolumes_1_0): every volume must
    # be one of RESTRICTED_VOLUME_TYPES. Overrides hostPathVolumes.
    bad: list[str] = []
    kinds: set[str] = set()
    for volume in map(_map, pod_spec.get("volumes") or ()):
        if any(volume.get(kind) is not None for kind in RESTRICTED_VOLUME_TYPES):
            continue
        bad.append(str(volume.get("name", "")))
        kinds.add(next((kind for kind in _NAMED_VOLUME_TYPES if volume.get(kind) is not None), "unknown"))
    if bad:
        return _Failure(
            "restricted volume types",
            f"{_pluralize('volume', 'volumes', len(bad))} {_join_quote(bad)} {_pluralize('uses', 'use', len(bad))} "
            f"{_pluralize('restricted volume type', 'restricted volume types', len(kinds))} {_join_quote(sorted(kinds))}",
            pod=True,
        )
    return None


def _run_as_non_root(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # runAsNonRoot (policy/check_runAsNonRoot.go, runAsNonRoot1_35): the pod's securityContext.runAsNonRoot=true
    # covers every container that leaves it unset; a container's own value wins; false anywhere fails
    # (and is reported first). A pod with hostUsers: false is exempt from v1.35. PSS "Running as Non-root".
    if _relax_for_user_namespace(pod_spec):
        return None
    setters: list[str] = []
    pod_value = _field(_security_context(pod_spec), "runAsNonRoot")
    if pod_value is not None and not pod_value:
        setters.append("pod")
    pod_non_root = bool(pod_value)
    explicit: list[str] = []
    implicit: list[str] = []
    for container in _containers(pod_spec):
        value = _field(_security_context(container), "runAsNonRoot")
        if value is not None:
            if not value:
                explicit.append(_name(container))
        elif not pod_non_root:
            implicit.append(_name(container))
    if explicit:
        setters.append(_set_of_containers(explicit))
    if setters:
        return _Failure(
            "runAsNonRoot != true",
            f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false",
            tuple(explicit),
            pod=setters[0] == "pod",
        )
    if implicit:
        return _Failure(
            "runAsNonRoot != true",
            f"pod or {_set_of_containers(implicit)} must set securityContext.runAsNonRoot=true",
            tuple(implicit),
        )
    return None


def _run_as_user(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # runAsUser (policy/check_runAsUser.go, runAsUser1_35): neither the pod nor a container may set
    # runAsUser=0 (unset is fine: runAsNonRoot is what refuses a root image). A pod with
    # hostUsers: false is exempt from v1.35. PSS "Running as Non-root user".
    if _relax_for_user_namespace(pod_spec):
        return None

    def root(item: Mapping[str, Any]) -> bool:
        value = _field(_security_context(item), "runAsUser")
        return value is not None and value is not False and value == 0

    setters = ["pod"] if root(pod_spec) else []
    bad = [_name(c) for c in _containers(pod_spec) if root(c)]
    if bad:
        setters.append(_set_of_containers(bad))
    if setters:
        return _Failure(
            "runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0", tuple(bad), pod=setters[0] == "pod"
        )
    return None


def _seccomp(pod_spec: Mapping[str, Any], *, require: bool) -> _Failure | None:
    """``seccompProfileBaseline_1_19`` (require=False) and ``seccompProfileRestricted_1_19`` (require=True)."""
    allowed = ("RuntimeDefault", "Localhost")
    setters: list[str] = []
    values: set[str] = set()
    pod_set = False
    profile = _field(_security_context(pod_spec), "seccompProfile")
    if isinstance(profile, Mapping):
        if profile.get("type", "") not in allowed:
            setters.append("pod")
            values.add(str(profile.get("type", "")))
        else:
            pod_set = True
    explicit: list[str] = []
    implicit: list[str] = []
    for container in _containers(pod_spec):
        profile = _field(_security_context(container), "seccompProfile")
        if isinstance(profile, Mapping):
            if profile.get("type", "") not in allowed:
                explicit.append(_name(container))
                values.add(str(profile.get("type", "")))
        elif not pod_set:
            implicit.append(_name(container))
    if explicit:
        setters.append(_set_of_containers(explicit))
    if setters:
        return _Failure(
            "seccompProfile",
            f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to {_join_quote(sorted(values))}",
            tuple(explicit),
            pod=setters[0] == "pod",
        )
    if require and implicit:
        return _Failure(
            "seccompProfile",
            f'pod or {_set_of_containers(implicit)} must set securityContext.seccompProfile.type to "RuntimeDefault" '
            'or "Localhost"',
            tuple(implicit),
        )
    return None


def _seccomp_profile_restricted(pod_spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> _Failure | None:
    # seccompProfile_restricted (policy/check_seccompProfile_restricted.go, seccompProfileRestricted_1_25):
    # the pod's seccompProfile (RuntimeDefault or Localhost) covers every container that leaves it
    # unset; a container's own profile wins; a bad value anywhere is reported first. A windows pod is
    # exempt. Overrides seccompProfile_baseline. PSS "Seccomp" (restricted).
    return None if _windows(pod_spec) else _seccomp(pod_spec, require=True)


# --- policy/registry.go ---------------------------------------------------------------------------

_BASELINE = [
    _Check("appArmorProfile", "baseline", _app_armor_profile),
    _Check("capabilities_baseline", "baseline", _capabilities_baseline),
    _Check("hostNamespaces", "baseline", _host_namespaces),
    _Check("hostPathVolumes", "baseline", _host_path_volumes),
    _Check("hostPorts", "baseline", _host_ports),
    _Check("hostProbesAndHostLifecycle", "baseline", _host_probes_and_host_lifecycle),
    _Check("privileged", "baseline", _privileged),
    _Check("procMount", "baseline", _proc_mount),
    _Check("seLinuxOptions", "baseline", _se_linux_options),
    _Check("seccompProfile_baseline", "baseline", _seccomp_profile_baseline),
    _Check("sysctls", "baseline", _sysctls),
    _Check("windowsHostProcess", "baseline", _windows_host_process),
]
_RESTRICTED = [
    _Check("allowPrivilegeEscalation", "restricted", _allow_privilege_escalation),
    _Check("capabilities_restricted", "restricted", _capabilities_restricted, ("capabilities_baseline",)),
    _Check("procMount_restricted", "restricted", _proc_mount_restricted, ("procMount",)),
    _Check("restrictedVolumes", "restricted", _restricted_volumes, ("hostPathVolumes",)),
    _Check("runAsNonRoot", "restricted", _run_as_non_root),
    _Check("runAsUser", "restricted", _run_as_user),
    _Check("seccompProfile_restricted", "restricted", _seccomp_profile_restricted, ("seccompProfile_baseline",)),
]
# populate: baseline IDs sorted, then restricted IDs sorted (Go sorts bytes, as Python sorts these).
CHECKS: tuple[_Check, ...] = (*sorted(_BASELINE, key=lambda c: c.id), *sorted(_RESTRICTED, key=lambda c: c.id))
CHECK_IDS = tuple(check.id for check in CHECKS)
_OVERRIDDEN = frozenset(o for check in _RESTRICTED for o in check.overrides)


def _checks_for(level: str) -> list[_Check]:
    """``checkRegistry.EvaluatePod``'s checks for a level: none for privileged; the restricted ones
    with the baseline ones no restricted check overrides."""
    if level not in LEVELS:
        raise ValueError(f"unknown Pod Security level {level!r}: one of {', '.join(LEVELS)}")
    if level == "privileged":
        return []
    if level == "baseline":
        return [c for c in CHECKS if c.level == "baseline"]
    return [c for c in CHECKS if c.level == "restricted" or c.id not in _OVERRIDDEN]


def _violation(check: _Check, failure: _Failure) -> Violation:
    culprits = set(failure.containers)
    container = failure.containers[0] if len(culprits) == 1 and not failure.pod else None
    detail = f"{failure.reason} ({failure.detail})" if failure.detail else failure.reason
    return Violation(check=check.id, level=check.level, container=container, detail=detail)


def as_admitted(pod_spec: Mapping) -> dict[str, Any]:
    """The pod spec as PodSecurity sees it: admission runs after the API server's defaulting
    (kubernetes ``pkg/apis/core/v1/defaults.go``), two of whose defaults the checks read.
    ``SetDefaults_Volume``: a volume that names no source is an emptyDir. ``SetDefaults_Pod``
    (``defaultHostNetworkPorts``): with ``hostNetwork: true`` every container and init container
    port without a hostPort gets its containerPort as the hostPort; a Pod's, not a pod template's."""
    spec = dict(pod_spec)
    sources = (*RESTRICTED_VOLUME_TYPES, *_NAMED_VOLUME_TYPES)
    if spec.get("volumes"):
        spec["volumes"] = [
            volume if any(_map(volume).get(s) is not None for s in sources) else {**_map(volume), "emptyDir": {}}
            for volume in spec["volumes"]
        ]
    if spec.get("hostNetwork") is True:
        for key in ("containers", "initContainers"):
            if spec.get(key):
                spec[key] = [
                    {
                        **_map(c),
                        "ports": [
                            {**_map(p), "hostPort": _map(p).get("hostPort") or _map(p).get("containerPort", 0)}
                            for p in _map(c).get("ports") or ()
                        ],
                    }
                    if _map(c).get("ports")
                    else c
                    for c in spec[key]
                ]
    return spec


def _run(checks: Sequence[_Check], pod_spec: Mapping, metadata: Mapping | None) -> list[Violation]:
    meta = _map(metadata)
    spec = as_admitted(pod_spec)
    found = []
    for check in checks:
        failure = check.run(spec, meta)
        if failure is not None:
            found.append(_violation(check, failure))
    return found


def evaluate(level: str, pod_spec: Mapping, metadata: Mapping | None = None) -> list[Violation]:
    """What a namespace at ``level`` (version latest) refuses in this pod, check by check, in
    PodSecurity's order; empty when the pod is allowed."""
    return _run(_checks_for(level), pod_spec, metadata)


def violations(pod_spec: Mapping, metadata: Mapping | None = None) -> list[Violation]:
    """Every check the pod fails, baseline checks then restricted ones, each once with the lowest
    level it violates. A restricted check that overrides a baseline one (capabilities, volumes,
    seccomp, procMount) is listed beside it when both fail."""
    return _run(CHECKS, pod_spec, metadata)


def strictest_level(pod_spec: Mapping, metadata: Mapping | None = None) -> str:
    """The strictest level whose enforcement admits the pod: "restricted", "baseline" or "privileged"."""
    for level in ("restricted", "baseline"):
        if not evaluate(level, pod_spec, metadata):
            return level
    return "privileged"


def message(
    level: str, pod_spec: Mapping, metadata: Mapping | None = None, *, enforce: bool = False, version: str = "latest"
) -> str | None:
    """PodSecurity's text for the pod at ``level`` (``admission.go`` ``EvaluatePod``): the refusal when
    ``enforce``, else the warning (and audit annotation); None when the level admits the pod."""
    found = evaluate(level, pod_spec, metadata)
    if not found:
        return None
    verb = "violates" if enforce else "would violate"
    return f'{verb} PodSecurity "{level}:{version}": ' + ", ".join(v.detail for v in found)


def namespace_labels(
    enforce: str, *, warn: str | None = None, audit: str | None = None, version: str = "latest"
) -> dict[str, str]:
    """The ``pod-security.kubernetes.io/*`` labels of a namespace (``api/constants.go``), each mode's
    level with its version label. Refuses what ``api/helpers.go`` ``PolicyToEvaluate`` could not
    parse (it would enforce restricted:latest on a bad enforce label, and ignore a bad warn or audit).
    A namespace without a warn label warns at its enforce level."""
    if not (version == "latest" or _VERSION.match(version)):
        raise ValueError(f'Pod Security version {version!r}: must be "latest" or "v1.x"')
    labels: dict[str, str] = {}
    for mode, level in (("enforce", enforce), ("audit", audit), ("warn", warn)):
        if level is None:
            continue
        if level not in LEVELS:
            raise ValueError(f"{mode}: unknown Pod Security level {level!r}: one of {', '.join(LEVELS)}")
        labels[f"{LABEL_PREFIX}{mode}"] = level
        labels[f"{LABEL_PREFIX}{mode}-version"] = version
    return labels
