"""The prefix-affinity router a phase gets (serve_app/routers.py, with the keyword arguments
serve_app/spec.py renders), run as Serve runs it: Ray Serve LLM's router code and its prefix-tree
actor, on a local Ray, over Ray's own in-memory replicas for router tests (``FakeRunningReplica``)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

ray = pytest.importorskip("ray", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.serving

from ray.llm._internal.serve.core.configs.openai_api_models import (  # noqa: E402
    ChatCompletionRequest,
    CompletionRequest,
)
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor  # noqa: E402
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata  # noqa: E402
from ray.serve._private.request_router.common import PendingRequest  # noqa: E402
from ray.serve._private.test_utils import FakeRunningReplica  # noqa: E402
from ray.serve.llm.request_router import PrefixCacheAffinityRouter  # noqa: E402

from serve_app.routers import PrefixAffinityRouter, token_ids_text  # noqa: E402
from serve_app.spec import PhaseSpec  # noqa: E402

HISTORY = "the quick brown fox jumps over the lazy dog " * 4
# One tree actor for the module (each starts a worker process); every router's replicas are new
# tenants of it, so no two routers share a replica's history.
TENANTS = itertools.count()


@pytest.fixture(scope="module")
def tree_actor(local_ray):
    return PrefixTreeActor.remote()


def router_of(cls, tree_actor, queue_lens: dict[str, int], **kwargs):
    router = cls(
        deployment_id=DeploymentID(name="Decode", app_name="llm"), handle_source=DeploymentHandleSource.UNKNOWN
    )
    router.initialize_state(**kwargs, tree_actor=tree_actor)
    replicas = {}
    for name, queue_len in queue_lens.items():
        replicas[name] = FakeRunningReplica(f"{name}-{next(TENANTS)}")
        replicas[name].set_queue_len_response(queue_len)
    router.update_replicas(list(replicas.values()))
    return router, replicas


def pending(request) -> PendingRequest:
    return PendingRequest(args=[request], kwargs={}, metadata=RequestMetadata(request_id="r", internal_request_id="i"))


async def chosen(router, replicas, request) -> list[str]:
    """The replicas the router's prefix step picks for ``request`` (empty: power of two decides)."""
    (ranked,) = await router._prefix_match_best_replicas(pending(request), list(replicas.values()))
    return sorted(name for name, replica in replicas.items() if replica in ranked)


def routed(router, replicas, request, name: str) -> None:
    """What Serve does once it sent ``request`` to replica ``name``: the router records its prefix."""
    router.on_request_routed(pending(request), replicas[name].replica_id, None)


@pytest.fixture(scope="module")
def rendered_kwargs():
    return PhaseSpec(request_router="prefix_affinity").request_router_kwargs()


def test_token_id_prompts_find_the_replica_holding_their_prefix(tree_actor, rendered_kwargs):
    async def run():
        ids = list(range(40, 140))
        router, replicas = router_of(PrefixAffinityRouter, tree_actor, {"a": 0, "b": 0}, **rendered_kwargs)
        routed(router, replicas, CompletionRequest(model="m", prompt=ids), "b")
        assert await chosen(router, replicas, CompletionRequest(model="m", prompt=ids + [7, 8])) == ["b"]

        # Ray's own router divides 0 by 0 on the same request: its routing task dies.
        rays, rays_replicas = router_of(PrefixCacheAffinityRouter, tree_actor, {"a": 0, "b": 0}, **rendered_kwargs)
        with pytest.raises(ZeroDivisionError):
            await chosen(rays, rays_replicas, CompletionRequest(model="m", prompt=ids))

    asyncio.run(run())


def test_a_prompt_without_text_is_left_to_power_of_two(tree_actor, rendered_kwargs):
    async def run():
        embeds = CompletionRequest(model="m", prompt=None, prompt_embeds=b"AAAA")
        router, replicas = router_of(PrefixAffinityRouter, tree_actor, {"a": 0, "b": 0}, **rendered_kwargs)
        assert await chosen(router, replicas, embeds) == []
        routed(router, replicas, embeds, "a")  # nothing to record, nothing raised

        rays, rays_replicas = router_of(PrefixCacheAffinityRouter, tree_actor, {"a": 0, "b": 0}, **rendered_kwargs)
        with pytest.raises(ValueError, match="No request with message or prompt"):
            await chosen(rays, rays_replicas, embeds)

    asyncio.run(run())


def test_a_shared_prefix_yields_to_queues_that_differ_by_more_than_the_threshold(tree_actor, rendered_kwargs):
    async def run():
        chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": HISTORY}])
        busy = rendered_kwargs["imbalanced_threshold"] + 1
        router, replicas = router_of(PrefixAffinityRouter, tree_actor, {"a": busy, "b": 0}, **rendered_kwargs)
        routed(router, replicas, chat, "a")
        # Queues this far apart: power of two decides, which favours the idle replica.
        assert await chosen(router, replicas, chat) == []
        # Ray's default threshold (infinite) keeps sending it to the busy replica.
        rays, rays_replicas = router_of(PrefixCacheAffinityRouter, tree_actor, {"a": busy, "b": 0})
        routed(rays, rays_replicas, chat, "a")
        assert await chosen(rays, rays_replicas, chat) == ["a"]
        # Within the threshold, the prefix wins.
        near, near_replicas = router_of(PrefixAffinityRouter, tree_actor, {"a": busy - 1, "b": 0}, **rendered_kwargs)
        routed(near, near_replicas, chat, "a")
        assert await chosen(near, near_replicas, chat) == ["a"]

    asyncio.run(run())


def test_token_ids_keep_the_prefix_property():
    assert token_ids_text([1, 2, 3]).startswith(token_ids_text([1, 2]))
    # 12 then 3 is not a prefix of 1 then 23: each id is closed.
    assert not token_ids_text([1, 23]).startswith(token_ids_text([12]))
    assert token_ids_text([[1, 2], [3]]) == token_ids_text([1, 2, 3])
    assert token_ids_text("text") is None and token_ids_text([]) is None
