# `make demo` and `make test` each work as the only command on a fresh machine.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[test,serve]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/vjx generate --prompt "What is the capital of France? Answer in one sentence." --max-tokens 48 --chat

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q tests

clean:
	rm -rf $(VENV)
