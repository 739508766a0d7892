"""Copy a model's files from Hugging Face into the stack's S3 mirror, resumably, and verify them.

    python job.py --repo Qwen/Qwen2.5-7B-Instruct --bucket B --prefix qwen2.5-7b-instruct
    python job.py --from-dir /path/to/model --bucket B --prefix tiny-llama      # a local copy
    python job.py ... --wheels /tmp/wheels --wheels-prefix _wheels/model-streamer

Runs in a Kubernetes Job on the cluster (``make mirror-model``), so the bytes go from Hugging Face
through the region's NAT gateway straight to S3, one file at a time (the node's disk holds one
file at most). Only what the engine reads is copied: safetensors weights, JSON configs and the
tokenizer; PyTorch .bin/.pt, GGUF, ONNX, Flax and ``original/`` checkpoints are skipped.

Resuming: an object already in S3 with the file's size and sha256 (kept as object metadata) is
skipped, so a second run after an interruption copies only what is missing. Verifying: every
downloaded file's sha256 is checked against Hugging Face's LFS sha256 before it is uploaded, and
the end checks every object in S3 against the expected list. A gated model's token comes from
the file ``HF_TOKEN_PATH`` names, as in the serving pods. Needs huggingface_hub and boto3 only.

``--wheels`` also puts the files of a directory (the model streamer's wheels, which the Job's pip
has downloaded and checked against their pinned hashes) under ``--wheels-prefix``, the same way:
the streaming GPU workers install them from there, so their pods never reach out to PyPI.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

# What vLLM reads from a Hugging Face model directory (weights as safetensors, configs, tokenizer).
ENGINE_FILES = (
    "*.safetensors",
    "*.json",
    "tokenizer.model",
    "*.tiktoken",
    "merges.txt",
    "vocab.txt",
    "*.jinja",
)
SKIPPED = ("original/*", "*.bin", "*.pt", "*.pth", "*.gguf", "*.onnx", "*.msgpack", "*.h5", "*.ckpt")
SHA256_METADATA = "sha256"


@dataclass(frozen=True)
class ModelFile:
    name: str
    size: int
    sha256: str | None  # Hugging Face knows it for LFS files (the weights)


def wanted(name: str) -> bool:
    if any(fnmatch.fnmatch(name, pattern) for pattern in SKIPPED):
        return False
    return any(fnmatch.fnmatch(Path(name).name, pattern) for pattern in ENGINE_FILES)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(8 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def hub_files(repo: str, revision: str) -> list[ModelFile]:
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    return [ModelFile(s.rfilename, s.size or 0, s.lfs.sha256 if s.lfs else None) for s in info.siblings or []]


def dir_files(root: Path) -> list[ModelFile]:
    return [
        ModelFile(str(p.relative_to(root)), p.stat().st_size, sha256_of(p))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    ]


def already_mirrored(s3, bucket: str, key: str, file: ModelFile) -> bool:
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except s3.exceptions.ClientError:
        return False
    stored = head.get("Metadata", {}).get(SHA256_METADATA)
    return head["ContentLength"] == file.size and stored is not None and (file.sha256 is None or stored == file.sha256)


def fetch(file: ModelFile, *, repo: str | None, revision: str, from_dir: Path | None, scratch: Path) -> Path:
    if from_dir is not None:
        target = scratch / file.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(from_dir / file.name, target)
        return target
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo, file.name, revision=revision, local_dir=scratch))


def mirror(
    *,
    bucket: str,
    prefix: str,
    repo: str | None = None,
    revision: str = "main",
    from_dir: Path | None = None,
    s3=None,
    out=print,
) -> int:
    """Copies the engine's files to s3://bucket/prefix/; returns the number of problems found."""
    import boto3

    s3 = s3 or boto3.client("s3")
    files = dir_files(from_dir) if from_dir else hub_files(repo, revision)
    selected = [f for f in files if wanted(f.name)]
    skipped = sorted(f.name for f in files if not wanted(f.name))
    if skipped:
        out(
            f"skipping {len(skipped)} file(s) the engine does not read: {', '.join(skipped[:8])}"
            + (" …" if len(skipped) > 8 else "")
        )
    total = sum(f.size for f in selected)
    out(f"mirroring {len(selected)} file(s), {total / 1e9:.2f} GB, to s3://{bucket}/{prefix}/")
    done = 0
    with tempfile.TemporaryDirectory(prefix="mirror-") as tmp:
        scratch = Path(tmp)
        for index, file in enumerate(selected, 1):
            key = f"{prefix}/{file.name}"
            head = f"[{index}/{len(selected)}] {file.name} ({file.size / 1e6:.1f} MB)"
            if already_mirrored(s3, bucket, key, file):
                out(f"{head}: already mirrored")
                done += file.size
                continue
            started = time.monotonic()
            local = fetch(file, repo=repo, revision=revision, from_dir=from_dir, scratch=scratch)
            digest = sha256_of(local)
            if file.sha256 is not None and digest != file.sha256:
                out(f"{head}: sha256 {digest} does not match the source's {file.sha256}; not uploaded")
                local.unlink()
                return 1
            fetched = time.monotonic() - started
            s3.upload_file(str(local), bucket, key, ExtraArgs={"Metadata": {SHA256_METADATA: digest}})
            local.unlink()
            done += file.size
            out(
                f"{head}: fetched in {fetched:.0f} s, uploaded in {time.monotonic() - started - fetched:.0f} s "
                f"({done / total:.0%} of the model)"
                if total
                else f"{head}: uploaded"
            )
    problems = [f.name for f in selected if not already_mirrored(s3, bucket, f"{prefix}/{f.name}", f)]
    if problems:
        out(f"verification failed for {len(problems)} file(s): {', '.join(problems)}")
        return len(problems)
    out(f"verified {len(selected)} file(s) in s3://{bucket}/{prefix}/ (size and sha256)")
    out(f"source: s3://{bucket}/{prefix}")
    return 0


def mirror_wheels(*, bucket: str, prefix: str, directory: Path, s3=None, out=print) -> int:
    """Copies every file of ``directory`` to s3://bucket/prefix/; returns the number of problems found."""
    import boto3

    s3 = s3 or boto3.client("s3")
    files = dir_files(directory)
    if not files:
        out(f"no wheels in {directory}")
        return 1
    for file in files:
        key = f"{prefix}/{file.name}"
        if already_mirrored(s3, bucket, key, file):
            out(f"{file.name}: already mirrored")
            continue
        s3.upload_file(str(directory / file.name), bucket, key, ExtraArgs={"Metadata": {SHA256_METADATA: file.sha256}})
        out(f"{file.name}: uploaded")
    problems = [f.name for f in files if not already_mirrored(s3, bucket, f"{prefix}/{f.name}", f)]
    if problems:
        out(f"verification failed for {len(problems)} wheel(s): {', '.join(problems)}")
        return len(problems)
    out(f"verified {len(files)} wheel(s) in s3://{bucket}/{prefix}/ (size and sha256)")
    return 0


class ArgumentParser(argparse.ArgumentParser):
    """Errors in one line, exit 2 (as cmdline.ArgumentParser; this file runs alone in the Job)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (try --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--repo", help="Hugging Face repo id")
    source.add_argument("--from-dir", type=Path, help="a local copy of the model instead")
    parser.add_argument("--revision", default="main", help="branch, tag or commit of the repo (default: main)")
    parser.add_argument("--bucket", required=True, help="the mirror bucket's name")
    parser.add_argument("--prefix", required=True, help="key prefix in the bucket, e.g. qwen2.5-7b-instruct")
    parser.add_argument("--wheels", type=Path, help="a directory of wheels to mirror as well")
    parser.add_argument("--wheels-prefix", help="key prefix for --wheels, e.g. _wheels/model-streamer")
    args = parser.parse_args(argv)
    if (args.wheels is None) != (args.wheels_prefix is None):
        parser.error("--wheels and --wheels-prefix go together")
    if os.environ.get("HF_TOKEN_PATH") and not Path(os.environ["HF_TOKEN_PATH"]).is_file():
        print(f"HF_TOKEN_PATH names {os.environ['HF_TOKEN_PATH']}, which does not exist", file=sys.stderr)
        return 2
    if args.wheels is not None and mirror_wheels(
        bucket=args.bucket, prefix=args.wheels_prefix.strip("/"), directory=args.wheels
    ):
        return 1
    return (
        1
        if mirror(
            bucket=args.bucket,
            prefix=args.prefix.strip("/"),
            repo=args.repo,
            revision=args.revision,
            from_dir=args.from_dir,
        )
        else 0
    )


if __name__ == "__main__":
    sys.exit(main())
