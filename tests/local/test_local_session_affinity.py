"""``request_router: session_affinity`` (Ray Serve's ConsistentHashRouter) on a live P/D server with
two decode replicas: every turn of a conversation that sends one ``x-session-id`` reaches the same
decode replica, told by that replica's own vLLM counters, and its next turns hit the history that
replica holds.

It runs on the ``ray-cluster`` shared server, whose decode phase has two replicas behind
``session_affinity`` for this (tests/local/conftest.py): no other shared server has two replicas of
a phase, and a start of its own would cost a server start; the GCS kill that ends that server's use
comes after this test (``ORDER``).
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.local.conftest import openai_client, report_measurement, unique_prompt

pytestmark = pytest.mark.live

# vLLM's counters of one engine: requests it finished, and prompt tokens it found in its prefix cache.
FINISHED = "ray_vllm_request_success_total"
# At most this many conversations, until each decode replica has had two: the ring places sessions
# by hash, so which replica a session lands on is not chosen here (all on one: 2**-15).
MAX_CONVERSATIONS = 16
TURNS = 3


def decode_counters(server, metric: str) -> dict[str, float]:
    from local.metrics import replica_counters, scrape

    samples = [sample for url in server.metrics_urls() for sample in scrape(url)]
    return replica_counters(samples, server.replicas(), "Decode", metric)


def served_by(server, before: dict[str, float], timeout: float = 30) -> tuple[str, dict[str, float]]:
    """The decode replica whose finished-request counter grew by one since ``before``, and the counters."""
    deadline = time.monotonic() + timeout
    while True:
        after = decode_counters(server, FINISHED)
        grown = [rid for rid, value in after.items() if value > before.get(rid, 0.0)]
        if len(grown) == 1 and after[grown[0]] - before.get(grown[0], 0.0) == 1:
            return grown[0], after
        assert time.monotonic() < deadline, f"no single decode replica counted the request: {before} -> {after}"
        time.sleep(1)


def test_a_conversations_turns_reach_one_decode_replica(shared_servers):
    from local.metrics import PREFIX_CACHE_HITS, settled
    from serve_app.spec import SESSION_HEADER

    server = shared_servers.get("ray-cluster")
    decode = {rid for rid, name in server.replicas().items() if name.startswith("Decode")}
    assert len(decode) == 2, server.replicas()
    client = openai_client(server)
    model = server.status["model"]

    homes: dict[str, list[str]] = {}
    next_turn_hits: list[float] = []
    # The last request of the test before this one on this server may not be exported yet (Ray exports
    # the engines' counters each second): counted before the first turn, it is not taken for that turn's.
    before = settled(lambda: decode_counters(server, FINISHED))
    for _ in range(MAX_CONVERSATIONS):
        session = uuid.uuid4().hex
        prompt = unique_prompt(f"session {session}", 300)
        for index in range(TURNS):
            hits_before = decode_counters(server, PREFIX_CACHE_HITS)
            reply = client.completions.create(
                model=model,
                prompt=prompt,
                max_tokens=8,
                temperature=0,
                extra_body={"ignore_eos": True},
                extra_headers={SESSION_HEADER: session},
            )
            replica, before = served_by(server, before)
            homes.setdefault(session, []).append(replica)
            if index:
                hits = decode_counters(server, PREFIX_CACHE_HITS)
                next_turn_hits.append(hits.get(replica, 0.0) - hits_before.get(replica, 0.0))
            prompt += reply.choices[0].text + f"\nUser: and turn {index + 2}? "
        per_replica = {rid: sum(1 for turns in homes.values() if turns[0] == rid) for rid in decode}
        if min(per_replica.values()) >= 2:
            break

    report_measurement(
        "session-affinity",
        {
            "conversations": len(homes),
            "conversations_per_decode_replica": sorted(per_replica.values()),
            "next_turn_prefix_cache_hit_tokens": next_turn_hits,
        },
    )
    # Every turn of a conversation on one replica, and both replicas serving conversations.
    assert all(len(set(turns)) == 1 for turns in homes.values()), homes
    assert min(per_replica.values()) >= 2, per_replica
    # Each next turn found the history in that replica's prefix cache (whole KV blocks of it).
    assert all(hits > 0 for hits in next_turn_hits), next_turn_hits
