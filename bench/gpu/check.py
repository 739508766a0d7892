"""The GPU check: serve_app with real vLLM on one GPU, both phases on it, NIXL between them.

    python -m bench.gpu.check --out DIR [--spec bench/gpu/one-gpu.yaml]

Starts the disaggregated app, proves decode reused prefill's KV from the engines' counters,
then runs the tiny and chat workloads on both modes and writes the comparison to DIR.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bench.compare import compare
from bench.run import default_tokenizer
from cmdline import ArgumentParser
from local.harness import LocalServer
from local.metrics import NIXL_TRANSFERS, PROMPT_TOKENS_BY_SOURCE, counter_delta

HERE = Path(__file__).resolve().parent
DEFAULT_SPEC = HERE / "one-gpu.yaml"


def kv_evidence(spec: Path) -> dict:
    import openai  # here, not at the top, so that --help and a mistyped flag answer at once

    server = LocalServer(mode="disaggregated", spec=spec).start()
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=120)
        before = server.counters()
        started = time.monotonic()
        response = client.completions.create(model="tiny-llama", prompt="gpu check " + "x" * 190, max_tokens=8)
        latency = time.monotonic() - started
        time.sleep(3)
        after = server.counters()
        return {
            "ready_seconds": server.status.get("ready_seconds"),
            "one_request_seconds": round(latency, 3),
            "prompt_tokens": response.usage.prompt_tokens,
            "decode_external_kv_tokens": counter_delta(
                before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "external_kv_transfer"
            ),
            "decode_local_tokens": counter_delta(before, after, "Decode", PROMPT_TOKENS_BY_SOURCE, "local_compute"),
            "nixl_transfers": counter_delta(before, after, "Decode", NIXL_TRANSFERS),
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m bench.gpu.check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the KV evidence, tables and plots")
    parser.add_argument(
        "--spec", default=str(DEFAULT_SPEC), help="serving spec of the local servers (default: bench/gpu/one-gpu.yaml)"
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    evidence = kv_evidence(Path(args.spec))
    (out / "kv-evidence.json").write_text(json.dumps(evidence, indent=2))
    print(json.dumps(evidence, indent=2), flush=True)
    for workload in ("tiny", "chat"):
        text = compare(
            workload_name=workload,
            model="tiny-llama",
            tokenizer=default_tokenizer(),
            out_dir=out / workload,
            local=True,
            spec=Path(args.spec),
        )
        print(text, flush=True)
    ok = evidence["decode_external_kv_tokens"] == evidence["prompt_tokens"] and evidence["decode_local_tokens"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
