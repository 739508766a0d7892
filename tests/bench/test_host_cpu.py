"""bench/host_cpu.py: what each process of a local server spent, by the role its title names.

The processes here are real ones titled as Ray and vLLM title theirs (``exec -a`` sets the title a
process shows in /proc, as Ray's and vLLM's setproctitle do), one of them spinning on the CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from bench.host_cpu import (
    AUTOGROUP_ENABLED,
    CLIENT,
    SERVER_AUTOGROUP_NICE,
    accounted,
    autogroup_nice,
    behind_the_client,
    role,
    title,
)

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")

DECODE_REPLICA = "ray::ServeReplica:llm:Decode:tiny-llama"
# A Serve replica, the vLLM engine under it and its worker, the first spinning for a few seconds.
TREE = f"""
exec -a {DECODE_REPLICA}.handle_request bash -c '
  (exec -a VLLM::EngineCore bash -c "(exec -a VLLM::Worker sleep 30) & wait") &
  end=$((SECONDS + 4)); while [ $SECONDS -lt $end ]; do :; done
  wait'
"""


@pytest.fixture
def server():
    process = subprocess.Popen(["bash", "-c", TREE], start_new_session=True)
    # Until the worker's title shows: a forked subshell counts as a member before it execs, under its
    # parent's title, so a count of members can come first on a busy machine.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
        (title(pid) or "").startswith("VLLM::Worker") for pid in _members(process.pid)
    ):
        time.sleep(0.05)
    yield process
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


def _members(session: int) -> list[int]:
    from local.lifecycle import session_members

    return session_members(session)


def test_a_role_is_the_title_less_the_method_and_vllm_s_processes_say_whose_they_are(server):
    roles = {role(pid) for pid in _members(server.pid)}
    replica = "ServeReplica:llm:Decode:tiny-llama"
    assert {replica, f"EngineCore of {replica}", f"Worker of EngineCore of {replica}"} <= roles


def test_each_role_is_charged_the_cpu_its_processes_spent_in_the_block(server):
    with accounted(server.pid) as spent:
        time.sleep(0.8)
    replica = "ServeReplica:llm:Decode:tiny-llama"
    # The replica spins through the block; the engine and its worker sleep.
    assert spent[replica] >= 0.3
    assert spent[f"Worker of EngineCore of {replica}"] < 0.05
    assert spent[CLIENT] < 0.3  # this process slept
    assert 0.75 <= spent["wall_s"] < 2


def test_the_server_s_session_is_put_behind_the_client_and_the_client_s_is_left_as_it_was(server):
    ours = autogroup_nice(os.getpid())
    line = behind_the_client(server.pid)
    if AUTOGROUP_ENABLED.read_text().strip() != "1":
        # The kernel weighs threads one by one: nothing is changed, and the line says why that is enough.
        assert line.startswith("autogroup off:") and autogroup_nice(server.pid) == ours
        return
    # Every process of the session, the ones it started before the call too, shares the one autogroup.
    members = _members(server.pid)
    assert len(members) >= 3
    assert {autogroup_nice(pid) for pid in members} == {SERVER_AUTOGROUP_NICE}
    assert autogroup_nice(os.getpid()) == ours
    assert line == f"the server's session at autogroup nice {SERVER_AUTOGROUP_NICE}, the client's at {ours}"


def test_a_session_the_kernel_will_not_reorder_is_said_to_share_the_cores_as_an_equal():
    if AUTOGROUP_ENABLED.read_text().strip() != "1":
        pytest.skip("autogroup is off: nothing is written")
    gone = 2**22 + 1  # above pid_max's ceiling: no such process
    line = behind_the_client(gone)
    assert line.startswith("the server's session left as it was (")
    assert line.endswith("the client shares the cores with it as an equal")
