"""serve_app as the cluster gets it: the synthesized asset, zipped and uploaded by the CDK CLI, fetched
and unpacked by Ray's own runtime_env code from the ``s3://`` working_dir the RayService names.

For a remote working_dir Ray unzips with ``remove_top_level_directory=True``
(``ray/_private/runtime_env/packaging.py``, ``download_and_unpack_package``): a zip whose entries
all sit under one directory loses that directory. The S3 here is moto on loopback; the zip is
made by ``cdk publish-assets``; the download, unpack and import are Ray's.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

from local.code_asset import LocalS3, bootstrap, publish_assets, working_dir
from tests.conftest import ROOT

ray = pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.serving


@pytest.fixture(scope="module")
def published(synthesized):
    """dev's cloud assembly, published by the CDK CLI into a loopback S3; yields (s3, working_dir)."""
    config, _, _, _, outdir = synthesized("dev")
    with LocalS3(region=config.aws.region) as s3:
        bootstrap(s3, config.aws.account)
        publish_assets(s3, outdir)
        yield s3, working_dir(outdir, config.stack_name)


def test_the_working_dir_is_the_published_asset(published):
    s3, url = published
    bucket, _, key = url.removeprefix("s3://").partition("/")
    head = s3.client("s3", account="000000000000").head_object(Bucket=bucket, Key=key)
    assert head["ContentLength"] > 0


def test_rays_unpack_puts_serve_app_at_the_root(published, tmp_path, monkeypatch):
    from ray._private.runtime_env.packaging import download_and_unpack_package

    s3, url = published
    for key, value in s3.env.items():
        monkeypatch.setenv(key, value)
    unpacked = asyncio.run(download_and_unpack_package(url, str(tmp_path)))
    assert sorted(p.name for p in (tmp_path / unpacked).iterdir()) == ["serve_app"]
    assert (tmp_path / unpacked / "serve_app" / "app.py").is_file()


def test_ray_imports_build_app_from_the_s3_working_dir(published, tmp_path):
    """A Ray task with the RayService's runtime_env imports serve_app.app:build_app from the asset."""
    s3, url = published
    script = textwrap.dedent(
        """
        import json, sys, ray
        ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR",
                 runtime_env={"working_dir": sys.argv[1]})

        @ray.remote
        def where():
            import os, serve_app.app
            return {"file": serve_app.app.__file__, "cwd": os.getcwd(),
                    "build_app": callable(serve_app.app.build_app)}

        print(json.dumps(ray.get(where.remote(), timeout=120)))
        ray.shutdown()
        """
    )
    # A clean child: cwd outside the repository and no PYTHONPATH, so only the asset can provide serve_app.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",) and not k.startswith("AWS_")}
    env.update(s3.env, RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run(
        [sys.executable, "-c", script, url], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["build_app"] is True
    assert found["file"].startswith(found["cwd"]), found
    assert "runtime_resources" in found["file"] and not found["file"].startswith(str(ROOT))
