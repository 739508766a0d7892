"""The Ray Serve config (``serve deploy`` YAML, the RayService's ``serveConfigV2``) of a spec."""

from __future__ import annotations

from typing import Any

import yaml

from serve_app.spec import ServingSpec

IMPORT_PATH = "serve_app.app:build_app"
SERVE_PORT = 8000
PROXY_LOCATION = "EveryNode"


def serve_config(spec: ServingSpec, *, working_dir: str | None = None) -> dict[str, Any]:
    """One application whose args are the spec itself, so they parse back into it unchanged."""
    application: dict[str, Any] = {
        "name": spec.app_name,
        "route_prefix": "/",
        "import_path": IMPORT_PATH,
        "args": spec.model_dump(mode="json"),
    }
    if working_dir:
        application["runtime_env"] = {"working_dir": working_dir}
    return {
        # A proxy on every node with a replica, so on each GPU worker, where the serve Service sends
        # requests (the RayService excludes the head from it). Ray's default, said here because
        # HeadOnly would put every request through the head. Ray 2.58 also keeps one on the
        # controller's node, the head (serve/_private/controller.py, _update_proxy_nodes): idle.
        "proxy_location": PROXY_LOCATION,
        "http_options": {"host": "0.0.0.0", "port": SERVE_PORT, "request_timeout_s": spec.request_timeout_s},
        "applications": [application],
    }


def serve_config_yaml(spec: ServingSpec, *, working_dir: str | None = None) -> str:
    return yaml.safe_dump(serve_config(spec, working_dir=working_dir), sort_keys=False)
