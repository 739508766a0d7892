# The user interface of the project. ENV=<name> picks config/<name>.yaml; CONFIG=<path> any file.
ENV ?= dev
CONFIG ?= config/$(ENV).yaml
OUTDIR ?= cdk.out
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CDK := node_modules/.bin/cdk
CDK_FLAGS := --app "$(abspath $(PY)) app.py" -c config=$(CONFIG) --no-notices --no-version-reporting
PYTEST_ARGS ?=
MODE ?= disaggregated
# make bench / bench-compare: the endpoint(s), workload preset, served model and its tokenizer.
URL ?=
PD_URL ?=
COLOCATED_URL ?=
LOCAL ?=
WORKLOAD ?= chat
MODEL ?= tiny-llama
TOKENIZER ?= $(abspath .local/tiny-llama)
# vLLM's CPU build needs PyTorch's CPU wheel, which PyPI does not serve.
TORCH_CPU := torch==2.13.0+cpu
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu

# jsii runs on Node 20 here; its end-of-life banner would bury the output.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true

.PHONY: synth deploy destroy test plan local bench bench-compare verify clean help

help:
	@echo "make synth   [ENV=dev|prod|CONFIG=path.yaml]  offline synth and a summary"
	@echo "make deploy  [ENV=…|CONFIG=…]                 cdk deploy"
	@echo "make destroy [ENV=…|CONFIG=…]                 cdk destroy"
	@echo "make plan    [ENV=…|CONFIG=…]                 memory fit, KV transfer cost, price"
	@echo "make local   [MODE=disaggregated|colocated]   serve_app on this CPU at http://127.0.0.1:8000/v1"
	@echo "make bench URL=… [WORKLOAD=chat|long-prompt|tiny] [MODEL=…] [TOKENIZER=…]"
	@echo "make bench-compare PD_URL=… COLOCATED_URL=… [WORKLOAD=…]   (or LOCAL=1: local CPU servers in turn)"
	@echo "make verify  [ENV=…|CONFIG=…]                 check a live deployment (uses your kubeconfig)"
	@echo "make test                                     install everything and run every test"

$(VENV)/.runtime: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

# The serving stack is a full lock installed without the resolver. The CPU torch wheel comes first:
# from a local wheelhouse if pip already knows one, else from PyTorch's CPU index.
$(VENV)/.serve: requirements-serve.txt $(VENV)/.dev
	$(PY) -m pip install -q --no-deps --no-index $(TORCH_CPU) 2>/dev/null \
	  || $(PY) -m pip install -q --no-deps --extra-index-url $(TORCH_INDEX_URL) $(TORCH_CPU)
	$(PY) -m pip install -q --no-deps -r requirements-serve.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: $(VENV)/.runtime node_modules/.installed
	$(CDK) synth $(CDK_FLAGS) --output $(OUTDIR) --quiet
	$(PY) -m cli.summary $(CONFIG) $(OUTDIR)

deploy: $(VENV)/.runtime node_modules/.installed
	$(PY) -m cli.deploy_guard $(CONFIG)
	$(CDK) deploy $(CDK_FLAGS) --output $(OUTDIR) --require-approval broadening --progress events

destroy: $(VENV)/.runtime node_modules/.installed
	$(CDK) destroy $(CDK_FLAGS) --output $(OUTDIR) --force

plan: $(VENV)/.runtime
	$(PY) -m cli.plan $(CONFIG)

test: $(VENV)/.serve node_modules/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

local: $(VENV)/.serve
	$(PY) -m local.server --mode $(MODE)

bench: $(VENV)/.serve
	@test -n "$(URL)" || { echo "make bench needs URL=<OpenAI base URL>, e.g. URL=http://127.0.0.1:8000/v1"; exit 2; }
	$(PY) -m bench.run --url $(URL) --workload $(WORKLOAD) --model $(MODEL) --tokenizer $(TOKENIZER)

bench-compare: $(VENV)/.serve
	@test -n "$(LOCAL)$(PD_URL)" || { echo "make bench-compare needs PD_URL=… COLOCATED_URL=…, or LOCAL=1"; exit 2; }
	$(PY) -m bench.compare $(if $(LOCAL),--local,--pd-url $(PD_URL) --colocated-url $(COLOCATED_URL)) \
	  --workload $(WORKLOAD) --model $(MODEL) --tokenizer $(TOKENIZER)

verify: $(VENV)/.dev
	$(PY) -m verify --config $(CONFIG) $(VERIFY_ARGS)

clean:
	rm -rf $(OUTDIR) .pytest_cache
