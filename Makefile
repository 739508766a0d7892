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

# jsii runs on Node 20 here; its end-of-life banner would bury the output.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true

.PHONY: synth deploy destroy test plan clean help

help:
	@echo "make synth   [ENV=dev|prod|CONFIG=path.yaml]  offline synth and a summary"
	@echo "make deploy  [ENV=…|CONFIG=…]                 cdk deploy"
	@echo "make destroy [ENV=…|CONFIG=…]                 cdk destroy"
	@echo "make plan    [ENV=…|CONFIG=…]                 memory fit, KV transfer cost, price"
	@echo "make test                                     install everything and run every test"

$(VENV)/.runtime: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: $(VENV)/.runtime node_modules/.installed
	$(CDK) synth $(CDK_FLAGS) --output $(OUTDIR) --quiet
	$(PY) -m cli.summary $(CONFIG) $(OUTDIR)

deploy: $(VENV)/.runtime node_modules/.installed
	$(PY) -m cli.deploy_guard $(CONFIG)
	$(CDK) deploy $(CDK_FLAGS) --output $(OUTDIR) --require-approval broadening

destroy: $(VENV)/.runtime node_modules/.installed
	$(CDK) destroy $(CDK_FLAGS) --output $(OUTDIR) --force

plan: $(VENV)/.runtime
	$(PY) -m cli.plan $(CONFIG)

test: $(VENV)/.dev node_modules/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(OUTDIR) .pytest_cache
