"""A small discrete-event simulation of serving one workload: colocated replicas, or xPyD.

Requests arrive by a Poisson process (``rate``) or from ``concurrency`` clients that each send the
next request when the last one ends. Every engine replica runs vLLM's loop as the planner models
it (planner/performance.py): a request is admitted when a sequence slot and KV cache for its prompt
and output are free; each step gives a token to every running sequence and fills the rest of the
token budget with prompt chunks (chunked prefill). An engine that does not mix the two (SGLang's
default, vLLM before chunked prefill) runs a step of prompt chunks alone whenever one is waiting, and
gives the running sequences their tokens only in the steps between. In P/D a prefill replica
computes the prompt (its one sampled token is dropped, as Ray's P/D does), the KV cache crosses the
link, all of it once the prefill is done (vLLM's NIXL connector) or chunk by chunk as the chunks are
computed (SGLang's P/D: ``Link.per_chunk``), and decode's first step on the request gives its first
token. With selective P/D a prompt whose uncached remainder is shorter than the threshold, and at
most the local prefill cap, is prefilled by decode itself (serve_app/selective.py's choice).
Requests go to the replica with the fewest in flight. Each token reaches its client through the
front end, one token at a time per process (its per-token cost: a replica's streams wait for each
other there at high concurrency); on a host whose cores the engines share with that front end (the
local servers: ``SharedHost``) every process's work is shared out over those cores.

Prefix hits (``Workload.prefix_hit_share``): that share of each prompt, in whole KV blocks, is already
in the cache of the engine that prefills it, so only the rest is computed (vLLM's prefix caching,
which recomputes at least a prompt's last token); in P/D decode holds the same blocks (the previous
turn's pull, a shared system prompt), so only the computed rest crosses the link (NixlConnector asks
prefill for decode's uncached blocks only). The cached blocks still take their room in each engine's
KV cache, as a conversation's own history does.
"""

from __future__ import annotations

import heapq
import itertools
import random
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from planner.core import KV_BLOCK_TOKENS
from planner.performance import Link, StepCost

# The share of requests at the start that only fill the system (their numbers are left out).
WARMUP_SHARE = 0.1
# Simulated seconds past the last arrival after which a plan counts as saturated (its requests queue
# without bound).
HORIZON_S = 3600.0


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int
    output_tokens: int
    range_ratio: float = 0.0  # lengths uniform over ±ratio around the means (bench/workloads.yaml's)
    concurrency: int | None = None
    rate: float | None = None  # requests per second
    requests: int = 400
    seed: int = 0
    # The share of each prompt found in the prefix cache (a conversation's history, a shared context).
    prefix_hit_share: float = 0.0
    # The share of requests at the start left out of the numbers: a steady state's (WARMUP_SHARE), or 0
    # for a benchmark's, which counts every request, its first burst and its last stragglers too.
    warmup_share: float = WARMUP_SHARE

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a workload has a concurrency or a rate, not both")
        if not 0 <= self.prefix_hit_share <= 1:
            raise ValueError(f"prefix_hit_share={self.prefix_hit_share:g} is not a share from 0 to 1")

    def cached_tokens(self, prompt: int) -> int:
        return cached_prefix_tokens(prompt, self.prefix_hit_share)

    def lengths(self) -> list[tuple[int, int]]:
        rng = random.Random(self.seed)

        def spread(mean: int) -> int:
            low, high = mean * (1 - self.range_ratio), mean * (1 + self.range_ratio)
            return max(1, round(rng.uniform(low, high)))

        return [(spread(self.prompt_tokens), spread(self.output_tokens)) for _ in range(self.requests)]


def local_prefill_limit(min_prompt_tokens: int, cap: int | None) -> int:
    """The uncached remainder below which decode prefills a prompt itself: the threshold, never above the
    cap (serve_app/selective.py, SelectivePDDecodeServer's limit: ``min(threshold, cap + 1)``)."""
    return min_prompt_tokens if cap is None else min(min_prompt_tokens, cap + 1)


def cached_prefix_tokens(prompt: int, share: float, block: int = KV_BLOCK_TOKENS) -> int:
    """The tokens of a ``prompt``-token prompt a prefix cache serves when ``share`` of it was seen:
    whole blocks only, and never the last token, which vLLM computes again for its logits
    (KVCacheManager.get_computed_blocks caps a hit at the prompt's length less one)."""
    return min(int(prompt * share) // block, (prompt - 1) // block) * block


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    itl_ms: float
    percentile: int = 90


@dataclass
class Request:
    index: int
    prompt: int
    output: int
    arrival: float
    prefill_here: bool = True  # computes its prompt on the engine it is on
    cached: int = 0  # prompt tokens found in the prefix cache: never computed, never moved
    prefilled: int = 0
    kv_bytes_moved: float = 0.0
    generated: int = 0
    token_times: list[float] = field(default_factory=list)
    done_at: float | None = None


@dataclass(frozen=True)
class EngineSpec:
    cost: StepCost
    kv_capacity_tokens: int
    max_num_seqs: int = 256
    token_budget: int = 2048
    # vLLM V1 (the engines this project deploys) puts prompt chunks and the running sequences' tokens
    # in one step. SGLang without --enable-mixed-chunk (its default; server_args.py) and vLLM 0.3's
    # scheduler (vllm/core/scheduler.py, `_schedule` returns a prompt_run before it schedules any
    # decode) run waiting prompts first, in a step of their own: decoding pauses while they run.
    mixed_batches: bool = True


@dataclass(frozen=True)
class SharedHost:
    """The CPU cores that the engines and the serving front end share, where they share any: on the
    local servers (`make local`) vLLM's engine processes, each Serve replica (the engine's server, the
    ingress), Ray Serve's HTTP proxy and the benchmark's client are processes of one small machine.
    Each process runs its own work in order (an engine its steps, a front-end stage the requests and
    streamed tokens passing it), and the processes with work to do share the cores equally, so a busy
    front end slows the engines' steps and a second engine slows the first. On a GPU node there is no
    such host: the engines run on their GPUs, each decode replica's front end on cores nothing else
    needs (``Efficiency.token_overhead_s``), and each request's fixed cost is a delay."""

    cores: float
    # The front-end processes a request and each of its tokens pass, in order from the engine out, each
    # as its CPU for one streamed token (detokenizing, a Serve handle's hop, an SSE chunk, the client's
    # parsing of it).
    token_seconds: tuple[float, ...]
    # The cores an engine uses while it steps: vLLM's EngineCore schedules the next step while its
    # Worker runs this one, so an engine is two processes, busy together part of the time.
    engine_cores: float = 1.0

    def __post_init__(self) -> None:
        if self.cores <= 0 or not self.token_seconds or min(self.token_seconds) < 0 or self.engine_cores < 1:
            raise ValueError(f"{self} has no cores, no front-end stage or a negative cost")


class _ProcessorSharing:
    """Work queued per process on a :class:`SharedHost`'s cores: each process runs its first job. A
    process has threads (``weight``) and uses up to ``need`` cores at full speed; the running ones share
    the cores as Linux shares them among runnable threads, each thread alike, none given more than its
    process needs (water-filling), and a process runs at its cores over its need."""

    def __init__(self, cores: float, wake: Callable[[float, int], None]) -> None:
        self.cores, self.wake = cores, wake
        self.queues: dict[object, deque[list]] = {}  # process -> [[work left, job], …]
        self.shape: dict[object, tuple[float, float]] = {}  # process -> (weight, need)
        self.clock = 0.0
        self.version = 0  # the wake-up pushed last; an older one finds nothing done

    def _speeds(self) -> dict[object, float]:
        running = [process for process, queue in self.queues.items() if queue]
        speeds: dict[object, float] = {}
        left, pending = self.cores, sorted(running, key=lambda p: self.shape[p][1] / self.shape[p][0])
        while pending:
            weights = sum(self.shape[p][0] for p in pending)
            per_weight = left / weights
            process = pending[0]
            weight, need = self.shape[process]
            if need <= weight * per_weight:
                speeds[process] = 1.0
                left -= need
                pending.pop(0)
                continue
            for process in pending:
                weight, need = self.shape[process]
                speeds[process] = weight * per_weight / need
            break
        return speeds

    def _advance(self, now: float) -> None:
        for process, speed in self._speeds().items():
            self.queues[process][0][0] -= (now - self.clock) * speed
        self.clock = now

    def _schedule(self, now: float) -> None:
        self.version += 1
        speeds = self._speeds()
        if speeds:
            at = min(max(self.queues[p][0][0], 0.0) / speed for p, speed in speeds.items())
            self.wake(now + at, self.version)

    def submit(
        self, now: float, process: object, seconds: float, job: tuple, weight: float = 1.0, need: float = 1.0
    ) -> None:
        self._advance(now)
        self.queues.setdefault(process, deque()).append([seconds, job])
        self.shape[process] = (weight, need)
        self._schedule(now)

    def finished(self, now: float, version: int) -> list[tuple]:
        if version != self.version:
            return []
        self._advance(now)
        done = [queue.popleft()[1] for queue in self.queues.values() if queue and queue[0][0] <= 1e-12]
        self._schedule(now)
        return done


class Engine:
    def __init__(self, spec: EngineSpec, role: str) -> None:
        self.spec, self.role = spec, role  # role: colocated, prefill or decode
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.kv_used = 0
        self.busy = False
        self.batch: tuple[list[Request], list[tuple[Request, int]]] = ([], [])
        self.steps = 0
        self.decode_batch_total = 0
        self.sending_until = 0.0  # a prefill engine's queue of chunks to send (Link.per_chunk)
        # What its steps' prompt chunks added to them: the step less the same step without them.
        self.prompt_seconds = 0.0

    def in_flight(self) -> int:
        return len(self.waiting) + len(self.running)

    def kv_need(self, request: Request) -> int:
        return request.prompt + (1 if self.role == "prefill" else request.output)

    def start_step(self) -> float | None:
        while self.waiting and len(self.running) < self.spec.max_num_seqs:
            need = self.kv_need(self.waiting[0])
            if self.kv_used + need > self.spec.kv_capacity_tokens and self.running:
                break
            self.kv_used += need
            self.running.append(self.waiting.popleft())
        decoding: list[Request] = []
        context = 0
        pending: list[Request] = []
        for request in self.running:
            if request.prefilled >= request.prompt:
                decoding.append(request)
                context += request.prompt + request.generated
            else:
                pending.append(request)
        if pending and not self.spec.mixed_batches:
            decoding, context = [], 0
        budget = self.spec.token_budget - len(decoding)
        chunks: list[tuple[Request, int]] = []
        tokens, attention, offsets = 0, 0.0, 0
        for request in pending:
            if budget <= 0:
                break
            take = min(budget, request.prompt - request.prefilled)
            chunks.append((request, take))
            tokens += take
            attention += take * (request.prefilled + take / 2)
            offsets += request.prefilled
            budget -= take
        if not decoding and not chunks:
            return None
        self.busy, self.batch = True, (decoding, chunks)
        self.steps += 1
        self.decode_batch_total += len(decoding)
        cost = self.spec.cost
        seconds = cost.step_seconds(len(decoding), context, tokens, attention, offsets, len(chunks))
        if chunks:
            self.prompt_seconds += seconds - (
                cost.step_seconds(len(decoding), context, 0, 0.0, 0, 0) if decoding else 0
            )
        return seconds

    def finish_step(self, now: float) -> tuple[list[Request], list[Request], list[Request]]:
        """(requests done here, prefills done here that go on to decode, requests given a token). The
        caller stamps each token: when the step ends, or when the front end has passed it."""
        decoding, chunks = self.batch
        self.busy, self.batch = False, ([], [])
        finished, handed_off, emitted = [], [], []
        for request in decoding:
            emitted.append(request)
        for request, take in chunks:
            request.prefilled += take
            if request.prefilled < request.prompt:
                continue
            if self.role == "prefill":
                handed_off.append(request)
            else:
                emitted.append(request)
        for request in emitted:
            request.generated += 1
            if request.generated >= request.output:
                finished.append(request)
        for request in finished + handed_off:
            self.running.remove(request)
            if self.role != "prefill":
                self.kv_used -= self.kv_need(request)
        return finished, handed_off, emitted


# The statistics `vllm bench serve` reports for each latency, under its own names
# (vllm/benchmarks/serve.py, process_one_metric: mean_ttft_ms, median_ttft_ms, p99_ttft_ms, …), so
# that a prediction is held against a benchmark's JSON key by key.
LATENCY_METRICS = ("ttft", "tpot", "itl")
REPORTED_PERCENTILES = (90, 95, 99)


def statistic_names(metric: str) -> list[str]:
    return [f"mean_{metric}_ms", f"median_{metric}_ms"] + [f"p{p}_{metric}_ms" for p in REPORTED_PERCENTILES]


def latency_statistics(metric: str, values: list[float], also: int | None = None) -> dict[str, float]:
    """``also``: one more percentile (the SLOs'), where it is not among those reported anyway."""
    tails = sorted({*REPORTED_PERCENTILES, *([also] if also and also != 50 else [])})
    return {
        f"mean_{metric}_ms": mean(values),
        f"median_{metric}_ms": percentile(values, 50),
        **{f"p{p}_{metric}_ms": percentile(values, p) for p in tails},
    }


@dataclass(frozen=True)
class Outcome:
    ttft_ms: dict[int, float]
    itl_ms: dict[int, float]
    ttft_mean_ms: float
    itl_mean_ms: float
    output_tokens_per_s: float
    goodput_rps: float
    requests_per_s: float
    meets_slo: bool
    saturated: bool
    mean_decode_batch: float
    requests: int
    # TTFT, TPOT and ITL as `vllm bench serve` names and computes them (LATENCY_METRICS).
    latency_ms: dict[str, float] = field(default_factory=dict)
    # Per request: the prompt tokens computed (not served by the prefix cache), the KV bytes that
    # crossed from prefill to decode (0 where decode prefilled it), and the engines' busy seconds
    # on prompts, what prefix hits save.
    prompt_tokens_computed: float = 0.0
    kv_bytes_moved: float = 0.0
    prefill_seconds: float = 0.0


def percentile(values: list[float], p: float) -> float:
    """numpy's default (linear between the closest ranks), which `vllm bench serve` uses."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = p / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def simulate(
    workload: Workload,
    slo: Slo,
    *,
    colocated: tuple[EngineSpec, int] | None = None,
    prefill: tuple[EngineSpec, int] | None = None,
    decode: tuple[EngineSpec, int] | None = None,
    link: Link | None = None,
    min_prompt_tokens: int = 0,
    request_overhead_s: float | None = None,
    local_prefill_cap: int | None = None,
    host: SharedHost | None = None,
) -> Outcome:
    """Colocated (``colocated=(spec, replicas)``) or P/D (``prefill``, ``decode``, ``link``).
    ``request_overhead_s``: each request's fixed cost outside the engines (default: the decode engine's
    device efficiency's), half before its arrival at an engine and half after its last token; on a
    ``host`` it is front-end work instead, half on the way in and half with the first token on the way
    out, spread over the stages.
    ``local_prefill_cap``: serving.pd_max_local_prefill_tokens, the most of a prompt decode prefills by
    the threshold's choice (None: no cap)."""
    local_limit = local_prefill_limit(min_prompt_tokens, local_prefill_cap)
    if colocated:
        front = [Engine(colocated[0], "colocated") for _ in range(colocated[1])]
        prefills: list[Engine] = []
        decodes = front
    else:
        assert prefill and decode and link
        prefills = [Engine(prefill[0], "prefill") for _ in range(prefill[1])]
        decodes = [Engine(decode[0], "decode") for _ in range(decode[1])]
    if request_overhead_s is None:
        request_overhead_s = decodes[0].spec.cost.device.efficiency.request_overhead_s
    overhead = request_overhead_s
    lengths = workload.lengths()
    counter = itertools.count()
    events: list[tuple[float, int, str, object]] = []

    def push(at: float, kind: str, payload: object) -> None:
        heapq.heappush(events, (at, next(counter), kind, payload))

    # The front end's stages, from the engine out, each a process; a token passes each in turn. On a
    # shared host the engines' steps run on its cores too, one set of stages serves every replica, and
    # the requests' fixed cost is work in them. Elsewhere each decode replica's streams pass a stage of
    # their own (its server's output processing), on cores nothing else needs, and the fixed cost is a
    # delay.
    token_seconds = host.token_seconds if host else ()
    shared = host is not None
    cpu = _ProcessorSharing(host.cores, lambda at, version: push(at, "cpu", version)) if host else None
    stage_share = overhead / 2 / len(token_seconds) if shared else 0.0
    # Elsewhere each decode replica's server is a queue of its own on cores of its own, so a token's
    # passing is known when the token is made: its cost after the replica's previous token passed.
    replica_token_s = 0.0 if shared else decodes[0].spec.cost.device.efficiency.token_overhead_s
    replica_free_at: dict[Engine, float] = {}

    def stage(index: int) -> tuple:
        return ("front-end stage", index)

    def least_loaded(pool: list[Engine]) -> Engine:
        return min(pool, key=Engine.in_flight)

    def kick(engine: Engine, now: float) -> None:
        if not engine.busy:
            seconds = engine.start_step()
            if seconds is None:
                return
            if shared:
                assert cpu is not None and host is not None
                # Two processes (EngineCore, its Worker) using engine_cores between them. A step costs what
                # it took with the engine alone on this host (calibration measures it so), at whatever
                # share of its need the host's cores then gave it.
                alone = min(1.0, host.cores / host.engine_cores)
                cpu.submit(now, engine, seconds * alone, ("step", engine), weight=2.0, need=host.engine_cores)
            else:
                push(now + seconds, "step", engine)

    requests: list[Request] = []

    def issue(now: float) -> None:
        index = len(requests)
        prompt, output = lengths[index]
        cached = workload.cached_tokens(prompt)
        request = Request(index, prompt, output, now, cached=cached, prefilled=cached)
        requests.append(request)
        if shared:
            assert cpu is not None
            last = len(token_seconds) - 1
            cpu.submit(now, stage(last), stage_share, ("in", request, last))
        else:
            push(now + overhead / 2, "arrive", request)

    def done(request: Request, at: float) -> None:
        request.done_at = at
        if workload.concurrency is not None and len(requests) < workload.requests:
            issue(at)

    def arrive(request: Request, now: float) -> None:
        local = not prefills or request.prompt - request.cached < local_limit
        target = least_loaded(decodes if local else prefills)
        request.prefill_here = local
        target.waiting.append(request)
        kick(target, now)

    def step_done(engine: Engine, now: float) -> None:
        computed = engine.batch[1]
        _, handed_off, emitted = engine.finish_step(now)
        kv_bytes = engine.spec.cost.kv_bytes_per_token
        if link is not None and link.per_chunk and engine.role == "prefill":
            for request, tokens in computed:
                request.kv_bytes_moved += tokens * kv_bytes
                engine.sending_until = max(now, engine.sending_until) + link.moving_seconds(tokens * kv_bytes)
                if request.prefilled >= request.prompt:
                    push(engine.sending_until + link.fixed_s, "kv", (request, engine))
        else:
            for request in handed_off:
                assert link is not None
                request.kv_bytes_moved = (request.prompt - request.cached) * kv_bytes
                push(now + link.seconds(request.kv_bytes_moved), "kv", (request, engine))
        for request in emitted:
            if cpu is not None:
                first = stage_share if request.generated == 1 else 0.0
                cpu.submit(now, stage(0), token_seconds[0] + first, ("out", request, 0, first))
                continue
            passed = now
            if replica_token_s > 0:
                passed = replica_free_at[engine] = max(now, replica_free_at.get(engine, 0.0)) + replica_token_s
            request.token_times.append(passed)
            if request.generated >= request.output:
                done(request, passed + overhead / 2)
        kick(engine, now)

    def front_end_passed(job: tuple, now: float) -> None:
        assert cpu is not None
        if job[0] == "in":
            _, request, index = job
            if index:
                cpu.submit(now, stage(index - 1), stage_share, ("in", request, index - 1))
            else:
                arrive(request, now)
            return
        _, request, index, first = job
        if index + 1 < len(token_seconds):
            work = token_seconds[index + 1] + first
            cpu.submit(now, stage(index + 1), work, ("out", request, index + 1, first))
            return
        request.token_times.append(now)
        if len(request.token_times) == request.output:
            done(request, now)

    horizon = HORIZON_S
    if workload.rate is not None:
        rng, at = random.Random(workload.seed + 1), 0.0
        for _ in range(workload.requests):
            issue(at)
            at += rng.expovariate(workload.rate)
        horizon += at
    else:
        for _ in range(min(workload.concurrency or 1, workload.requests)):
            issue(0.0)

    saturated = False
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if now > horizon:
            saturated = True
            break
        if kind == "arrive":
            assert isinstance(payload, Request)
            arrive(payload, now)
        elif kind == "kv":
            assert isinstance(payload, tuple)
            moved, source = payload
            source.kv_used -= source.kv_need(moved)
            kick(source, now)
            target = least_loaded(decodes)
            target.waiting.append(moved)
            kick(target, now)
        elif kind == "cpu":
            assert cpu is not None and isinstance(payload, int)
            for job in cpu.finished(now, payload):
                if job[0] == "step":
                    step_done(job[1], now)
                else:
                    front_end_passed(job, now)
        else:
            assert isinstance(payload, Engine)
            step_done(payload, now)
    if shared:
        overhead = 0.0  # counted where it was spent, in the front end's work
    outcome = _outcome(requests, workload, slo, saturated, decodes, overhead)
    prefilled = [r for r in requests if r.prefilled >= r.prompt]
    if not prefilled:
        return outcome
    return replace(
        outcome,
        prompt_tokens_computed=mean([r.prompt - r.cached for r in prefilled]),
        kv_bytes_moved=mean([r.kv_bytes_moved for r in prefilled]),
        prefill_seconds=sum(e.prompt_seconds for e in {*prefills, *decodes}) / len(prefilled),
    )


def _outcome(
    requests: list[Request], workload: Workload, slo: Slo, saturated: bool, decodes: list[Engine], overhead: float
) -> Outcome:
    done = [r for r in requests if r.done_at is not None]
    measured = done[int(len(done) * workload.warmup_share) :] if len(done) > 10 else done
    if not measured:
        nan = float("nan")
        return Outcome({}, {}, nan, nan, 0.0, 0.0, 0.0, False, True, nan, 0)
    ttfts = [(r.token_times[0] - r.arrival + overhead / 2) * 1e3 for r in measured]
    gaps = [(b - a) * 1e3 for r in measured for a, b in itertools.pairwise(r.token_times)]
    start = min(r.arrival for r in measured)
    end = max(r.done_at for r in measured if r.done_at is not None)
    span = max(end - start, 1e-9)

    def tpot_ms(r: Request) -> float:
        return (r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1) * 1e3 if len(r.token_times) > 1 else 0

    good = [r for r, ttft in zip(measured, ttfts, strict=True) if ttft <= slo.ttft_ms and tpot_ms(r) <= slo.itl_ms]
    # vLLM's TPOT counts only requests with more than one output token.
    tpots = [tpot_ms(r) for r in measured if len(r.token_times) > 1]
    # The SLO's own percentile too: the advisor reads it back for any percentile the schema allows.
    shown = sorted({50, 90, 99, slo.percentile})
    ttft = {p: percentile(ttfts, p) for p in shown}
    itl = {p: percentile(gaps, p) for p in shown}
    p = slo.percentile
    meets = percentile(ttfts, p) <= slo.ttft_ms and (not gaps or percentile(gaps, p) <= slo.itl_ms)
    steps = sum(e.steps for e in decodes)
    return Outcome(
        ttft_ms=ttft,
        itl_ms=itl,
        ttft_mean_ms=mean(ttfts),
        itl_mean_ms=mean(gaps),
        output_tokens_per_s=sum(r.output for r in measured) / span,
        goodput_rps=len(good) / span,
        requests_per_s=len(measured) / span,
        meets_slo=meets and not saturated,
        saturated=saturated,
        mean_decode_batch=sum(e.decode_batch_total for e in decodes) / steps if steps else 0.0,
        requests=len(measured),
        latency_ms={
            **latency_statistics("ttft", ttfts, slo.percentile),
            **latency_statistics("tpot", tpots, slo.percentile),
            **latency_statistics("itl", gaps, slo.percentile),
        },
    )


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")
