# Two commands from a fresh clone: `make demo` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch from PyPI by default: on Linux x86_64 that is the CUDA build (several GB) unless a CPU wheel is at
# hand, as on this project's machines; tools/torch_choice.py says which before pip downloads anything.
# A CPU-only laptop: make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
# GPU machines: make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128
TORCH_SPEC ?= $(shell grep '^torch==' constraints.txt)
TORCH_INDEX ?=
PYTEST_ARGS ?=

.PHONY: setup test test-fast rehearse demo bench lint browser docs-images data clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) tools/torch_choice.py "$(TORCH_SPEC)" $(TORCH_INDEX)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $@

test: setup
	$(PY) -m pytest -m "not rehearse" $(PYTEST_ARGS)

# Everything but the tests marked slow (those that train, sweep or start servers): for iterating.
test-fast: setup
	$(PY) -m pytest -m "not slow and not rehearse" $(PYTEST_ARGS)

# The rehearsals of whole paths, each starting what it needs: the team's day from the guides' own text
# (root: network namespaces; PostgreSQL's server; util-linux's script).
rehearse: setup
	$(PY) -m pytest -m rehearse $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/nmt demo

# Multi30k into data/multi30k/ (from the public multi30k/dataset repository, checksums verified), for
# machines without ../shared/data/multi30k. Tests skip what needs it when it is nowhere (fail under CI=true).
data:
	$(PYTHON) tools/get_multi30k.py

# The peer benchmark needs Hugging Face transformers: the bench extra, installed here only.
bench: setup
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	$(PY) benchmarks/run_all.py

lint: setup
	$(VENV)/bin/ruff check model pipeline tests benchmarks tools

# Headless Chromium + chromedriver for tests/test_mlflow_ui.py (Debian/Ubuntu; needs root or sudo).
# Deliberately NOT a prerequisite of setup or test, so `make setup` works without root: outside CI
# that test skips when the browser is missing (with CI=true it fails). .ci/run does the same install.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then \
		echo "chromium and chromedriver already installed"; \
	else \
		SUDO=; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
		$$SUDO apt-get update && \
		$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver; \
	fi

# The README's MLflow screenshots (docs/images/): a quick demo (or the one in WORKDIR, e.g. after
# `nmt demo --workdir DIR`), served by `mlflow ui`, photographed in headless Chromium.
docs-images: setup browser
	$(PY) tools/docs_images.py $(if $(WORKDIR),--workdir $(WORKDIR))

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
