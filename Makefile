# The user interface of the project. ENV=<name> picks config/<name>.yaml; CONFIG=<path> any file.
ENV ?= dev
CONFIG ?= config/$(ENV).yaml
OUTDIR ?= cdk.out
# The venv is made with the serving image's Python (config/versions.py, SERVING_IMAGE_PYTHON_VERSION):
# python3.13 on the PATH, else pyenv's 3.13; PYTHON=… picks another (python -m config.serve_lock notes it).
IMAGE_PYTHON := 3.13
PYTHON ?= $(or $(shell for p in python$(IMAGE_PYTHON) $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$(IMAGE_PYTHON).*/bin/python$(IMAGE_PYTHON); do \
  "$$p" -c '' 2>/dev/null && { echo "$$p"; break; }; done),$(error Python $(IMAGE_PYTHON), the serving image's, is needed for the venv: install it (pyenv install $(IMAGE_PYTHON), or your distribution's python$(IMAGE_PYTHON)), or name another with PYTHON=python3.x))
# checkov and network-config-analyzer are locked for Python 3.11 in venvs of their own.
TOOLS_PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CDK := node_modules/.bin/cdk
CDK_FLAGS := --app "$(abspath $(PY)) app.py" -c config=$(CONFIG) --no-notices --no-version-reporting
PYTEST_ARGS ?=
# Tests without a live server run on two workers, a test file per worker (its module fixtures stay
# whole); the live tests run after them, one server at a time, on the cores they need.
PARALLEL ?= -n 2 --dist loadfile
# pytest's exit status when a selection holds no test (PYTEST_ARGS naming only live, or no live, tests).
NO_TESTS_COLLECTED := 5
# Where the pinned Helm charts are read from (tests, make charts fills it); CI points it at a copy.
CHART_CACHE ?= .cache/charts
export CHART_CACHE
# checkov pins dependencies that clash with the runtime's (boto3 among them), so it has a venv of its own.
CHECKOV_VENV := .venv-checkov
# network-config-analyzer (the NetworkPolicy cross-check) pins PyYAML and networkx exactly: a venv of its own too.
NCA_VENV := .venv-nca
MODE ?= disaggregated
ASSET ?=
# make local HA=1: the cluster's shape, GCS fault tolerance on a loopback Redis (make installs Debian's redis-server).
HA ?=
# make preview TEMPLATE=<file>: the template to compare with; make deploy ALLOW_REPLACEMENT=1.
TEMPLATE ?=
ALLOW_REPLACEMENT ?=
# make deploy REQUIRE_APPROVAL=never: no prompt (a pipeline), for the template the last make preview showed only.
REQUIRE_APPROVAL ?=
# make local API_KEY=…: the ingress asks every request for this key; make bench and make verify
# send it. Passed to the commands in their environment, never on a command line make would echo.
API_KEY ?=
export API_KEY
# Extra flags for the local server, e.g. LOCAL_ARGS='--port 8010 --nixl-port-base 30000'.
LOCAL_ARGS ?=
# Extra flags for make mirror-model, e.g. MIRROR_ARGS='--repo Qwen/Qwen2.5-7B-Instruct --dry-run'.
MIRROR_ARGS ?=
# make bench / bench-compare: the endpoint(s), workload preset, served model and its tokenizer.
URL ?=
PD_URL ?=
COLOCATED_URL ?=
LOCAL ?=
# make plan: bench results to calibrate the advisor with, and more flags for python -m cli.plan.
CALIBRATION ?=
PLAN_ARGS ?=
WORKLOAD ?= chat
MODEL ?= tiny-llama
TOKENIZER ?= $(abspath .local/tiny-llama)

# jsii runs on Node 20 here; its end-of-life banner would bury the output.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true

.PHONY: synth deploy preview destroy check test test-unit test-consumers test-deps unit-deps consumer-deps redis-server charts plan plan-local local bench bench-compare verify upgrade-crds mirror-model clean help

help:
	@echo "make synth   [ENV=dev|prod|CONFIG=path.yaml]  offline synth and a summary"
	@echo "make preview [ENV=…|CONFIG=…] [TEMPLATE=file]  what the next deploy would do, in serving terms"
	@echo "make deploy  [ENV=…|CONFIG=…] [ALLOW_REPLACEMENT=1] [REQUIRE_APPROVAL=never]   preview, then cdk deploy"
	@echo "make destroy [ENV=…|CONFIG=…]                 cdk destroy"
	@echo "make plan    [ENV=…|CONFIG=…] [CALIBRATION=…] [PLAN_ARGS=…]  memory fit, KV transfer cost, price,"
	@echo "                                              colocated vs P/D for a workload (PLAN_ARGS='--prompt-tokens 4096 --concurrency 8 --json')"
	@echo "make plan-local RESULTS='DIR …'               the advisor's prediction of the local servers beside make bench-compare LOCAL=1 runs"
	@echo "make local   [MODE=disaggregated|colocated] [ASSET=1] [HA=1] [API_KEY=…]   serve_app on this CPU at http://127.0.0.1:8000/v1"
	@echo "make bench URL=… [WORKLOAD=chat|long-prompt|shared-context-rag|multi-turn-agent|tiny] [MODEL=…] [TOKENIZER=…] [API_KEY=…] [METRICS_URL=…]"
	@echo "make bench-compare PD_URL=… COLOCATED_URL=… [WORKLOAD=…] [PD_METRICS_URL=… COLOCATED_METRICS_URL=…]   (or LOCAL=1: local CPU servers in turn)"
	@echo "make verify  [ENV=…|CONFIG=…] [API_KEY=…]     check a live deployment (uses your kubeconfig)"
	@echo "make mirror-model [ENV=…|CONFIG=…] [MIRROR_ARGS='--repo ID --dry-run']   copy the model to the stack's S3 mirror (a Job)"
	@echo "make upgrade-crds [ENV=…|CONFIG=…]            KubeRay's CRDs at the pinned version, server-side (before a chart bump)"
	@echo "make charts                                   helm pull the pinned charts into CHART_CACHE (needs internet)"
	@echo "make check                                    lint, format check, types, import contracts"
	@echo "make test-unit                                fast tests: no serving stack, no live server, no consumer's program"
	@echo "make test-consumers                           the tests that run the CDK CLI, checkov, cfn-guard, Helm, Kubernetes' schemas"
	@echo "make test                                     install everything and run every test"

# A venv of another Python than PYTHON (one made before the image's Python was the venv's) is made again.
PY_MINOR := import sys; print(*sys.version_info[:2], sep=".")
$(VENV)/.runtime: requirements.txt
	@test -x $(PY) && test "$$($(PY) -c '$(PY_MINOR)')" = "$$($(PYTHON) -c '$(PY_MINOR)')" \
	  || { test ! -e $(VENV) || echo "$(VENV) is not $(PYTHON)'s Python: making it again"; rm -rf $(VENV); $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

# The serving stack is the image's (config/versions.py), a full lock installed without the resolver;
# a lock that disagrees with the image's versions stops here in one line per distribution.
$(VENV)/.serve: requirements-serve.txt config/versions.py $(VENV)/.dev
	$(PY) -m config.serve_lock --requirements requirements-serve.txt
	$(PY) -m pip install -q --no-deps -r requirements-serve.txt
	$(PY) -m config.serve_lock --installed
	touch $@

$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	test -x $(CHECKOV_VENV)/bin/python || $(TOOLS_PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --no-deps -r requirements-checkov.txt
	touch $@

$(NCA_VENV)/.installed: requirements-nca.txt
	test -x $(NCA_VENV)/bin/python || $(TOOLS_PYTHON) -m venv $(NCA_VENV)
	$(NCA_VENV)/bin/pip install -q --no-deps -r requirements-nca.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: $(VENV)/.runtime node_modules/.installed
	$(CDK) synth $(CDK_FLAGS) --output $(OUTDIR) --quiet
	$(PY) -m cli.summary $(CONFIG) $(OUTDIR)

# The guard checks the config, then your credentials (account, your IAM role, your address, GPU
# quota and capacity, principals, the token secret, what a destroy left behind) and reads the node
# groups' sizes; the stack is synthesized with them (an existing group's size stays the autoscaler's),
# previewed in serving terms against the deployed template, and that same assembly is deployed.
# ALLOW_REPLACEMENT=1: the preview named a stateful replacement and it is intended.
deploy: $(VENV)/.runtime node_modules/.installed
	$(PY) -m cli.deploy $(CONFIG) --outdir $(OUTDIR) --cdk $(CDK) --summary-only $(if $(ALLOW_REPLACEMENT),--allow-replacement) \
	  $(if $(REQUIRE_APPROVAL),--require-approval $(REQUIRE_APPROVAL))

# What the next make deploy would do, synthesized as make deploy synthesizes it. TEMPLATE=file
# compares with a saved template instead of the deployed one: offline, no credentials.
preview: $(VENV)/.runtime node_modules/.installed
	$(PY) -m cli.deploy $(CONFIG) --preview-only --outdir $(OUTDIR) --cdk $(CDK) $(if $(TEMPLATE),--template $(TEMPLATE)) $(if $(ALLOW_REPLACEMENT),--allow-replacement)

destroy: $(VENV)/.runtime node_modules/.installed
	$(CDK) destroy $(CDK_FLAGS) --output $(OUTDIR) --force

plan: $(VENV)/.runtime
	$(PY) -m cli.plan $(CONFIG) $(if $(CALIBRATION),--calibration $(CALIBRATION)) $(PLAN_ARGS)

# The advisor's model of the local CPU servers beside runs of make bench-compare LOCAL=1
# (WORKLOAD=local-long and local-short, three runs each for medians of three).
RESULTS ?=
plan-local: $(VENV)/.serve
	@test -n "$(RESULTS)" || { echo "make plan-local needs RESULTS='DIR …': results folders of make bench-compare LOCAL=1"; exit 2; }
	$(PY) -m planner.local_check $(RESULTS)

# The one quality gate, run the same way here and in CI.
check: $(VENV)/.dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# What the tests need. The virtual environments and node_modules are independent of one another,
# so the test targets install them side by side (make -j4 on these targets). The unit tests read
# the CDK CLI's copy of CloudFormation's resource specification and cross-check with NCA.
TEST_TOOLS := node_modules/.installed $(CHECKOV_VENV)/.installed $(NCA_VENV)/.installed
test-deps: $(VENV)/.serve $(TEST_TOOLS) redis-server
	@:
# Redis, the GCS's external store in the fault-tolerant live tests and make local HA=1, is a
# program, not a Python package the index serves: Debian's, installed here when it is missing and
# this user can (root with apt-get); otherwise one line says what to run.
redis-server:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server; \
	  else \
	    echo "the fault-tolerant local server needs redis-server: run sudo apt-get install redis-server (Debian, Ubuntu), then make again"; \
	    exit 2; \
	  fi; }
unit-deps: $(VENV)/.dev node_modules/.installed $(NCA_VENV)/.installed
	@:
consumer-deps: $(VENV)/.dev $(TEST_TOOLS)
	@:

test:
	@$(MAKE) --no-print-directory -j4 test-deps
	$(PY) -m cli.charts --cache $(CHART_CACHE)
	$(PY) -m pytest -m "not live" $(PARALLEL) $(PYTEST_ARGS) || test $$? -eq $(NO_TESTS_COLLECTED)
	$(PY) -m pytest -m live $(PYTEST_ARGS) || test $$? -eq $(NO_TESTS_COLLECTED)

# The quick loop: everything that runs in pytest's own processes, with neither Ray and vLLM nor a
# live local server nor a consumer's program (the tests marked consumer: see pytest.ini).
test-unit:
	@$(MAKE) --no-print-directory -j4 unit-deps
	$(PY) -m pytest -m "not live and not serving and not consumer" $(PARALLEL) $(PYTEST_ARGS)

# The tests that run the real consumers (the CDK CLI's synth and diff, checkov, cfn-guard, Helm,
# Kubernetes' schemas) on what the stack synthesizes: the day-two rehearsals among them.
test-consumers:
	@$(MAKE) --no-print-directory -j4 consumer-deps
	$(PY) -m cli.charts --cache $(CHART_CACHE)
	$(PY) -m pytest -m "consumer and not live and not serving" $(PARALLEL) $(PYTEST_ARGS)

# ASSET=1: serve_app comes from $(CONFIG)'s synthesized code asset through a loopback S3, as on the cluster.
# HA=1: a head with no resources and GCS fault tolerance on a loopback Redis, a worker node per phase.
local: $(VENV)/.serve node_modules/.installed $(if $(HA),redis-server)
	$(PY) -m local.server --mode $(MODE) $(if $(ASSET),--code-from-asset $(CONFIG)) $(if $(HA),--gcs-fault-tolerance) \
	  $(if $(API_KEY),--api-key-env API_KEY) $(LOCAL_ARGS)

bench: $(VENV)/.serve
	@test -n "$(URL)" || { echo "make bench needs URL=<OpenAI base URL>, e.g. URL=http://127.0.0.1:8000/v1"; exit 2; }
	$(PY) -m bench.run --url $(URL) --workload $(WORKLOAD) --model $(MODEL) --tokenizer $(TOKENIZER) \
	  $(if $(METRICS_URL),--metrics-url $(METRICS_URL))

bench-compare: $(VENV)/.serve
	@test -n "$(LOCAL)$(PD_URL)" || { echo "make bench-compare needs PD_URL=… COLOCATED_URL=…, or LOCAL=1"; exit 2; }
	$(PY) -m bench.compare $(if $(LOCAL),--local,--pd-url $(PD_URL) --colocated-url $(COLOCATED_URL)) \
	  --workload $(WORKLOAD) --model $(MODEL) --tokenizer $(TOKENIZER) \
	  $(if $(PD_METRICS_URL),--pd-metrics-url $(PD_METRICS_URL)) \
	  $(if $(COLOCATED_METRICS_URL),--colocated-metrics-url $(COLOCATED_METRICS_URL))

# The charts the stack installs, from their repositories, into CHART_CACHE (the tests render them
# with Helm; make test fetches only the project's own pins, and only those missing).
charts: $(VENV)/.runtime
	$(PY) -m cli.charts --cache $(CHART_CACHE) --with-cdk-chosen

upgrade-crds: $(VENV)/.runtime
	$(PY) -m cli.kuberay_crds $(CONFIG)

# A Job on the cluster copies the model into the mirror bucket; it prints the source: line to use.
mirror-model: $(VENV)/.runtime
	$(PY) -m cli.mirror_model $(CONFIG) $(MIRROR_ARGS)

verify: $(VENV)/.dev
	$(PY) -m verify --config $(CONFIG) $(VERIFY_ARGS)

clean:
	rm -rf $(OUTDIR) .pytest_cache
