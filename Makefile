# The two commands of the README, plus lint. Each installs first (once; again when the install inputs change).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (auto: one per core); the GPU tests run in one process, on the one GPU.
PYTEST_WORKERS ?= auto

.PHONY: install nightly test test-gpu lint
install: $(STAMP)

$(STAMP): pyproject.toml scripts/install.sh
	VENV=$(VENV) scripts/install.sh
	touch $(STAMP)

nightly: $(STAMP)
	$(PY) -m mamba2_guard nightly

# pytest exits 5 when it collects no test: say so plainly rather than fail with make's generic error.
test: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS) || { rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests were collected"; else exit $$rc; fi; }

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
