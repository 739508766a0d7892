"""The S3 model mirror: the bucket the stack owns, the Job script that fills it (run here against an
S3-compatible server on loopback), the Job's manifest, and the checks on mirror and S3 sources."""

from __future__ import annotations

import json

import pytest
import yaml

from config.loader import ConfigError, parse_config
from local.code_asset import LocalS3
from manifests.contract import MIRROR_SERVICE_ACCOUNT, RAY_WORKER_SERVICE_ACCOUNT
from manifests.mirror_job import manifests
from mirror import job
from tests.conftest import CONFIG_DIR, ROOT, synth_variant

TINY = ROOT / ".local" / "tiny-llama"


def data(env: str = "dev", **mirror) -> dict:
    data = yaml.safe_load((CONFIG_DIR / f"{env}.yaml").read_text())
    data["model_mirror"] = {"enabled": True, **mirror}
    return data


@pytest.fixture
def model_dir(tmp_path):
    """The tiny local model, plus files a Hugging Face repo carries that the engine does not read."""
    from local.tiny_model import ensure_tiny_model

    ensure_tiny_model(TINY)
    directory = tmp_path / "model"
    directory.mkdir()
    for path in TINY.iterdir():
        if path.is_file():
            (directory / path.name).write_bytes(path.read_bytes())
    (directory / "pytorch_model.bin").write_bytes(b"\0" * 1024)
    (directory / "README.md").write_text("# a model card\n")
    (directory / "original").mkdir()
    (directory / "original" / "consolidated.00.pth").write_bytes(b"\0" * 512)
    return directory


@pytest.fixture
def s3():
    with LocalS3() as server:
        client = server.client("s3")
        client.create_bucket(Bucket="pd-dev-models", CreateBucketConfiguration={"LocationConstraint": "us-east-2"})
        yield client


def keys(s3) -> set[str]:
    return {o["Key"] for o in s3.list_objects_v2(Bucket="pd-dev-models").get("Contents", [])}


@pytest.mark.serving  # the tiny model is written with tokenizers (requirements-serve.txt)
def test_the_job_copies_what_the_engine_reads_and_verifies_it(s3, model_dir):
    lines: list[str] = []
    assert job.mirror(bucket="pd-dev-models", prefix="tiny-llama", from_dir=model_dir, s3=s3, out=lines.append) == 0
    assert keys(s3) == {
        f"tiny-llama/{name}"
        for name in (
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "generation_config.json",
        )
    }
    assert any(
        line.startswith(
            "skipping 3 file(s) the engine does not read: README.md, original/consolidated.00.pth, pytorch_model.bin"
        )
        for line in lines
    )
    assert "verified 6 file(s) in s3://pd-dev-models/tiny-llama/ (size and sha256)" in lines
    assert lines[-1] == "source: s3://pd-dev-models/tiny-llama"
    head = s3.head_object(Bucket="pd-dev-models", Key="tiny-llama/model.safetensors")
    assert head["Metadata"]["sha256"] == job.sha256_of(model_dir / "model.safetensors")


@pytest.mark.serving  # the tiny model is written with tokenizers (requirements-serve.txt)
def test_a_second_run_resumes_and_copies_only_what_is_missing(s3, model_dir):
    job.mirror(bucket="pd-dev-models", prefix="tiny-llama", from_dir=model_dir, s3=s3, out=lambda _: None)
    s3.delete_object(Bucket="pd-dev-models", Key="tiny-llama/tokenizer.json")
    # An object without its checksum (an interrupted or foreign upload) is copied again too.
    s3.put_object(Bucket="pd-dev-models", Key="tiny-llama/config.json", Body=(model_dir / "config.json").read_bytes())
    lines: list[str] = []
    assert job.mirror(bucket="pd-dev-models", prefix="tiny-llama", from_dir=model_dir, s3=s3, out=lines.append) == 0
    copied = [line for line in lines if "uploaded in" in line]
    assert (
        len(copied) == 2
        and any("tokenizer.json" in line for line in copied)
        and any("config.json (" in line for line in copied)
    )
    assert sum("already mirrored" in line for line in lines) == 4


@pytest.mark.serving  # the tiny model is written with tokenizers (requirements-serve.txt)
def test_a_file_that_does_not_match_its_checksum_is_not_uploaded(s3, model_dir, monkeypatch):
    files = job.dir_files(model_dir)
    tampered = [job.ModelFile(f.name, f.size, "0" * 64) if f.name == "model.safetensors" else f for f in files]
    monkeypatch.setattr(job, "dir_files", lambda _root: tampered)
    lines: list[str] = []
    assert job.mirror(bucket="pd-dev-models", prefix="tiny-llama", from_dir=model_dir, s3=s3, out=lines.append) == 1
    assert any("does not match the source's" in line for line in lines)
    assert "tiny-llama/model.safetensors" not in keys(s3)


def test_the_stack_owns_an_encrypted_private_bucket_removed_as_the_environment_says(tmp_path):
    _, dev = synth_variant(tmp_path, data("dev"), "mirror-dev")
    (bucket,) = dev.find_resources("AWS::S3::Bucket").values()
    props = bucket["Properties"]
    assert props["BucketName"] == "pd-dev-models-000000000000-us-east-2"
    assert (
        props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"][
            "SSEAlgorithm"
        ]
        == "AES256"
    )
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    assert bucket["DeletionPolicy"] == "Delete"
    dev.resource_count_is("Custom::S3AutoDeleteObjects", 1)
    prod_data = data("prod")
    _, prod = synth_variant(tmp_path, prod_data, "mirror-prod")
    (kept,) = prod.find_resources("AWS::S3::Bucket").values()
    assert kept["DeletionPolicy"] == "Retain"
    prod.resource_count_is("Custom::S3AutoDeleteObjects", 0)


def test_only_the_gpu_workers_read_it_and_only_the_mirror_job_writes_it(tmp_path):
    config_data = data("dev")
    config_data["serving"]["model"] = {
        "model_id": "qwen2.5-7b-instruct",
        "source": "s3://pd-dev-models-000000000000-us-east-2/qwen2.5-7b-instruct",
        "config_json": str(ROOT / "tests" / "fixtures" / "qwen2.5-7b-config.json"),
    }
    stack, template = synth_variant(tmp_path, config_data, "mirror-read")
    associations = {
        r["Properties"]["ServiceAccount"]: r["Properties"]["RoleArn"]["Fn::GetAtt"][0]
        for r in template.find_resources("AWS::EKS::PodIdentityAssociation").values()
    }
    policies = template.find_resources("AWS::IAM::Policy")
    by_role = {}
    for policy in policies.values():
        for role in policy["Properties"]["Roles"]:
            by_role.setdefault(role["Ref"], []).extend(policy["Properties"]["PolicyDocument"]["Statement"])
    writes = {
        sa
        for sa, role in associations.items()
        if any("s3:PutObject" in json.dumps(s["Action"]) for s in by_role.get(role, []))
    }
    reads = {
        sa
        for sa, role in associations.items()
        if any(
            "s3:GetObject" in json.dumps(s["Action"]) and "qwen2.5-7b-instruct/*" in json.dumps(s["Resource"])
            for s in by_role.get(role, [])
        )
    }
    assert writes == {MIRROR_SERVICE_ACCOUNT}
    # The engines on the GPU workers load the model; the head does not.
    assert reads == {RAY_WORKER_SERVICE_ACCOUNT}


@pytest.mark.serving  # the tiny model is written with tokenizers (requirements-serve.txt)
def test_the_job_manifest_runs_the_script_on_the_system_nodes_with_the_writer(model_dir):
    config = parse_config(data("dev"))
    config_map, job_manifest = manifests(config, repo="Qwen/Qwen2.5-7B-Instruct", prefix="qwen2.5-7b-instruct")
    assert config_map["data"]["job.py"] == (ROOT / "mirror" / "job.py").read_text()
    pod = job_manifest["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "model-mirror" and pod["nodeSelector"] == {"role": "system"}
    (container,) = pod["containers"]
    command = container["command"][-1]
    assert "--bucket pd-dev-models-000000000000-us-east-2 --prefix qwen2.5-7b-instruct" in command
    assert "--repo Qwen/Qwen2.5-7B-Instruct" in command
    assert "--no-deps huggingface-hub==2.4.0 boto3==1.44.5 " in command
    assert all(v["name"] != "hf-token" for v in pod["volumes"])
    # The model streamer's wheels too, for the serving image's Python, hash-checked by pip, then
    # into the mirror beside the models, where the streaming pods install them from.
    assert (
        "pip download " in command
        and "--require-hashes --platform manylinux_2_34_x86_64 --python-version 3.13" in command
    )
    assert "--wheels /tmp/wheels --wheels-prefix _wheels/model-streamer" in command


def test_the_job_mirrors_wheels_resumably_and_verifies_them(s3, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"a" * 100)
    (wheels / "b-1.0-py3-none-any.whl").write_bytes(b"b" * 100)
    lines: list[str] = []
    assert job.mirror_wheels(bucket="pd-dev-models", prefix="_wheels/x", directory=wheels, s3=s3, out=lines.append) == 0
    assert keys(s3) == {"_wheels/x/a-1.0-py3-none-any.whl", "_wheels/x/b-1.0-py3-none-any.whl"}
    assert lines[-1] == "verified 2 wheel(s) in s3://pd-dev-models/_wheels/x/ (size and sha256)"
    lines.clear()
    assert job.mirror_wheels(bucket="pd-dev-models", prefix="_wheels/x", directory=wheels, s3=s3, out=lines.append) == 0
    assert lines[:2] == ["a-1.0-py3-none-any.whl: already mirrored", "b-1.0-py3-none-any.whl: already mirrored"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert job.mirror_wheels(bucket="pd-dev-models", prefix="_wheels/x", directory=empty, s3=s3, out=lines.append) == 1


def test_the_job_takes_wheels_only_with_their_prefix(capsys):
    with pytest.raises(SystemExit) as exit_:
        job.main(["--repo", "r", "--bucket", "b", "--prefix", "p", "--wheels", "/tmp/w"])
    assert exit_.value.code == 2
    assert "--wheels and --wheels-prefix go together (try --help)" in capsys.readouterr().err


def test_a_gated_model_is_mirrored_with_its_token_by_reference():
    from manifests import hf_token
    from manifests import mirror_job as manifest

    config_data = data("dev")
    config_data["serving"]["model"] = {
        "model_id": "llama-3.1-8b",
        "source": "meta-llama/Llama-3.1-8B-Instruct",
        "gated": True,
        "hf_token_secret": "pd-serving/hf-token",
    }
    _, job_manifest = manifests(parse_config(config_data), repo="meta-llama/Llama-3.1-8B-Instruct", prefix="llama")
    pod = job_manifest["spec"]["template"]["spec"]
    assert hf_token.pod_volume() in pod["volumes"] and manifest.TOKEN_VOLUME == hf_token.pod_volume()
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env["HF_TOKEN_PATH"] == hf_token.TOKEN_PATH == manifest.TOKEN_PATH
    assert "HF_TOKEN" not in env


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("My_Models", "lower-case letters, digits, '.' and '-'"),
        ("ab", "3-63 characters"),
        ("models..weights", "no two dots in a row"),
        ("192.168.1.10", "not an IP address"),
        ("xn--models", "'xn--'"),
        ("models-s3alias", "'-s3alias'"),
    ],
)
def test_a_bucket_name_s3_refuses_is_one_line(name, fix):
    with pytest.raises(ConfigError) as caught:
        parse_config(data("dev", bucket_name=name), source="dev.yaml")
    (line,) = caught.value.problems
    assert line.startswith("model_mirror.bucket_name:") and fix in line


def test_streaming_needs_an_s3_source():
    config_data = data("dev")
    config_data["serving"]["model"]["load_format"] = "runai_streamer"
    with pytest.raises(ConfigError, match="load_format runai_streamer streams from S3; serving.model.source"):
        parse_config(config_data)


def test_an_s3_source_that_is_not_the_mirror_names_its_region_which_must_be_the_clusters():
    config_data = data("dev")
    config_data["serving"]["model"] = {
        "model_id": "qwen",
        "source": "s3://other-models/qwen",
        "config_json": str(ROOT / "tests" / "fixtures" / "qwen2.5-7b-config.json"),
    }
    with pytest.raises(
        ConfigError, match="serving.model.source_region: required for an S3 source other than the stack's mirror"
    ):
        parse_config(config_data)
    config_data["serving"]["model"]["source_region"] = "eu-west-1"
    with pytest.raises(ConfigError, match="is in eu-west-1, not us-east-2"):
        parse_config(config_data)
    config_data["serving"]["model"]["source_region"] = "us-east-2"
    parse_config(config_data)


def test_mirror_model_cli_prints_the_job_it_would_run(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump(data("dev")))
    done = subprocess.run(
        [sys.executable, "-m", "cli.mirror_model", str(path), "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    kinds = [json.loads(line)["kind"] for line in done.stdout.splitlines()]
    assert kinds == ["ConfigMap", "Job"]


def _mirrored_decode_engine_config():
    """Ray Serve LLM's engine config for decode of dev with the model in the mirror, as a replica builds it."""
    from ray.llm._internal.serve.core.configs.llm_config import LLMConfig

    config_data = data("dev")
    config_data["serving"]["model"] = {
        "model_id": "qwen2.5-7b-instruct",
        "source": "s3://pd-dev-models-000000000000-us-east-2/qwen2.5-7b-instruct",
        "hub_id": "Qwen/Qwen2.5-7B-Instruct",
    }
    llm_config = LLMConfig(**parse_config(config_data).serving.llm_config("decode"))
    return llm_config, llm_config.get_engine_config()


def _node_init_as_ray_2_58_does(llm_config, engine_config, *, run_callback: bool = True) -> None:
    """What Ray 2.58.0's VLLMEngine.start does with a streaming load format before building the engine.

    These are the installed Ray's own functions (the image's 2.58.0, which the tests run):
    VLLMEngineConfig.from_llm_config (vllm_models.py), download_model_files
    (common/utils/download_utils.py) and initialize_node (serve/utils/node_initialization_utils.py,
    line 75: ``hf_model_id = paths[0]``). Ray 2.58's vllm_engine.py, start(), lines 381-384, then
    runs the callback's on_after_node_init; _get_vllm_engine_config, lines 177-184, replaces the
    model only by a local copy on disk (2.60 added the mirror's URI there, which 2.58 lacks).
    """
    import asyncio

    from ray.llm._internal.common.utils.download_utils import (
        NodeModelDownloadable,
        download_model_files,
        get_model_location_on_disk,
    )
    from ray.llm._internal.common.utils.import_utils import load_class

    # Streaming: worker_node_download_model is NONE (llm_config.py, get_or_create_callback).
    path = download_model_files(
        model_id=engine_config.actual_hf_model_id,
        mirror_config=engine_config.mirror_config,
        download_model=NodeModelDownloadable.NONE,
        download_extra_files=False,
    )
    engine_config.hf_model_id = path
    if run_callback:
        callback_class = llm_config.callback_config.callback_class
        if isinstance(callback_class, str):
            callback_class = load_class(callback_class)
        callback = callback_class(llm_config=llm_config, **llm_config.callback_config.callback_kwargs)
        asyncio.run(callback.run_callback("on_after_node_init"))
    local_path = get_model_location_on_disk(engine_config.actual_hf_model_id)
    if local_path and local_path != engine_config.actual_hf_model_id:
        engine_config.hf_model_id = local_path


@pytest.mark.serving
def test_ray_2_58_hands_vllm_the_s3_uri_through_the_callback():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    llm_config, engine_config = _mirrored_decode_engine_config()
    _node_init_as_ray_2_58_does(llm_config, engine_config)
    kwargs = engine_config.get_initialization_kwargs()
    assert kwargs["model"] == "s3://pd-dev-models-000000000000-us-east-2/qwen2.5-7b-instruct"
    assert kwargs["served_model_name"] == ["qwen2.5-7b-instruct"]
    # vLLM's own argument parser takes them as the engine would: an object-store model, streamed.
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = AsyncEngineArgs.from_cli_args(
        parser.parse_args(["--model", kwargs["model"], "--load-format", kwargs["load_format"]])
    )
    assert (args.model, args.load_format) == (kwargs["model"], "runai_streamer")


@pytest.mark.serving
def test_without_the_callback_ray_2_58_would_hand_vllm_the_model_id():
    llm_config, engine_config = _mirrored_decode_engine_config()
    _node_init_as_ray_2_58_does(llm_config, engine_config, run_callback=False)
    # vLLM would look "qwen2.5-7b-instruct" up on Hugging Face and fail.
    assert engine_config.get_initialization_kwargs()["model"] == "qwen2.5-7b-instruct"


@pytest.mark.serving  # reads the installed versions of the job's packages (requirements-serve.txt)
def test_the_job_installs_its_packages_and_every_dependency_at_the_locked_versions():
    import importlib.metadata

    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    from config.versions import MIRROR_JOB_PACKAGES

    pinned = dict(p.split("==") for p in MIRROR_JOB_PACKAGES)
    normal = lambda name: name.lower().replace("_", "-")  # noqa: E731
    lock = {}
    for line in (ROOT / "requirements-serve.txt").read_text().splitlines():
        requirement = line.split("#")[0].split(";")[0].strip()
        if "==" in requirement:
            name, version = requirement.split("==", 1)
            lock[normal(name)] = version.strip()
    assert {k: lock.get(k) for k in pinned} == pinned
    # The closure under the job image's Python (3.12), from the packages' own metadata: --no-deps
    # installs exactly this list, so nothing may be missing from it.
    environment = {**default_environment(), "python_version": "3.12", "extra": ""}
    needed, queue = set(), ["huggingface-hub", "boto3"]
    while queue:
        name = normal(queue.pop())
        if name in needed:
            continue
        needed.add(name)
        for text in importlib.metadata.distribution(name).requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                queue.append(requirement.name)
    assert needed == set(pinned)
