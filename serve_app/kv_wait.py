"""Decode's wait for a KV transfer, bounded: a pull that makes no progress fails instead of hanging.

vLLM's NIXL worker polls each posted read with ``check_xfer_state`` and waits for as long as NIXL
answers ``PROC``. A peer that never answers (prefill's process frozen, its node gone without a
connection reset, SRD unreachable) leaves the read ``PROC`` forever: the request sits in
``WAITING_FOR_REMOTE_KVS`` with its blocks held, and ``kv_load_failure_policy`` never applies,
because nothing ever fails.

Here a request whose reads all stay ``PROC`` for ``stall_timeout_s`` (``kv_connector_extra_config``)
is failed the way vLLM fails a read NIXL reports failed (``_handle_failed_transfer``: its blocks
marked invalid, the request reported done receiving), so the scheduler applies the policy: decode
computes the prompt itself (``recompute``) or the request ends in an error (``fail``). Each such
request is counted (``pd_kv_transfer_stalls``, per engine) and logged with the prefill engine, host
and port it was pulling from.

The bound runs in decode's engine loop, where vLLM polls the reads. What it cannot interrupt is a
call into NIXL that does not return: NIXL's LIBFABRIC plugin posts each read in a loop that retries
``-FI_EAGAIN`` without a limit (``libfabric_rail.cpp``, ``postRead``, NIXL 1.3.1), so a peer the EFA
device cannot reach can block ``transfer()`` itself, and the engine loop with it, before there is
anything to poll. docs/troubleshooting.md says how that shows and what to do.

vLLM loads this class through ``kv_connector_module_path`` (an external module takes priority over
its registry), under the name ``NixlConnector``, so Ray Serve LLM still sets NIXL's side channel up
for it as for vLLM's own class. Imported in the engine processes only; it needs vLLM.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlBaseConnector, NixlPullConnector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import NixlPullConnectorScheduler
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlPullConnectorWorker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats, NixlPromMetrics
from vllm.logger import init_logger
from vllm.v1.metrics.utils import create_metric_per_engine

from serve_app.spec import STALL_TIMEOUT_KEY

# A child of vLLM's logger, so the line is formatted and routed as vLLM's own in the engine process.
logger = init_logger("vllm.serve_app.kv_wait")

# Exported by Ray Serve as ray_pd_kv_transfer_stalls_total (local/metrics.py), by Prometheus as
# pd_kv_transfer_stalls_total.
STALLS_METRIC = "pd_kv_transfer_stalls"

_STALLS = "num_stalled_transfers"


class StallCountingStats(NixlKVConnectorStats):
    """vLLM's NIXL transfer stats, plus the reads failed for making no progress."""

    def reset(self) -> None:
        super().reset()
        self.data[_STALLS] = []

    def record_stalled_transfer(self) -> None:
        self.data[_STALLS].append(1)

    def is_empty(self) -> bool:
        return super().is_empty() and not self.data[_STALLS]


class StallCountingPromMetrics(NixlPromMetrics):
    """vLLM's NIXL metrics, plus ``pd_kv_transfer_stalls`` per engine."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        counter = self._counter_cls(
            name=STALLS_METRIC,
            documentation=(
                "KV reads decode failed for making no progress for kv_connector_extra_config.stall_timeout_s; "
                "kv_load_failure_policy applied to each."
            ),
            labelnames=labelnames,
        )
        self.counter_stalled_transfers = create_metric_per_engine(counter, self.per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        super().observe(transfer_stats_data, engine_idx)
        for count in transfer_stats_data.get(_STALLS, ()):
            self.counter_stalled_transfers[engine_idx].inc(count)


class BoundedPullWorker(NixlPullConnectorWorker):
    """vLLM's pull worker, failing a request whose reads make no progress for the bound."""

    def __init__(self, vllm_config, engine_id, kv_cache_config):
        super().__init__(vllm_config, engine_id, kv_cache_config)
        transfer_config = vllm_config.kv_transfer_config
        self.xfer_stats = StallCountingStats()
        self.stall_timeout_s = float(transfer_config.get_from_extra_config(STALL_TIMEOUT_KEY, 0) or 0)
        self._failure_policy = transfer_config.kv_load_failure_policy
        self._backends = ",".join(transfer_config.get_from_extra_config("backends", ["UCX"]))
        # Per request still receiving: its reads in flight at the last poll, and when one last finished
        # (or when it was first seen in flight).
        self._last_progress: dict[str, tuple[int, float]] = {}

    def _pop_done_transfers(self, transfers: dict[str, list[int]]) -> set[str]:
        done = super()._pop_done_transfers(transfers)
        if self.stall_timeout_s > 0:
            self._fail_stalled(transfers, time.monotonic())
        for req_id in done:
            self._last_progress.pop(req_id, None)
        return done

    def _fail_stalled(self, transfers: dict[str, list[int]], now: float) -> None:
        for req_id, handles in list(transfers.items()):
            in_flight, since = self._last_progress.get(req_id, (len(handles) + 1, now))
            if len(handles) < in_flight:
                since = now
            self._last_progress[req_id] = (len(handles), since)
            if now - since < self.stall_timeout_s:
                continue
            del transfers[req_id]
            del self._last_progress[req_id]
            for handle in handles:
                self._release_stalled(req_id, handle)
            if req_id not in self._recving_metadata:
                continue  # vLLM already reported it done (one of its reads failed); nothing left to fail
            self._log_stall(req_id, now - since)
            self.xfer_stats.record_stalled_transfer()
            self._handle_failed_transfer(req_id, None)

    def _release_stalled(self, req_id: str, handle: int) -> None:
        # On UCX the release cancels the read (NIXL 1.3.1, ucx_backend.cpp: reqCancel); on LIBFABRIC it
        # frees NIXL's handle without cancelling reads already posted.
        try:
            self.nixl_wrapper.release_xfer_handle(handle)
        except Exception as error:  # NIXL refuses to release a transfer it cannot cancel
            logger.warning("KV read of request %s could not be released after it stalled: %s", req_id, error)

    def _log_stall(self, req_id: str, stalled_s: float) -> None:
        meta = self._recving_metadata.get(req_id)
        remote = meta.remote if meta is not None else None
        peer = f"prefill engine {remote.engine_id} at {remote.host}:{remote.port}" if remote else "an unknown peer"
        logger.error(
            "KV transfer stalled: request %s pulled from %s over %s made no progress for %.1f s "
            "(kv_connector_extra_config.%s %g); failed, kv_load_failure_policy %s applies",
            req_id,
            peer,
            self._backends,
            stalled_s,
            STALL_TIMEOUT_KEY,
            self.stall_timeout_s,
            self._failure_policy,
        )


class NixlConnector(NixlPullConnector):
    """vLLM's NIXL pull connector with :class:`BoundedPullWorker` on the worker side."""

    def __init__(self, vllm_config, role, kv_cache_config):
        # NixlPullConnector.__init__'s body with the bounded worker: calling it would start a NIXL agent
        # of its own first.
        NixlBaseConnector.__init__(self, vllm_config, role, kv_cache_config)
        self.connector_scheduler = None
        self.connector_worker = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = NixlPullConnectorScheduler(vllm_config, self.engine_id, kv_cache_config)
        elif role == KVConnectorRole.WORKER:
            self.connector_worker = BoundedPullWorker(vllm_config, self.engine_id, kv_cache_config)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> StallCountingStats:
        return StallCountingStats(data=data) if data is not None else StallCountingStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return StallCountingPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
