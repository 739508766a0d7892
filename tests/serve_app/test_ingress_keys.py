"""The keyed ingress's key directory read again when it changes (serve_app/ingress.py ``KeyDirectory``),
on real files: plain ones as `make local` writes them, and the CSI driver's layout (each key a link
into a ``..data`` folder that the driver swaps whole on its rotation poll). The clock is the test's,
so the interval is shown exactly; tests/local/test_local_security.py shows it on the live server."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.serving


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def accepted(keys, key: str) -> bool:
    from serve_app.ingress import refusal

    return refusal({"authorization": f"Bearer {key}"}, keys.digests()) is None


@pytest.fixture
def clock() -> Clock:
    return Clock()


def keys_in(directory: Path, clock: Clock):
    from serve_app.ingress import KeyDirectory

    return KeyDirectory(str(directory), interval_s=5, clock=clock)


def test_a_key_added_is_accepted_and_a_key_removed_refused_once_the_interval_has_passed(tmp_path, clock):
    (tmp_path / "key-0").write_text("sk-first\n")
    keys = keys_in(tmp_path, clock)
    assert accepted(keys, "sk-first") and not accepted(keys, "sk-second")

    (tmp_path / "key-1").write_text("sk-second\n")
    clock.now += 4.9
    assert not accepted(keys, "sk-second")  # not looked at yet: at most one check per interval
    clock.now += 0.1
    assert accepted(keys, "sk-second") and accepted(keys, "sk-first")

    (tmp_path / "key-0").unlink()
    clock.now += 5
    assert not accepted(keys, "sk-first") and accepted(keys, "sk-second")


def test_the_csi_drivers_swap_of_its_data_folder_is_seen(tmp_path, clock):
    """The driver's atomic writer: key-N -> ..data/key-N, ..data -> ..<timestamp>, swapped by a rename."""

    def publish(generation: str, values: dict[str, str]) -> None:
        folder = tmp_path / f"..{generation}"
        folder.mkdir()
        for name, value in values.items():
            (folder / name).write_text(value)
        (tmp_path / "..data_tmp").symlink_to(folder.name)
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
        for name in values:
            if not (tmp_path / name).is_symlink():
                (tmp_path / name).symlink_to(f"..data/{name}")

    publish("2026_12_05_10_00_00.1", {"key-0": "sk-old"})
    keys = keys_in(tmp_path, clock)
    assert accepted(keys, "sk-old")
    # A new value in the same secret (and file name): only the folder behind ..data changes.
    publish("2026_12_05_11_00_00.2", {"key-0": "sk-new"})
    clock.now += 5
    assert accepted(keys, "sk-new") and not accepted(keys, "sk-old")


def test_an_unchanged_directory_is_not_read_again(tmp_path, clock):
    """The check is stat calls only: a content change that keeps name, inode, size and time is not
    seen (nothing the CSI driver or `make local` does), which shows the files were not read again."""
    key = tmp_path / "key-0"
    key.write_text("sk-aaaa")
    keys = keys_in(tmp_path, clock)
    before = key.stat()
    with open(key, "r+") as handle:  # same inode, same size
        handle.write("sk-bbbb")
    os.utime(key, ns=(before.st_atime_ns, before.st_mtime_ns))
    clock.now += 60
    assert keys.digests() == frozenset({hashlib.sha256(b"sk-aaaa").digest()})


def test_a_directory_left_without_keys_refuses_everyone_until_a_key_is_back(tmp_path, clock):
    (tmp_path / "key-0").write_text("sk-only")
    keys = keys_in(tmp_path, clock)
    (tmp_path / "key-0").unlink()
    clock.now += 5
    assert keys.digests() == frozenset() and not accepted(keys, "sk-only")
    (tmp_path / "key-0").write_text("sk-back")
    clock.now += 5
    assert accepted(keys, "sk-back") and not accepted(keys, "sk-only")


def test_a_replica_still_refuses_to_start_without_keys(tmp_path, clock):
    from serve_app.ingress import KeyDirectory

    with pytest.raises(RuntimeError, match="holds no key"):
        KeyDirectory(str(tmp_path), clock=clock)
    with pytest.raises(RuntimeError, match="does not exist"):
        KeyDirectory(str(tmp_path / "missing"), clock=clock)


def test_the_docs_state_the_bound_the_cluster_has():
    """docs/security.md: the CSI driver's rotation poll plus the ingress's interval."""
    from manifests.hf_token import ROTATION_POLL_INTERVAL
    from serve_app.ingress import RELOAD_INTERVAL_S
    from tests.conftest import ROOT

    poll_s = int(ROTATION_POLL_INTERVAL.removesuffix("s"))
    text = " ".join((ROOT / "docs" / "security.md").read_text().split())
    assert f"`rotationPollInterval`, {poll_s} s here" in text
    assert f"at most every {RELOAD_INTERVAL_S:g} s (`RELOAD_INTERVAL_S`" in text
    assert f"at most {poll_s + RELOAD_INTERVAL_S:g} s after the deploy" in text


@pytest.fixture(scope="module")
def keyed_app(tmp_path_factory):
    """The FastAPI app a keyed ingress replica serves, made as Ray's builders make it
    (``make_fastapi_ingress``) and constructed as Serve constructs the replica's class, unserved."""
    import asyncio

    from ray.serve.llm.ingress import make_fastapi_ingress

    from serve_app.ingress import KeyedOpenAiIngress

    directory = tmp_path_factory.mktemp("api-keys")
    (directory / "key-0").write_text("sk-unserved-71c3\n")
    replica_class = make_fastapi_ingress(KeyedOpenAiIngress)
    replica = replica_class.__new__(replica_class)
    asyncio.run(replica.__init__(llm_deployments={}, model_cards={}, api_key_dir=str(directory)))
    return replica.app, "sk-unserved-71c3"


def route_requests(app) -> list[tuple[str, str]]:
    """(method, path) for every route the app holds, its path parameters filled in."""
    import re

    return [
        (method, re.sub(r"\{[^}]*\}", "x", route.path))
        for route in app.routes
        for method in sorted(getattr(route, "methods", None) or {"GET"})
    ]


def test_without_a_key_nothing_the_app_holds_answers_but_401(keyed_app):
    """FastAPI's own pages (the OpenAPI map and the docs built on it) included, and a path it does not know."""
    from starlette.testclient import TestClient

    app, _ = keyed_app
    client = TestClient(app)
    requests = [*route_requests(app), ("GET", "/no-such-path")]
    assert ("GET", app.openapi_url) in requests and ("GET", app.docs_url) in requests
    answers = {(method, path): client.request(method, path).status_code for method, path in requests}
    assert set(answers.values()) == {401}, {request: status for request, status in answers.items() if status != 401}


def test_with_a_key_fastapis_own_pages_answer(keyed_app):
    """The check refuses the keyless, not the pages: a caller with a key still reads the map."""
    from starlette.testclient import TestClient

    app, key = keyed_app
    client = TestClient(app, headers={"Authorization": f"Bearer {key}"})
    pages = [app.openapi_url, app.docs_url, app.redoc_url]
    assert {page: client.get(page).status_code for page in pages} == dict.fromkeys(pages, 200)
    assert "/v1/completions" in client.get(app.openapi_url).json()["paths"]


# -- each key's own prefix cache ------------------------------------------------------------------

SECRET = b"s" * 64


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def test_each_key_has_its_own_salt_the_same_on_every_replica_and_start():
    from serve_app.ingress import tenant_salt

    first, second = tenant_salt(SECRET, digest("sk-a"), None), tenant_salt(SECRET, digest("sk-b"), None)
    assert first != second
    assert tenant_salt(SECRET, digest("sk-a"), None) == first  # a function of the secret and the key only
    # Another secret (another stack), other salts: a key's digest alone does not give its salt.
    assert tenant_salt(b"t" * 64, digest("sk-a"), None) != first


def test_a_clients_own_salt_divides_its_keys_cache_and_reaches_no_other_key():
    from serve_app.ingress import tenant_salt

    # A client that sends key B's salt, or the raw salt of its choice, still lands under its own key.
    stolen = tenant_salt(SECRET, digest("sk-b"), None)
    assert tenant_salt(SECRET, digest("sk-a"), stolen) not in {stolen, tenant_salt(SECRET, digest("sk-b"), stolen)}
    assert tenant_salt(SECRET, digest("sk-a"), "mine") != tenant_salt(SECRET, digest("sk-a"), None)
    assert tenant_salt(SECRET, digest("sk-a"), "mine") != tenant_salt(SECRET, digest("sk-b"), "mine")


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_the_salt_is_set_on_vllms_own_request_models_and_they_accept_it(kind):
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, CompletionRequest

    from serve_app.ingress import salt_requests, tenant_salt
    from tests.request_fields import base_request

    model = {"chat": ChatCompletionRequest, "completion": CompletionRequest}[kind]
    body = model.model_validate(base_request(kind, "m") | {"cache_salt": "client"})
    salt_requests([body, object()], SECRET, digest("sk-a"))
    assert body.cache_salt == tenant_salt(SECRET, digest("sk-a"), "client")
    # vLLM's own validation (a non-empty string) takes it, as the engine will.
    assert model.model_validate(body.model_dump()).cache_salt == body.cache_salt


def test_a_missing_or_empty_salt_secret_stops_the_replica_at_start(tmp_path):
    from serve_app.ingress import read_salt_secret

    with pytest.raises(RuntimeError, match="cannot be read"):
        read_salt_secret(str(tmp_path / "nowhere"))
    (tmp_path / "salt").write_text("\n")
    with pytest.raises(RuntimeError, match="is empty"):
        read_salt_secret(str(tmp_path / "salt"))
    (tmp_path / "salt").write_text("abc\n")
    assert read_salt_secret(str(tmp_path / "salt")) == b"abc"
