# Two commands do all the set-up: `make demo` (the main job on a built-in target, offline policy, no API key)
# and `make test` (the test suite). Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# A machine whose python3 already has torch (a GPU box) lends it to the venv; elsewhere the CPU wheel is installed.
HAS_TORCH := $(shell python3 -c "import torch" 2>/dev/null && echo yes)

.PHONY: demo test setup

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@# bubblewrap jails every process that runs candidate code (sandbox/jail.py); without it kloop falls back to
	@# weaker isolation and says so. Installed here when this is a Debian-like machine and we may.
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && \
		apt-get install -y -q bubblewrap >/dev/null 2>&1)); } || echo "note: bubblewrap not installed: weaker isolation"
	python3 -m venv $(if $(HAS_TORCH),--system-site-packages) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(HAS_TORCH),,$(PY) -m pip install -q torch==2.13.0)
	$(PY) -m pip install -q -e ".[test,data-test]"
	touch $@

demo: setup
	$(VENV)/bin/kloop optimize vector_add --policy offline

test: setup
	$(PY) -m pytest -q
