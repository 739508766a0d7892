"""`make deploy` and `make preview`: the guard, the synth, the preview in serving terms, then cdk deploy.

    python -m cli.deploy CONFIG [--preview-only] [--template FILE] [--allow-replacement] [--require-approval never]

1. The deploy guard (`cli/deploy_guard.py`) checks the config, then your credentials, and reads what
   the stack is now: among others, the size each existing node group has (Cluster Autoscaler's).
2. The stack is synthesized with those facts: an existing node group's template leaves its
   DesiredSize out, so the deploy never resizes a group the autoscaler grew.
3. The CDK CLI's diff against the deployed template, read in serving terms (`cli/preview.py`).
   A node group the diff says is replaced is created anew, which needs a size: the stack is
   synthesized again with the new group starting at the old one's size, and previewed again.
4. Unless --preview-only: `cdk deploy` of exactly that assembly, importing resources a destroy kept
   (the guard names them) with --import-existing-resources. --preview-only records the template it
   showed (.preview-<stack>.json); --require-approval never (a pipeline, which has no terminal to
   approve broadened IAM at) deploys only that template, over the stack the preview compared it with.
   A rotation of the GCS store's AUTH token (config/token_rotation.py) calls ElastiCache and Secrets
   Manager itself: ROTATE before `cdk deploy`, SET after it.

--template FILE previews offline against a saved template: no guard, no credentials; the node
groups' sizes are the template's. Exits 2 on a refusal (an update CloudFormation would refuse among
them), 3 when something that holds state would be replaced or removed and --allow-replacement does
not say that is intended. What needs two deploys (the GCS store's replica and its failover; the
store and the CSI driver while the serving RayService still uses them) is synthesized as its first
step, and the preview names the next.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli import deploy_guard
from cli.preview import (
    NoDeployYet,
    PreviewRefused,
    preview,
    print_summary,
    read_template_file,
    template_from_cloudformation,
)
from cli.store_token import head_generation, rotate, set_alone, with_token_mounts
from cmdline import ArgumentParser
from config.loader import load_config_or_exit
from config.schema import DeployedStoreToken, DeployFacts
from config.token_rotation import RotationRefused, rotation_of
from config.upgrade import NODE_GROUP_ORDER
from manifests.contract import WORKER_GROUPS
from preview import cdk_diff
from preview.serving import (
    access_entry_ids,
    creator_is_admin,
    deployed_gcs_store,
    kubernetes_versions,
    live_users,
    node_group_sizes,
    placement_group_tags,
    ray_service_of,
    releases_in,
    replaced_node_groups,
    secrets_store_installed,
    secrets_store_mounted,
)
from verify.kube import Kube, KubectlRunner, KubeError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CDK = ROOT / "node_modules" / ".bin" / "cdk"
CDK_QUIET = ("--no-notices", "--no-version-reporting")


class SynthFailed(Exception):
    """The CDK app refused the config (its own message is already on stderr)."""


@dataclass
class Plan:
    """What one deploy is: the facts it was synthesized with, the preview, what it imports."""

    facts: DeployFacts
    summary: Any = None
    diff: str = ""
    first_deploy: bool = False
    to_import: list[str] = field(default_factory=list)


def synthesize(config_path: str, facts: DeployFacts, outdir: Path, *, cdk: Path = DEFAULT_CDK) -> None:
    """`cdk synth` of the config with these deploy facts into ``outdir``, as app.py reads them."""
    outdir.mkdir(parents=True, exist_ok=True)
    facts_file = outdir.parent / ".deploy-facts.json"
    facts_file.write_text(json.dumps(facts.model_dump(exclude_defaults=True)))
    command = [
        str(cdk),
        "synth",
        "--app",
        f"{sys.executable} app.py",
        "-c",
        f"config={config_path}",
        "-c",
        f"deploy_facts={facts_file.resolve()}",
        "--output",
        str(outdir),
        "--quiet",
        *CDK_QUIET,
    ]
    environment = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
    if subprocess.run(command, cwd=ROOT, env=environment, check=False).returncode != 0:
        raise SynthFailed(config_path)


def facts_with_replacements(facts: DeployFacts, new_template: dict, changes: list) -> DeployFacts | None:
    """The facts to synthesize again with, when the diff replaces an existing node group that the
    template leaves unsized (a create needs a size); None when the synthesized template stands."""
    replaced = [
        group
        for group in replaced_node_groups(new_template, changes)
        if group in facts.node_group_sizes and group not in facts.replaced_node_groups
    ]
    if not replaced:
        return None
    return facts.model_copy(update={"replaced_node_groups": sorted({*facts.replaced_node_groups, *replaced})})


def plan(config, config_path: str, *, outdir: Path, old: dict | None, facts: DeployFacts, cdk: Path) -> Plan:
    """Synthesizes with ``facts`` and previews against ``old`` (None: a first deploy), synthesizing
    once more when a node group is replaced."""
    synthesize(config_path, facts, outdir, cdk=cdk)
    if old is None:
        return Plan(facts=facts, first_deploy=True)
    diff, summary = preview(config, assembly=outdir, old=old, source=f"the deployed {config.stack_name}")
    new = json.loads((outdir / f"{config.stack_name}.template.json").read_text())
    again = facts_with_replacements(facts, new, summary.changes)
    if again is not None:
        print(
            f"replaced node group(s) {', '.join(again.replaced_node_groups)} start at their current size: synthesizing again"
        )
        synthesize(config_path, again, outdir, cdk=cdk)
        diff, summary = preview(config, assembly=outdir, old=old, source=f"the deployed {config.stack_name}")
        facts = again
    return Plan(facts=facts, summary=summary, diff=diff)


def facts_from_deployed(facts: DeployFacts, old: dict) -> DeployFacts:
    """What the deployed template itself tells the synth: the Kubernetes minors, add-on versions and AMI
    releases it runs (an upgrade moves one step per deploy; a pin never takes one back), what it holds that cannot change in place
    (how the cluster was created, the placement group's tags), the logical id of each principal's
    access entry, the GCS store's replica and failover (ElastiCache changes one per deploy), and what
    the serving RayService uses (the store, the CSI driver), which stays until a deploy after it."""
    cluster_version, group_versions = kubernetes_versions(old)
    addons, releases, unpinned = releases_in(old)
    return facts.model_copy(
        update={
            # What EKS said (the guard asks it) wins: a version can move outside the template (EKS
            # upgrades a cluster whose extended support ended; `aws eks update-nodegroup-version`).
            "kubernetes_version": facts.kubernetes_version or cluster_version,
            "node_group_versions": {**group_versions, **facts.node_group_versions},
            "addon_versions": {**addons, **facts.addon_versions},
            "node_ami_releases": {
                **{g: r for g, r in releases.items() if g in NODE_GROUP_ORDER},
                **facts.node_ami_releases,
            },
            "ami_release_unpinned": [g for g in unpinned if g in NODE_GROUP_ORDER],
            "access_entry_ids": access_entry_ids(old),
            "cluster_has_bootstrap_admin": creator_is_admin(old),
            "placement_group_tags": placement_group_tags(old),
            "gcs_store": deployed_gcs_store(old),
            "store_token": deployed_store_token(facts.store_token, old),
            "secrets_store_in_use": secrets_store_mounted(old),
        }
    )


def deployed_store_token(token: DeployedStoreToken | None, old: dict) -> DeployedStoreToken | None:
    """The store token as the guard read it, with the generation the deployed head carries; from the
    template alone offline (no secret, nothing rotated known)."""
    if deployed_gcs_store(old) is None:
        return token
    ray_service = ray_service_of(old) or {}
    generation = head_generation({"spec": ray_service.get("spec", {}).get("rayClusterConfig", {})})
    return (token or DeployedStoreToken()).model_copy(update={"generation": generation})


def token_step(config, facts: DeployFacts):
    """This deploy's step of the store token's rotation (config/token_rotation.py), None without a store."""
    store = config.ray_service.gcs_fault_tolerance.store
    if store is None or not config.gcs_fault_tolerant or facts.store_token is None:
        return None
    return rotation_of(store.auth_token_generation, facts.store_token)


def offline_facts(old: dict) -> DeployFacts:
    """Without credentials, the saved template says which node groups exist, and its sizes stand in for
    theirs."""
    sizes = {name: size for name, size in node_group_sizes(old).items() if name in ("system", "prefill", "decode")}
    return facts_from_deployed(DeployFacts.model_validate({"node_group_sizes": sizes}), old)


def deploy_command(
    outdir: Path, *, cdk: Path = DEFAULT_CDK, import_existing: bool = False, approval: str = "broadening"
) -> list[str]:
    command = [str(cdk), "deploy", "--app", str(outdir), *CDK_QUIET, "--require-approval", approval]
    if import_existing:
        command.append("--import-existing-resources")
    return [*command, "--progress", "events"]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def preview_record_path(outdir: Path, stack: str) -> Path:
    return outdir.parent / f".preview-{stack}.json"


def previewed(outdir: Path, stack: str, old: dict | None) -> dict[str, str | None]:
    """What a preview showed: the template it synthesized and the deployed one it compared with."""
    template = (outdir / f"{stack}.template.json").read_bytes()
    deployed = None if old is None else _sha256(json.dumps(old, sort_keys=True).encode())
    return {"stack": stack, "template_sha256": _sha256(template), "deployed_sha256": deployed}


def record_preview(outdir: Path, stack: str, old: dict | None) -> Path:
    """Writes what `make preview` showed, which a non-interactive `make deploy` must match."""
    path = preview_record_path(outdir, stack)
    path.write_text(json.dumps(previewed(outdir, stack, old), indent=1) + "\n")
    return path


def unattended_refusal(outdir: Path, stack: str, old: dict | None) -> str | None:
    """Why `make deploy REQUIRE_APPROVAL=never` may not deploy this assembly, or None: it deploys without
    asking only the template `make preview` showed, over the stack that preview compared it with."""
    path = preview_record_path(outdir, stack)
    rerun = "run `make preview` (with the same config, credentials and address), review it, then deploy again"
    try:
        shown = json.loads(path.read_text())
    except (OSError, ValueError):
        return (
            f"REQUIRE_APPROVAL=never deploys only what `make preview` showed, and {path.name} holds no preview: {rerun}"
        )
    now = previewed(outdir, stack, old)
    if shown.get("template_sha256") != now["template_sha256"]:
        return (
            f"REQUIRE_APPROVAL=never: the template about to be deployed (sha256 {now['template_sha256'][:12]}) is not "
            f"the one `make preview` showed ({str(shown.get('template_sha256'))[:12]}); {rerun}"
        )
    if shown.get("deployed_sha256") != now["deployed_sha256"]:
        return f"REQUIRE_APPROVAL=never: the deployed stack changed since `make preview` compared with it; {rerun}"
    return None


def guarded_facts(
    config, config_path: str, clients: dict[str, Any], checkip_url: str = deploy_guard.CHECKIP_URL
) -> tuple[DeployFacts, list[str]]:
    """The guard's verdict: the facts and the resources to import; raises SystemExit(2) on a refusal."""
    try:
        guard_clients = {key: client for key, client in clients.items() if key in deploy_guard.SERVICES}
        verdict = deploy_guard.check(config, config_path, checkip_url=checkip_url, **guard_clients)
    except Exception as exc:  # noqa: BLE001 - no credentials, no network: say so in one line
        print(f"cannot check the deployment with your AWS credentials: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if deploy_guard.report(verdict) != 0:
        raise SystemExit(2)
    return verdict.facts, list(getattr(verdict, "to_import", []))


def serving_worker_replicas(kube: Kube, *, namespace: str, name: str) -> dict[str, int]:
    """Each phase's worker replicas in the RayCluster the RayService serves from now."""
    rayservice = kube.get_json(["get", "rayservice", name, "-n", namespace])
    active = (rayservice.get("status", {}).get("activeServiceStatus") or {}).get("rayClusterName")
    for cluster in kube.get_json(["get", "rayclusters", "-n", namespace]).get("items", []):
        if active and cluster["metadata"]["name"] == active:
            return {
                WORKER_GROUPS[group["groupName"]]: int(group.get("replicas", 0))
                for group in cluster["spec"].get("workerGroupSpecs", [])
                if group.get("groupName") in WORKER_GROUPS
            }
    return {}


def with_worker_replicas(config, facts: DeployFacts, kube: Kube | None) -> DeployFacts:
    """The facts with the serving cluster's replicas, when the stack exists and kubectl can read them."""
    if not facts.node_group_sizes:
        return facts  # no stack yet, so no cluster
    rs = config.ray_service
    try:
        replicas = serving_worker_replicas(kube or KubectlRunner(), namespace=rs.namespace, name=rs.name)
    except KubeError as exc:
        print(
            f"warning: cannot read the serving RayCluster's replicas ({exc}); a NewCluster upgrade would start the "
            "new cluster at the config's sizes",
            file=sys.stderr,
        )
        return facts
    if replicas:
        print(f"serving replicas now: {', '.join(f'{phase} {n}' for phase, n in sorted(replicas.items()))}")
    return facts.model_copy(update={"worker_replicas": replicas})


def with_live_usage(config, facts: DeployFacts, old: dict, kube: Kube | None) -> DeployFacts:
    """What the deployed template keeps "for one deploy" (the GCS store, the Secrets Store CSI driver) is
    removed only when the live cluster shows that no RayCluster and no pod uses it; when the cluster
    cannot be asked (``kube`` None: an offline preview), it is kept, and the output says why. A stalled
    NewCluster rollout keeps the old cluster serving from the store for as long as it stalls."""
    store, driver = facts.gcs_store, secrets_store_installed(old)
    if (store is None or store.in_use) and (not driver or facts.secrets_store_in_use):
        return facts  # nothing the template alone would remove
    namespace = config.ray_service.namespace
    if kube is None:
        why = "offline (TEMPLATE=): the cluster is not asked"
        gcs, csi = ["an unknown RayCluster"], ["an unknown pod"]
    else:
        try:
            clusters = kube.get_json(["get", "rayclusters", "-n", namespace]).get("items", [])
            pods = kube.get_json(["get", "pods", "-n", namespace]).get("items", [])
        except KubeError as exc:
            why = f"cannot ask the cluster ({exc})"
            gcs, csi = ["an unknown RayCluster"], ["an unknown pod"]
        else:
            why = ""
            gcs, csi = live_users(clusters, pods)
    update: dict[str, Any] = {}
    if store is not None and not store.in_use and gcs:
        update["gcs_store"] = store.model_copy(update={"in_use": True})
        print(f"kept for this deploy: the GCS store, {why or 'used by ' + ', '.join(gcs)}")
    if driver and not facts.secrets_store_in_use and csi:
        update["secrets_store_in_use"] = True
        print(f"kept for this deploy: the Secrets Store CSI driver, {why or 'mounted by ' + ', '.join(csi)}")
    return facts.model_copy(update=update)


def main(argv: list[str] | None = None, *, clients: dict[str, Any] | None = None, kube: Kube | None = None) -> int:
    parser = ArgumentParser(prog="python -m cli.deploy", description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the environment's config, e.g. config/dev.yaml")
    parser.add_argument("--preview-only", action="store_true", help="stop after the preview (make preview)")
    parser.add_argument(
        "--template", type=Path, help="preview against a saved template (offline: no guard, no credentials)"
    )
    parser.add_argument(
        "--allow-replacement", action="store_true", help="deploy even when something that holds state is replaced"
    )
    parser.add_argument("--outdir", type=Path, default=Path("cdk.out"), help="the cloud assembly's folder")
    parser.add_argument("--cdk", type=Path, default=DEFAULT_CDK, help="the CDK CLI")
    parser.add_argument("--summary-only", action="store_true", help="print the serving summary without the CDK diff")
    parser.add_argument(
        "--require-approval",
        choices=("broadening", "never"),
        default="broadening",
        help="never: deploy without asking (a pipeline), only the template the last `make preview` showed",
    )
    parser.add_argument("--checkip-url", default=deploy_guard.CHECKIP_URL, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.template is not None and not args.preview_only:
        parser.error("--template previews only: add --preview-only (make preview TEMPLATE=…)")
    config = load_config_or_exit(args.config)
    to_import: list[str] = []
    try:
        if args.template is not None:
            old: dict | None = read_template_file(args.template)
            facts = with_token_mounts(config, with_live_usage(config, offline_facts(old), old, None), None)
        else:
            clients = clients or deploy_guard.aws_clients(config.aws.region)
            facts, to_import = guarded_facts(config, args.config, clients, args.checkip_url)
            facts = with_worker_replicas(config, facts, kube)
            try:
                old = template_from_cloudformation(config.stack_name, config.aws.region, clients["cloudformation"])
                kube = kube or KubectlRunner()
                facts = with_live_usage(config, facts_from_deployed(facts, old), old, kube)
                facts = with_token_mounts(config, facts, kube)
            except NoDeployYet as first:
                if args.preview_only:
                    raise
                print(f"First deploy of {config.stack_name}: every resource is created ({first}).")
                old = None
        result = plan(config, args.config, outdir=args.outdir, old=old, facts=facts, cdk=args.cdk)
    except (PreviewRefused, cdk_diff.DiffError) as refused:
        print(f"preview: {refused}", file=sys.stderr)
        return 2
    except SynthFailed:
        return 2
    if result.summary is not None:
        code = print_summary(
            config, result.diff, result.summary, summary_only=args.summary_only, allow=args.allow_replacement
        )
        if code != 0:
            return code
    for line in to_import:
        print(f"imported, not created: {line}")
    try:
        step = token_step(config, facts)
    except RotationRefused as refused:  # the synth refused it already; never reached
        print(str(refused), file=sys.stderr)
        return 2
    if step is not None and step.says:
        print(f"GCS store token: {step.says}")
    if args.preview_only:
        record = record_preview(args.outdir, config.stack_name, old)
        print(f"previewed template recorded in {record.name} (make deploy REQUIRE_APPROVAL=never deploys only it)")
        return 0
    if args.require_approval == "never" and (refusal := unattended_refusal(args.outdir, config.stack_name, old)):
        print(refusal, file=sys.stderr)
        return 2
    command = deploy_command(args.outdir, cdk=args.cdk, import_existing=bool(to_import), approval=args.require_approval)
    token = facts.store_token
    if step is not None and step.action == "rotate" and token is not None:
        version = rotate(token, **store_clients(config, clients))
        print(f"GCS store token rotated: version {version} is current, the old token still accepted")
    code = subprocess.run(command, cwd=ROOT, check=False).returncode
    if code == 0 and step is not None and step.action == "set" and token is not None:
        set_alone(token, **store_clients(config, clients))
        print("GCS store token set: the old token is refused from now")
    return code


def store_clients(config, clients: dict[str, Any] | None) -> dict[str, Any]:
    """The ElastiCache and Secrets Manager clients the token's rotation calls (the given ones, in tests)."""
    if clients and "elasticache" in clients:
        return {"elasticache": clients["elasticache"], "secretsmanager": clients["secretsmanager"]}
    import boto3

    session = boto3.Session(region_name=config.aws.region)
    return {"elasticache": session.client("elasticache"), "secretsmanager": session.client("secretsmanager")}


if __name__ == "__main__":
    sys.exit(main())
