# Developer entry points. `make gpu OUT=dir` is the whole GPU loop (install, build, tests, bench).
PY ?= python3
OUT ?= gpu-out

.PHONY: install test lint format format-cuda bench bench-glu gpu sass build sanitize

install:
	$(PY) -m pip install -c constraints.txt -e ".[dev]"

test:
	$(PY) -m pytest -q

lint:
	ruff check dualk triton_src tests bench experiments
	ruff format --check dualk triton_src tests bench experiments
	lint-imports
	.ci/check_cuda_format

format:
	ruff format dualk triton_src tests bench experiments

format-cuda:
	clang-format -i cuda_src/*.cu cuda_src/*.cuh cuda_src/*.h cuda_src/*.cpp

build:
	$(PY) -m dualk build

bench:
	$(PY) -m dualk bench --suite default --all-backends --compile --json bench.json

# issue 35's run: linear_glu on LLaMA's feed-forward shapes against eager and torch.compile
# (forward and backward, the goals marked met / NOT met; ~4 min on an H100).
bench-glu:
	mkdir -p $(OUT) && $(PY) bench/linear_glu_llama.py --json $(OUT)/linear_glu_llama.json

gpu:
	bash bench/gpu_check.sh $(OUT) all default --compile

# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over the CUDA backend's GPU tests;
# logs and summary.txt in OUT (bench/sanitize.sh).
sanitize:
	bash bench/sanitize.sh $(OUT)

# SASS of every kernel file for sm_90a (look for HMMA / LDG.E.128 / LDL spills).
sass:
	@mkdir -p build/sass
	@for f in cuda_src/*.cu; do \
	  nvcc -cubin -std=c++17 -O3 -Icuda_src -gencode=arch=compute_90a,code=sm_90a -o build/sass/$$(basename $$f .cu).cubin $$f && \
	  cuobjdump --dump-sass build/sass/$$(basename $$f .cu).cubin > build/sass/$$(basename $$f .cu).sass || exit 1; \
	done; ls -l build/sass
