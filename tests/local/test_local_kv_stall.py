"""Decode's bounded wait for a KV read (serve_app/kv_wait.py), against a prefill that never answers.

Two engines of the local spec (config/local.yaml: its engine arguments, its kv_transfer_config with
the bound, its environment), each a vLLM ``AsyncLLM`` in a process of its own, with NIXL's UCX
backend between them. Prefill computes a prompt's KV; then its processes are frozen (SIGSTOP) and
decode is asked to pull that KV: the read is posted and never answered. Decode must fail it after
``kv_transfer.stall_timeout_s``, apply ``load_failure_policy`` (recompute: it computes the prompt
itself and answers), count it in ``pd_kv_transfer_stalls`` and log the prefill peer it was pulling
from. Without the bound, vLLM's NIXL worker waits for the read forever and decode never answers.

Why not a shared server of tests/local/conftest.py: there prefill's answer and decode's read follow
each other inside one request (Ray's P/D orchestration), so no test can freeze prefill between the
two. Why UCX_TLS=tcp,self: between nodes (the cluster's case) UCX reads over TCP, which needs the
peer to answer; on one host it would pick CMA, which reads the peer's memory without it, so a frozen
prefill would still "answer". The two engines start in about a minute each.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

from local.cluster import free_port
from tests.conftest import ROOT

pytest.importorskip("vllm", reason="the serving stack (requirements-serve.txt) is not installed")
pytestmark = pytest.mark.live

# One engine of the local spec's phase, answering a JSON line on stdin with a JSON line on a pipe of
# its own: on stdout, the engine core's log lines (another process, the same pipe) can land inside one.
ENGINE = """
import asyncio, dataclasses, json, os, sys, uuid
from prometheus_client import REGISTRY
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM
from local.paths import DEFAULT_SPEC
from serve_app.spec import load_spec

async def main(phase, answers):
    spec = load_spec(str(DEFAULT_SPEC))
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    # The engine's own arguments; the OpenAI front end's (tool parsers) are not the engine's.
    kwargs = {k: v for k, v in spec.engine_kwargs(phase).items() if k in fields}
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=spec.model.source, **kwargs))
    print(json.dumps("READY"), file=answers, flush=True)
    while line := await asyncio.to_thread(sys.stdin.readline):
        ask = json.loads(line)
        if ask.get("counters"):
            answer = {}
            for metric in REGISTRY.collect():
                for sample in metric.samples:
                    if sample.name.endswith("_total"):
                        key = sample.name + json.dumps(sorted(sample.labels.items()))
                        answer[key] = sample.value
        else:
            extra = {"kv_transfer_params": ask["kv"]} if ask.get("kv") else None
            # ignore_eos: prefill hands its KV over only when it stops at max_tokens (vLLM's NIXL connector,
            # request_finished); a random model may pick EOS first, and that prompt never crosses.
            params = SamplingParams(max_tokens=ask["max_tokens"], temperature=0, ignore_eos=True, extra_args=extra)
            async for out in engine.generate(ask["prompt"], params, request_id=uuid.uuid4().hex):
                final = out
            answer = {"text": final.outputs[0].text, "kv": final.kv_transfer_params,
                      "prompt_tokens": len(final.prompt_token_ids)}
        print(json.dumps(answer), file=answers, flush=True)
    engine.shutdown()

answers_fd = int(sys.argv[2])
os.set_inheritable(answers_fd, False)
asyncio.run(main(sys.argv[1], os.fdopen(answers_fd, "w")))
"""

START_BOUND_S = 360
# How long past the bound decode may take to answer a stalled request (it computes the prompt itself).
ANSWER_MARGIN_S = 60


class Engine:
    """An engine process, its answers and every line it prints, each read by a thread so that no
    wait blocks unbounded."""

    def __init__(self, phase: str, spec):
        self.phase, self.side_channel_port = phase, free_port()
        environ = {
            **os.environ,
            **spec.runtime_env(phase).get("env_vars", {}),
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_channel_port),
            "UCX_TLS": "tcp,self",
        }
        answers_read, answers_write = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", ENGINE, phase, str(answers_write)],
                cwd=ROOT,
                env=environ,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
                pass_fds=(answers_write,),
            )
        finally:
            os.close(answers_write)
        self.lines: list[str] = []
        self._answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_log, daemon=True).start()
        threading.Thread(target=self._read_answers, args=(os.fdopen(answers_read),), daemon=True).start()

    def _read_log(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)

    def _read_answers(self, answers) -> None:
        with answers:
            for line in answers:
                self._answers.put(json.loads(line))

    def next_answer(self, timeout: float):
        """The engine's next answer, or None after ``timeout``; an engine that exited fails the test
        with its last lines (the engine core, forked, may hold the answers' pipe open after it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return self._answers.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                assert self.process.poll() is None or not self._answers.empty(), (
                    f"the {self.phase} engine exited:\n{''.join(self.lines[-40:])}"
                )
        return None

    def ask(self, timeout: float = 120, **question):
        self.process.stdin.write(json.dumps(question) + "\n")
        self.process.stdin.flush()
        return self.next_answer(timeout)

    def counters(self) -> dict[str, float]:
        time.sleep(1.5)  # the engine's stats reach its front end with its next output
        return self.ask(counters=True)

    def stop(self) -> None:
        """Closes stdin (the engine shuts down as it does when served), SIGKILLs what is left after a
        bound, and removes the shared memory its processes mapped, which a SIGKILL leaves behind."""
        from local.lifecycle import remove_unmapped, session_members, shared_memory_of, wait_gone

        members = session_members(self.process.pid)
        mapped = shared_memory_of(members)
        os.killpg(self.process.pid, signal.SIGCONT)
        self.process.stdin.close()
        left = wait_gone(members, 60)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(30)
        assert not wait_gone(left, 30), f"the {self.phase} engine's processes outlived SIGKILL"
        remove_unmapped(mapped)
        assert not [segment for segment in mapped if segment.exists()], "the engines left shared memory behind"


def counted(counters: dict[str, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for key, value in counters.items():
        sample, _, labels_json = key.partition("[")
        found = dict(json.loads("[" + labels_json))
        if sample == name and all(found.get(k) == v for k, v in labels.items()):
            total += value
    return total


CROSSED = "prompt tokens read from prefill"
COMPUTED = "prompt tokens computed"
FAILED = "KV reads failed"
STALLED = "KV reads stalled"
WHICH_WAY = {
    CROSSED: ("vllm:prompt_tokens_by_source_total", {"source": "external_kv_transfer"}),
    COMPUTED: ("vllm:prompt_tokens_by_source_total", {"source": "local_compute"}),
    FAILED: ("vllm:nixl_num_failed_transfers_total", {}),
    STALLED: ("pd_kv_transfer_stalls_total", {}),
}


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Which way decode went between two reads of its counters: read the KV, computed the prompt,
    failed a read, failed one for stalling."""
    return {
        what: counted(after, name, **labels) - counted(before, name, **labels)
        for what, (name, labels) in WHICH_WAY.items()
    }


@pytest.fixture(scope="module")
def engines(shared_servers):
    from local.paths import DEFAULT_SPEC
    from local.tiny_model import ensure_tiny_model
    from serve_app.spec import load_spec

    shared_servers.stop()  # two engines are all this machine's cores can run beside the test
    spec = load_spec(str(DEFAULT_SPEC))
    ensure_tiny_model(ROOT / spec.model.source)
    # One after the other: two engines loading at once on two cores, beside whatever else runs, take
    # longer than one and then the other.
    started: list[Engine] = []
    try:
        for phase in ("prefill", "decode"):
            started.append(Engine(phase, spec))
            ready = started[-1].next_answer(START_BOUND_S)
            assert ready == "READY", f"the {phase} engine did not start in {START_BOUND_S} s:\n" + "".join(
                started[-1].lines[-30:]
            )
        yield spec, *started
    finally:
        for engine in started:
            engine.stop()


def test_a_kv_read_from_a_prefill_that_never_answers_fails_after_the_bound_and_decode_recomputes(engines):
    spec, prefill, decode = engines
    bound = spec.kv_transfer.stall_timeout_s
    prompt = "The stall test's prompt reads on and on. " * 20

    # A pull that works first: decode's handshake with prefill is done, and KV crossed with nothing
    # failed or stalled. On two busy cores both engines spin between steps, and a first handshake may
    # time out (vLLM gives prefill 5 s to answer it) or a first read outlast the bound: another try.
    for attempt in range(3):
        before = decode.counters()
        warm = prefill.ask(prompt=f"Warm {attempt}: " + prompt, max_tokens=1, kv={"do_remote_decode": True})
        pulled = decode.ask(prompt=f"Warm {attempt}: " + prompt, max_tokens=4, kv=warm["kv"])
        after = decode.counters()
        warm_moved = moved(before, after)
        if warm_moved[CROSSED] >= pulled["prompt_tokens"] - 1 and not warm_moved[FAILED] and not warm_moved[STALLED]:
            break
    else:
        raise AssertionError(
            f"no clean KV pull from prefill to decode in 3 tries (last: {warm_moved}):\n" + "".join(decode.lines[-40:])
        )

    # Prefill holds the next prompt's KV for decode, and freezes. The bound is what this test is about:
    # a read that ended before it without the bound firing (it completed, or failed some other way)
    # did not test it, and the setup is tried once more, with a warning that names how it ended.
    for attempt in range(2):
        held_prompt = f"Held {attempt}: " + prompt
        held = prefill.ask(prompt=held_prompt, max_tokens=1, kv={"do_remote_decode": True})
        assert held["kv"] and held["kv"].get("remote_block_ids"), f"prefill held no KV for decode: {held}"
        logged_before = len(decode.lines)
        os.killpg(prefill.process.pid, signal.SIGSTOP)
        asked = time.monotonic()
        answer = decode.ask(timeout=bound + ANSWER_MARGIN_S, prompt=held_prompt, max_tokens=4, kv=held["kv"])
        waited = time.monotonic() - asked
        assert answer is not None, f"decode did not answer within {bound + ANSWER_MARGIN_S:g} s of a stalled KV read"
        stalled = decode.counters()
        stalled_moved = moved(after, stalled)
        if waited >= bound or stalled_moved[STALLED] or attempt == 1:
            break
        warnings.warn(
            f"decode's read from a frozen prefill ended after {waited:.1f} s without the bound: {stalled_moved}",
            stacklevel=1,
        )
        os.killpg(prefill.process.pid, signal.SIGCONT)
        after = stalled
    assert waited >= bound, (
        f"decode answered {waited:.1f} s after a read from a frozen prefill: {held['kv']}; {stalled_moved}\n"
        + "".join(decode.lines[-40:])
    )

    assert stalled_moved[STALLED] == 1 and stalled_moved[FAILED] == 1, stalled_moved
    # Recompute: decode computed the prompt itself, and answers as it does with no prefill at all.
    assert stalled_moved[COMPUTED] >= answer["prompt_tokens"] - 1, stalled_moved
    alone = decode.ask(prompt=held_prompt, max_tokens=4)
    assert answer["text"] == alone["text"]

    peer = f"prefill engine {held['kv']['remote_engine_id']} at 127.0.0.1:{prefill.side_channel_port} over UCX"
    logged = [line for line in decode.lines[logged_before:] if "KV transfer stalled" in line]
    assert len(logged) == 1 and peer in logged[0], "".join(logged) or "no stall logged"
    assert f"made no progress for {bound:.0f}." in logged[0] and "kv_load_failure_policy recompute" in logged[0]
