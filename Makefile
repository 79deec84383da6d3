# One command each, on a fresh machine:
#   make demo   installs everything, builds the kernel suite for cuda:90 and hip:gfx942 (no GPU needed)
#               and shows every kernel's levels and resources
#   make test   installs everything and runs the test suite (what CI runs, through .ci/run)
#   make test-fast  the same without the tests marked slow
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out

.PHONY: setup demo test test-fast lint gpu-check clean

setup: $(VENV)/.kstrata-installed

$(VENV)/.kstrata-installed: pyproject.toml tools/setup.sh
	tools/setup.sh $(VENV)

demo: setup
	$(BIN)/kstrata doctor
	$(BIN)/kstrata suite build --target cuda:90 --target hip:gfx942 --cache-dir $(OUT)/suite-cache

test: setup
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=10

# everything but the tests marked slow (more than a few seconds each)
test-fast: setup
	$(BIN)/python -m pytest -n 2 -m "not slow" --durations=10

lint: setup
	$(BIN)/ruff check .
	# mypy needs the package by its name: a link `kstrata` -> the repository root
	mkdir -p build/mypy && ln -sfn ../.. build/mypy/kstrata
	cd build/mypy && $(abspath $(BIN))/mypy --config-file ../../pyproject.toml -p kstrata.ir -p kstrata.backends -p kstrata.tools -p kstrata.agents -p kstrata.passes \
	  -m kstrata.testsuite.kernels.spec -m kstrata.testsuite.kernels.run -m kstrata.testsuite.kernels.build \
	  -m kstrata.testsuite.kernels.launch -p kstrata.testsuite.planted

# On a machine with an NVIDIA GPU: every suite kernel against its reference, then the GPU tests, the
# planted bugs and the pass benchmark (tools/gpu_check.sh); dated results under $(OUT)/gpu-results.
gpu-check: setup
	$(BIN)/python -m kstrata.testsuite.kernels.run --device cuda --results $(OUT)/gpu-results
	PYTHON=$(BIN)/python tools/gpu_check.sh $(OUT)/gpu-results

clean:
	rm -rf $(OUT) build *.egg-info
