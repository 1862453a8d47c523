# gnnscale developer entry points. Everything lives in .venv; no network access at run time.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.gnnscale-installed
# CPU build of torch available on the project's machines; a bare `torch` requirement would pull a CUDA build.
TORCH_VERSION ?= 2.13.0

.PHONY: setup demo test fuzz lint docs bench gpu-check clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	@$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q torch==$(TORCH_VERSION)
	$(VPY) -m pip install -q -e ".[dev]"
	@touch $(STAMP)

demo: setup
	$(VENV)/bin/gnnscale train --dataset csbm --model gcn --epochs 100

test: setup
	$(VPY) -m pytest -q

# Every reader (npz, Planetoid, edge lists, OGB, converted directories, models, checkpoints) against FUZZ_EXAMPLES
# mutated files each, in a worker process so that a segfault fails its case; `make test` runs a few in-process.
FUZZ_EXAMPLES ?= 300
fuzz: setup
	GNNSCALE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) GNNSCALE_FUZZ_ISOLATED=1 $(VPY) -m pytest -q -p no:cacheprovider \
		--timeout=0 tests/test_reader_fuzz.py

lint: setup
	$(VENV)/bin/ruff check gnnscale tests benchmarks
	$(VENV)/bin/mypy gnnscale
	$(VPY) -m pytest -q -p no:cacheprovider tests/test_architecture.py

# The API reference and the guides of docs/ as HTML in build/docs/ (open build/docs/index.html). -W: a warning
# (a docstring autodoc cannot parse, a broken cross-reference between pages) fails the build; -E: read every page anew.
docs: setup
	$(VPY) -m sphinx -W --keep-going -E -q -b html docs build/docs

bench: setup
	$(VPY) -m benchmarks inmemory_vs_pyg

# On a lent GPU machine (no .venv there: system python3), 8 minutes at most: make gpu-check OUT=/path [DRY=1]
# (DRY=1: the same steps on the CPU, tiny sizes, as tests/test_gpu_check.py runs them)
OUT ?= /tmp/gnnscale-gpu-check
gpu-check:
	bash benchmarks/gpu_check.sh $(OUT) $(if $(DRY),--dry-run)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .mypy_cache build/docs
