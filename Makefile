# Two commands do all the set-up: `make demo` (the main job on a built-in target, offline policy, no API key)
# and `make test` (the test suite). Both create .venv on first use; `make test` adds the test extras to it.
VENV ?= .venv
PY := $(VENV)/bin/python
# A machine whose python3 already has torch (a GPU box) lends it to the venv; elsewhere the CPU wheel is installed.
HAS_TORCH := $(shell python3 -c "import torch" 2>/dev/null && echo yes)
# Debian packages are installed only as root on a machine with apt-get; elsewhere kloop says what is missing.
APT := $(shell [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && echo yes)

.PHONY: demo test setup setup-test

setup: $(VENV)/.installed

# kloop and what it runs with: torch, Triton, CuPy, LangGraph, the model SDKs, matplotlib, ... (about 2.4 GB with CPU torch)
$(VENV)/.installed: pyproject.toml
	@# bubblewrap jails every process that runs candidate code (sandbox/jail.py); without it kloop falls back to
	@# weaker isolation and says so.
	@command -v bwrap >/dev/null || { [ -n "$(APT)" ] && echo "setup: installing bubblewrap with apt-get (it jails the candidate code kloop runs)" && \
		(apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && \
		apt-get install -y -q bubblewrap >/dev/null 2>&1)); } || echo "note: bubblewrap not installed: weaker isolation"
	@echo "setup: a virtual environment in $(VENV) with kloop and its dependencies ($(if $(HAS_TORCH),torch borrowed from python3,the CPU wheel of torch)); a few minutes"
	python3 -m venv $(if $(HAS_TORCH),--system-site-packages) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(HAS_TORCH),,$(PY) -m pip install -q torch==2.13.0)
	$(PY) -m pip install -q -e .
	touch $@

# The test extras on top: pytest, datasets, trl and transformers (exports loaded by the trainers), ray, playwright
# (several GB), and Debian's chromium for the run viewer's browser test (skipped where there is none).
$(VENV)/.installed-test: $(VENV)/.installed
	@echo "setup-test: the test extras (pytest, datasets, trl, transformers, ray, playwright; several GB) into $(VENV)"
	$(PY) -m pip install -q -e ".[test,data-test]"
	@command -v chromium >/dev/null || { [ -n "$(APT)" ] && echo "setup-test: installing chromium with apt-get (the run viewer's browser test)" && \
		(apt-get install -y -q chromium >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && \
		apt-get install -y -q chromium >/dev/null 2>&1)); } || echo "note: no chromium: the browser test is skipped"
	touch $@

setup-test: $(VENV)/.installed-test

demo: setup
	$(VENV)/bin/kloop optimize vector_add --policy offline

test: setup-test
	$(PY) -m pytest -q
