#!/usr/bin/env bash
# The GPU check, as one script for a machine with one NVIDIA GPU and no network:
#   bash bench/gpu/run.sh OUT_DIR
# It needs a Python with the serving image's stack: Ray 2.58.0, vLLM 0.26.0 (its CUDA build), PyTorch
# 2.11.0 and NIXL 1.3.1 (config/versions.py, SERVING_STACK_PINS); python -m config.serve_lock
# --installed stops it in one line per difference. Wheels carried in .whl/ are installed first,
# offline. Results (KV evidence, tables, plots) go to OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:?usage: bench/gpu/run.sh OUT_DIR}"
mkdir -p "$out"
# The KV path's node checks first (verify/efa.py), as make verify runs them in the worker containers:
# the EFA device, the locked-memory limit, libfabric's efa provider and whether the device reads and
# writes itself. A machine without EFA records "no EFA device", which is evidence too.
sh -c "$(python3 -m verify.efa --script)" > "$out/efa-node.txt" 2>&1 || true
python3 -m verify.efa --judge "$out/efa-node.txt" | tee "$out/efa-node-verdict.txt" || true
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m config.serve_lock --installed
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.csv"
python3 -m local.tiny_model .local/tiny-llama
export PYTHONUNBUFFERED=1
python3 -m bench.gpu.check --out "$out" 2>&1 | tee "$out/check.log"
