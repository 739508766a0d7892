"""The RayService: its manifest against KubeRay's own CRD schema, and its CDK wiring."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from config.loader import parse_config
from kuberay.rules import validate_ray_service
from manifests.contract import RAY_HEAD_SERVICE_ACCOUNT, RAY_WORKER_SERVICE_ACCOUNT
from serve_app.serve_config import IMPORT_PATH
from serve_app.spec import ServingSpec
from tests.conftest import (
    CONFIG_DIR,
    RAYSERVICE_CRD,
    RAYSERVICE_CRD_SHA256,
    ROOT,
    SHIPPED_ENVIRONMENTS,
    best_schema_error,
    checked_schema_validator,
    rendered_ray_service,
    synth_variant,
    with_changes,
)


def test_vendored_crd_is_kuberay_170_verbatim():
    import hashlib

    assert hashlib.sha256(RAYSERVICE_CRD.read_bytes()).hexdigest() == RAYSERVICE_CRD_SHA256


@pytest.fixture(scope="module")
def rayservice_schema():
    """KubeRay's RayService schema as a validator (checked_schema_validator)."""
    from consumers.kubernetes import strict_structural

    crd = yaml.load(RAYSERVICE_CRD.read_text(), Loader=yaml.CSafeLoader)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = copy.deepcopy(v1["schema"]["openAPIV3Schema"])
    strict_structural(schema)
    return checked_schema_validator(schema)


def validate(schema, manifest) -> None:
    """jsonschema.validate's answer (the best-matching error, raised) without checking the schema again."""
    body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind", "metadata")}
    error = best_schema_error(schema, body)
    if error is not None:
        raise error
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayService"


def manifest_for(env: str, **changes):
    config = parse_config(with_changes(yaml.safe_load((CONFIG_DIR / f"{env}.yaml").read_text()), changes))
    return config, checked(rendered_ray_service(config))


def checked(manifest: dict) -> dict:
    """Every manifest these tests render also passes KubeRay's controller rules."""
    validate_ray_service(manifest)
    return manifest


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_manifest_validates_against_kuberay_crd(rayservice_schema, env):
    _, manifest = manifest_for(env)
    validate(rayservice_schema, manifest)


def test_manifest_with_internal_nlb_validates(rayservice_schema):
    _, manifest = manifest_for(
        "dev",
        **{
            "ray_service.endpoint": {
                "internal_nlb": True,
                "allowed_cidrs": ["10.0.0.0/8"],
                "open_to_vpc_without_key": True,
            }
        },
    )
    validate(rayservice_schema, manifest)
    service = manifest["spec"]["serveService"]
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["loadBalancerSourceRanges"] == ["10.0.0.0/8"]
    assert service["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-scheme"] == "internal"


@pytest.mark.parametrize(
    ("breakage", "why"),
    [
        (lambda m: m["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].pop("groupName"), "groupName"),
        (lambda m: m["spec"]["rayClusterConfig"]["headGroupSpec"].pop("template"), "template"),
        (lambda m: m["spec"]["rayClusterConfig"].update(workerGroupSpecs={}), "is not of type 'array'"),
        (lambda m: m["spec"].update(serveConfig={"importPath": "x"}), "serveConfig"),
        (
            lambda m: m["spec"]["rayClusterConfig"]["workerGroupSpecs"][1].update(maxReplicas="2"),
            "'2' is not of type 'integer'",
        ),
    ],
    ids=["no-group-name", "no-head-template", "groups-not-a-list", "unknown-field", "string-replicas"],
)
def test_schema_check_catches_broken_manifests(rayservice_schema, breakage, why):
    _, manifest = manifest_for("dev")
    breakage(manifest)
    with pytest.raises(jsonschema.ValidationError, match=re.escape(why)):
        validate(rayservice_schema, manifest)


def test_ray_version_matches_image():
    config, manifest = manifest_for("dev")
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == "2.58.0"
    images = {
        c["image"]
        for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
        for c in group["template"]["spec"]["containers"]
    }
    assert images == {"763104351884.dkr.ecr.us-east-2.amazonaws.com/ray:serve-llm-cuda-v1.0.0"}


def test_head_runs_on_system_node_without_gpus():
    _, manifest = manifest_for("dev")
    head = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    pod = head["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "system"}
    (container,) = pod["containers"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in container["env"]
    assert container["resources"]["requests"] == container["resources"]["limits"] == {"cpu": "2", "memory": "8Gi"}
    assert {"containerPort": 8000, "name": "serve"} in container["ports"]


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_worker_group_pinned_to_its_phase(phase):
    _, manifest = manifest_for("dev")
    (group,) = [g for g in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == f"{phase}-gpu"]
    assert group["resources"] == {"CPU": "28", "GPU": "1", f"pd_{phase}": "1"}
    assert group["rayStartParams"] == {}
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (1, 1, 2)
    pod = group["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "gpu", "pd-serving/phase": phase}
    assert {t["key"] for t in pod["tolerations"]} == {"nvidia.com/gpu", "aws.amazon.com/efa"}
    (container,) = pod["containers"]
    limits = container["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1" and limits["vpc.amazonaws.com/efa"] == "1"
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    env = {e["name"]: e for e in container["env"]}
    assert env["FI_PROVIDER"]["value"] == "efa"
    assert env["VLLM_HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # Pod Identity brings no region; the streamer and Ray's S3 downloads need the stack's.
    assert env["AWS_REGION"]["value"] == env["AWS_DEFAULT_REGION"]["value"] == "us-east-2"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    (volume,) = pod["volumes"]
    assert volume["emptyDir"]["medium"] == "Memory"
    port = {"prefill": 20000, "decode": 22000}[phase]
    assert {"containerPort": port, "name": "nixl-side"} in container["ports"]


def test_worker_pods_declare_the_nixl_port_the_engines_listen_on():
    config, manifest = manifest_for("dev", **{"serving.kv_transfer.side_channel_port_base": 31000})
    for phase in ("prefill", "decode"):
        (group,) = [
            g for g in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == f"{phase}-gpu"
        ]
        ports = group["template"]["spec"]["containers"][0]["ports"]
        listening = config.serving.experimental_configs(phase)["NIXL_SIDE_CHANNEL_PORT_BASE"]
        assert listening == {"prefill": 31000, "decode": 33000}[phase]
        assert {"containerPort": listening, "name": "nixl-side"} in ports


def test_serve_config_v2_is_one_app_whose_args_are_the_spec():
    config, manifest = manifest_for("dev")
    serve = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    (app,) = serve["applications"]
    assert app["import_path"] == IMPORT_PATH
    assert app["runtime_env"] == {"working_dir": "s3://bucket/code.zip"}
    assert ServingSpec.model_validate(app["args"]) == config.serving


@pytest.mark.parametrize(
    "changes, parser",
    [
        ({}, "hermes"),
        ({"serving.tool_call_parser": "llama3_json"}, "llama3_json"),
        ({"serving.tool_call_parser": "none"}, None),
    ],
    ids=["qwen2.5-family-default", "named", "off"],
)
def test_tool_calling_reaches_every_phase_of_the_served_app_alike(changes, parser):
    _, manifest = manifest_for("dev", **changes)
    (app,) = yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"]
    spec = ServingSpec.model_validate(app["args"])
    assert spec.model.source.startswith("Qwen/Qwen2.5-")
    for phase in ("prefill", "decode", "colocated"):
        engine_kwargs = spec.llm_config(phase)["engine_kwargs"]
        assert engine_kwargs.get("tool_call_parser") == parser
        assert engine_kwargs.get("enable_auto_tool_choice", False) is (parser is not None)


def test_upgrade_strategy_keeps_endpoint_up():
    _, manifest = manifest_for("dev")
    assert manifest["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    assert manifest["spec"]["rayClusterDeletionDelaySeconds"] > 0


# CDK wiring --------------------------------------------------------------------------------------


def _manifests(template) -> list[dict]:
    found = []
    for resource in template.find_resources("Custom::AWSCDK-EKS-KubernetesResource").values():
        body = resource["Properties"]["Manifest"]
        text = body if isinstance(body, str) else json.dumps(body)
        found.append({"raw": text, "resource": resource})
    return found


def test_rayservice_manifest_depends_on_kuberay_and_service_account(synthesized):
    _, stack, template, _, _ = synthesized("dev")
    resources = template.to_json()["Resources"]
    (rayservice_id,) = [
        k
        for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
        and "RayService" in json.dumps(r["Properties"]["Manifest"])
    ]
    depends = resources[rayservice_id].get("DependsOn", [])
    kuberay_chart = [
        k
        for k, r in resources.items()
        if r["Type"] == "Custom::AWSCDK-EKS-HelmChart" and r["Properties"]["Chart"] == "kuberay-operator"
    ]
    assert kuberay_chart[0] in depends
    assert any("ServiceAccount" in d for d in depends)


def test_serve_app_is_an_asset_read_through_pod_identity(synthesized):
    _, stack, template, _, outdir = synthesized("dev")
    for account in (RAY_HEAD_SERVICE_ACCOUNT, RAY_WORKER_SERVICE_ACCOUNT):
        template.has_resource_properties(
            "AWS::EKS::PodIdentityAssociation", {"Namespace": "llm", "ServiceAccount": account}
        )
    serve_config = stack.serving.serve_config_v2
    url = yaml.safe_load(serve_config)["applications"][0]["runtime_env"]["working_dir"]
    assert re.match(r"^s3://cdk-[a-z0-9]+-assets-000000000000-us-east-2/[0-9a-f]{64}\.zip$", url)
    policies = json.dumps(template.find_resources("AWS::IAM::Policy"))
    asset_key = url.rsplit("/", 1)[1]
    # Only this one object of the shared assets bucket is readable.
    assert '"Action": "s3:GetObject"' in policies and f"/{asset_key}" in policies
    assert "s3:List" not in policies
    assets = json.loads((outdir / "pd-dev-pd-serving.assets.json").read_text())["files"]
    asset_hash = url.rsplit("/", 1)[1].removesuffix(".zip")
    assert asset_hash in assets


def test_serve_app_change_changes_the_asset(tmp_path):
    from cdk_constructs.ray_service import SERVE_APP_DIR, stage_serve_app

    copy_dir = tmp_path / "serve_app"
    import shutil

    shutil.copytree(SERVE_APP_DIR, copy_dir, ignore=shutil.ignore_patterns("__pycache__"))
    first = stage_serve_app(copy_dir)
    (copy_dir / "app.py").write_text((copy_dir / "app.py").read_text() + "\n# changed\n")
    second = stage_serve_app(copy_dir)
    packaged = ("working_dir", "serve_app")
    assert first.joinpath(*packaged, "app.py").read_text() != second.joinpath(*packaged, "app.py").read_text()
    assert first.joinpath(*packaged, "spec.py").is_file()
    assert not list(first.rglob("__pycache__"))


def test_gated_model_secret_is_granted_not_embedded(tmp_path):
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["serving"]["model"] = {
        "model_id": "llama-3.1-8b",
        "source": "meta-llama/Llama-3.1-8B-Instruct",
        "gated": True,
        "hf_token_secret": "pd-serving/hf-token",
    }
    stack, template = synth_variant(tmp_path, data, "gated")
    policies = json.dumps(template.find_resources("AWS::IAM::Policy"))
    assert "secretsmanager:GetSecretValue" in policies
    assert "secret:pd-serving/hf-token" in policies
    serve_config = stack.serving.serve_config_v2
    assert "hf_token_secret: pd-serving/hf-token" in serve_config
    assert "HF_TOKEN" not in serve_config


def test_s3_mirrored_model_is_readable(tmp_path):
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    config_json = tmp_path / "config.json"
    config_json.write_text(
        json.dumps(
            {
                "num_hidden_layers": 28,
                "hidden_size": 3584,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "intermediate_size": 18944,
                "vocab_size": 152064,
                "torch_dtype": "bfloat16",
            }
        )
    )
    data["serving"]["model"] = {
        "model_id": "qwen",
        "source": "s3://my-models/qwen2.5-7b",
        "source_region": "us-east-2",
        "config_json": str(config_json),
    }
    stack, template = synth_variant(tmp_path, data, "s3")
    policies = json.dumps(template.find_resources("AWS::IAM::Policy"))
    assert "my-models/qwen2.5-7b/*" in policies
    assert '"s3:prefix": ["qwen2.5-7b/*"]' in policies
    serve_config = yaml.safe_load(stack.serving.serve_config_v2)
    spec = ServingSpec.model_validate(serve_config["applications"][0]["args"])
    decode = spec.llm_config("decode")
    assert decode["model_loading_config"]["model_source"] == {"bucket_uri": "s3://my-models/qwen2.5-7b"}
    # Streamed, not downloaded: vLLM reads the safetensors from S3 and is told the URI on Ray 2.58 too.
    assert decode["engine_kwargs"]["load_format"] == "runai_streamer"
    assert decode["callback_config"] == {
        "callback_class": "serve_app.callbacks:EngineCallbacks",
        "callback_kwargs": {"kv_transfer": True, "model_uri": "s3://my-models/qwen2.5-7b"},
    }


def test_outputs_port_forward_and_base_url(synthesized):
    _, _, template, _, _ = synthesized("dev")
    outputs = template.to_json()["Outputs"]
    assert outputs["PortForwardCommand"]["Value"] == "kubectl -n llm port-forward svc/pd-llm-serve-svc 8000:8000"
    assert outputs["OpenAiBaseUrl"]["Value"].startswith("http://127.0.0.1:8000/v1")


def streaming_data() -> dict:
    """dev with its weights streamed from S3 by vLLM's Run:ai streamer."""
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["serving"]["model"] = {
        "model_id": "qwen",
        "source": "s3://my-models/qwen2.5-7b",
        "source_region": "us-east-2",
        "hub_id": "Qwen/Qwen2.5-7B-Instruct",
    }
    return data


def test_streaming_workers_install_the_model_streamer_the_image_lacks(variant):
    from config.versions import MODEL_STREAMER_PACKAGES
    from manifests.ray_service import MODEL_STREAMER_DIR

    stack, _, _ = variant("streaming", streaming_data())
    cluster = stack.serving.manifest_body["spec"]["rayClusterConfig"]
    assert "initContainers" not in cluster["headGroupSpec"]["template"]["spec"]
    for group in cluster["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        (install,) = pod["initContainers"]
        assert install["image"] == pod["containers"][0]["image"]
        script = install["command"][-1]
        assert all(f"{package} --hash=sha256:" in script for package in MODEL_STREAMER_PACKAGES)
        assert f"--target {MODEL_STREAMER_DIR} " in script and "--require-hashes" in script
        # Guaranteed: every container's requests equal its limits, the init container's too.
        for container in (install, pod["containers"][0]):
            assert container["resources"]["requests"] == container["resources"]["limits"], container["name"]
            assert {"cpu", "memory"} <= set(container["resources"]["limits"])
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["PYTHONPATH"] == MODEL_STREAMER_DIR
        assert {"name": "model-streamer", "mountPath": MODEL_STREAMER_DIR, "readOnly": True} in pod["containers"][0][
            "volumeMounts"
        ]
    # A Hugging Face model installs nothing.
    _, default = manifest_for("dev")
    assert all(
        "initContainers" not in g["template"]["spec"] for g in default["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    )


@pytest.mark.serving
def test_ray_keeps_the_containers_pythonpath_behind_the_working_dir(monkeypatch):
    """Ray's own function (the same in 2.58.0): the streamer's directory stays importable in every
    worker process that a working_dir puts first on the path."""
    from ray._private.runtime_env.context import RuntimeEnvContext
    from ray._private.runtime_env.working_dir import set_pythonpath_in_context

    from manifests.ray_service import MODEL_STREAMER_DIR

    monkeypatch.setenv("PYTHONPATH", MODEL_STREAMER_DIR)
    context = RuntimeEnvContext()
    set_pythonpath_in_context("/tmp/ray/session_latest/runtime_resources/working_dir_files/abc", context)
    assert context.env_vars["PYTHONPATH"].split(":") == [
        "/tmp/ray/session_latest/runtime_resources/working_dir_files/abc",
        MODEL_STREAMER_DIR,
    ]


def test_streamer_packages_are_the_locked_ones():
    from config.versions import MODEL_STREAMER_PACKAGES

    lock = (ROOT / "requirements-serve.txt").read_text().splitlines()
    for package in MODEL_STREAMER_PACKAGES:
        assert package in lock, f"{package} is not what requirements-serve.txt locks"


def _run_install_script(tmp_path, *, wheels_from=None, pinned=None, **env_overrides):
    """The init container's script, run by sh with this venv's Python, pip and boto3, writing where
    ``tmp_path`` says."""
    import os
    import subprocess
    import sys

    from manifests.ray_service import model_streamer_install_script

    script = model_streamer_install_script(
        wheels_from=wheels_from,
        pinned=pinned,
        target=str(tmp_path / "target"),
        scratch=str(tmp_path / "scratch"),
        termination_log=str(tmp_path / "log"),
    )
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "AWS_"))}
    env = {**inherited, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env_overrides}
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=180)


def _tiny_wheel(directory: Path, name: str, version: str) -> tuple[str, str]:
    """A minimal, valid pure-Python wheel (one module); its requirement line's (file name, sha256)."""
    import hashlib
    import zipfile

    file = f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(directory / file, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", f"VERSION = {version!r}\n")
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return file, hashlib.sha256((directory / file).read_bytes()).hexdigest()


@pytest.fixture
def mirrored_wheels(tmp_path):
    """Two wheels in a bucket of an S3-compatible server on loopback, as `make mirror-model` leaves them."""
    from local.code_asset import LocalS3
    from mirror.job import mirror_wheels

    built = tmp_path / "built"
    built.mkdir()
    pinned = {f"{name}==1.0": _tiny_wheel(built, name, "1.0") for name in ("streamer_a", "streamer_b")}
    with LocalS3() as server:
        s3 = server.client("s3")
        s3.create_bucket(Bucket="pd-dev-models", CreateBucketConfiguration={"LocationConstraint": server.region})
        assert mirror_wheels(bucket="pd-dev-models", prefix="_wheels/model-streamer", directory=built, s3=s3) == 0
        yield server, s3, pinned


def test_the_streamer_installs_from_the_mirror_bucket_without_any_index(tmp_path, mirrored_wheels):
    """The init container's own script: boto3 fetches the wheels from S3, pip installs them with no
    index at all (a PyPI that cannot be reached plays no part), each against its hash."""
    server, _, pinned = mirrored_wheels
    done = _run_install_script(
        tmp_path,
        wheels_from=("pd-dev-models", "_wheels/model-streamer"),
        pinned=pinned,
        PIP_INDEX_URL="http://127.0.0.1:9/simple",
        PIP_CONFIG_FILE="/dev/null",
        **server.env,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "target" / "streamer_a" / "__init__.py").is_file()
    assert (tmp_path / "target" / "streamer_b" / "__init__.py").is_file()
    assert not (tmp_path / "log").exists()


def test_a_mirror_without_the_wheels_stops_the_pod_at_once_and_says_to_mirror(tmp_path, mirrored_wheels):
    server, s3, pinned = mirrored_wheels
    s3.delete_object(Bucket="pd-dev-models", Key=f"_wheels/model-streamer/{pinned['streamer_b==1.0'][0]}")
    done = _run_install_script(
        tmp_path, wheels_from=("pd-dev-models", "_wheels/model-streamer"), pinned=pinned, **server.env
    )
    assert done.returncode == 1
    message = (tmp_path / "log").read_text()
    assert "s3://pd-dev-models/_wheels/model-streamer/" in message and "make mirror-model" in message
    assert not (tmp_path / "target" / "streamer_a").exists()


def test_a_mirrored_wheel_with_other_bytes_is_refused(tmp_path, mirrored_wheels):
    server, s3, pinned = mirrored_wheels
    file, _ = pinned["streamer_a==1.0"]
    substitute = tmp_path / "substitute"
    substitute.mkdir()
    _tiny_wheel(substitute, "streamer_a", "1.0")
    (substitute / file).write_bytes((substitute / file).read_bytes() + b"\0")
    s3.upload_file(str(substitute / file), "pd-dev-models", f"_wheels/model-streamer/{file}")
    done = _run_install_script(
        tmp_path, wheels_from=("pd-dev-models", "_wheels/model-streamer"), pinned=pinned, **server.env
    )
    assert done.returncode == 1
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr


def test_the_pinned_wheel_files_are_the_pinned_packages_for_the_serving_images_python():
    """The file names the pods fetch from the mirror are the ones pip picks for the image's Python
    (cp313) and platform: the same name and version as the requirement, and a tag pip accepts there."""
    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename

    from config.versions import MODEL_STREAMER_PACKAGES, MODEL_STREAMER_PLATFORM, MODEL_STREAMER_WHEEL_FILES

    platform, python = MODEL_STREAMER_PLATFORM
    major, minor = (int(part) for part in python.split("."))
    glibc_minor = int(platform.split("_")[2])
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(glibc_minor, 16, -1)] + ["linux_x86_64"]
    accepted = {
        *cpython_tags((major, minor), platforms=platforms),
        *compatible_tags((major, minor), interpreter=f"cp{major}{minor}", platforms=platforms),
    }
    assert set(MODEL_STREAMER_WHEEL_FILES) == set(MODEL_STREAMER_PACKAGES)
    for requirement, file in MODEL_STREAMER_WHEEL_FILES.items():
        name, version = requirement.split("==")
        wheel_name, wheel_version, _, tags = parse_wheel_filename(file)
        assert (wheel_name, str(wheel_version)) == (canonicalize_name(name), version), file
        assert tags & accepted, f"{file} is not installable on cp{major}{minor} {platform}"


def test_streaming_from_the_mirror_fetches_the_wheels_from_it_and_may_read_only_them(variant):
    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["model_mirror"] = {"enabled": True}
    config = parse_config(data)
    data["serving"]["model"] = {
        "model_id": "qwen",
        "source": f"s3://{config.mirror_bucket}/qwen2.5-7b",
        "hub_id": "Qwen/Qwen2.5-7B-Instruct",
    }
    stack, template, _ = variant("streaming-mirror", data)
    for group in stack.serving.manifest_body["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        (install,) = group["template"]["spec"]["initContainers"]
        script = install["command"][-1]
        assert f"{config.mirror_bucket} _wheels/model-streamer " in script
        assert "--no-index --find-links" in script and "--require-hashes" in script
        env = {e["name"]: e["value"] for e in install["env"]}
        assert env["AWS_REGION"] == config.aws.region
    policies = json.dumps(template.find_resources("AWS::IAM::Policy"))
    assert f"{config.mirror_bucket}/_wheels/model-streamer/*" in policies


def test_the_streamer_install_gives_up_at_once_without_pypi_and_says_why(tmp_path):
    """No index reachable (a closed loopback port): pip's one try fails, and the reason is the pod's
    termination message, instead of an hour of Init:CrashLoopBackOff."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    done = _run_install_script(tmp_path, PIP_INDEX_URL=f"http://127.0.0.1:{closed}/simple", PIP_CONFIG_FILE="/dev/null")
    assert done.returncode == 1
    assert "cannot install the Run:ai model streamer from PyPI" in (tmp_path / "log").read_text()


def test_a_streamer_wheel_that_is_not_the_pinned_file_is_refused(tmp_path):
    """The same names and versions, other bytes: pip's --require-hashes refuses them."""
    import zipfile

    links = tmp_path / "links"
    links.mkdir()
    for name in (
        "runai_model_streamer-0.17.0-py3-none-manylinux_2_30_x86_64.whl",
        "runai_model_streamer_s3-0.17.1-py3-none-manylinux_2_28_x86_64.whl",
        "humanize-4.17.0-py3-none-any.whl",
    ):
        with zipfile.ZipFile(links / name, "w") as wheel:
            wheel.writestr("not-the-real-wheel.txt", "substituted")
    done = _run_install_script(tmp_path, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(links), PIP_CONFIG_FILE="/dev/null")
    assert done.returncode == 1
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr
    assert not (tmp_path / "target" / "humanize").exists()


def _ray_node_resources(group: dict) -> dict[str, float]:
    """The Ray resources a group's pods advertise, as KubeRay turns them into `ray start` flags."""
    params, table = group.get("rayStartParams", {}), group.get("resources", {})
    resources = {key: float(value) for key, value in table.items()}
    if "num-cpus" in params:
        resources["CPU"] = float(params["num-cpus"])
    if "num-gpus" in params:
        resources["GPU"] = float(params["num-gpus"])
    return resources


def _fits(demand: dict[str, float], node: dict[str, float]) -> bool:
    return all(node.get(name, 0.0) >= amount for name, amount in demand.items() if amount > 0)


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_the_ingress_never_lands_on_the_head_and_fits_beside_the_engines(mode):
    """Every request passes through the ingress replica: a head restart must not take it down. Ray
    places an actor only where each resource it asks for is free; the head advertises none."""
    config, manifest = manifest_for("dev", **{"serving.mode": mode})
    cluster = manifest["spec"]["rayClusterConfig"]
    _, args = config.serving.builder_args()
    options = args["ingress_deployment_config"]["ray_actor_options"]
    demand = {"CPU": float(options.get("num_cpus", 1)), **options.get("resources", {})}
    assert not _fits(demand, _ray_node_resources(cluster["headGroupSpec"]))
    phases = ["decode"] if mode == "disaggregated" else ["colocated"]
    for group in cluster["workerGroupSpecs"]:
        node = _ray_node_resources(group)
        phase = group["groupName"].removesuffix("-gpu")
        for bundle in config.serving.placement_bundles(phases[0]):
            if _fits(bundle, node):
                node = {name: node[name] - bundle.get(name, 0.0) for name in node}
        if phase in phases or mode == "colocated":
            assert _fits(demand, node), (group["groupName"], demand, node)


@pytest.mark.parametrize("env", SHIPPED_ENVIRONMENTS)
def test_ray_token_authentication_is_on_and_left_to_kuberay(env):
    """mode token, said explicitly (KubeRay enables nothing for an empty mode), and no container sets
    RAY_AUTH_MODE or RAY_AUTH_TOKEN itself: KubeRay skips its injection in a container that does
    (common/pod.go, SetContainerTokenAuthEnvVars), and its own dashboard calls use the Secret's token."""
    config, manifest = manifest_for(env)
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token"}
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        for container in [*pod.get("initContainers", []), *pod["containers"]]:
            names = {e["name"] for e in container.get("env", [])}
            assert not {n for n in names if n.startswith("RAY_AUTH_")}, container["name"]
        annotations = group["template"]["metadata"]["annotations"]
        assert annotations["pd-serving/ray-auth-token-generation"] == str(config.ray_service.auth_token_generation)


def test_a_ray_auth_variable_in_the_serving_spec_is_refused():
    from config.loader import ConfigError

    data = yaml.safe_load((CONFIG_DIR / "dev.yaml").read_text())
    data["serving"]["env_vars"] = {"RAY_AUTH_MODE": "disabled"}
    with pytest.raises(
        ConfigError, match=r"serving: env_vars.RAY_AUTH_MODE: Ray's token authentication is the cluster's"
    ):
        parse_config(data)


@pytest.mark.parametrize(
    ("backend", "mine", "other"),
    [("LIBFABRIC", {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1"}, "UCX_"),
     ("UCX", {"UCX_TLS": "tcp,self,sm", "UCX_NET_DEVICES": "eth0"}, "FI_")],
)  # fmt: skip
def test_each_kv_backend_gets_its_transport_settings_and_none_of_the_others(backend, mine, other):
    _, manifest = manifest_for("dev", **{"serving.kv_transfer.backend": backend})
    for group in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        env = {e["name"]: e.get("value") for e in group["template"]["spec"]["containers"][0]["env"]}
        assert {name: env.get(name) for name in mine} == mine
        assert not [name for name in env if name.startswith(other)], group["groupName"]
