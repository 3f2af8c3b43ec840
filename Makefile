# make train    builds ./train (the CUDA backend too when nvcc is installed)
# make test     builds everything, generates the PyTorch reference, runs every test
# make bench    CPU benchmarks: ./train against PyTorch, and the cost of telemetry
# make clean

# A Python that imports torch: Debian's, whatever `python3` on the PATH is.
# Expanded when used, so after `make test` has installed the test packages.
PYTHON ?= $(or $(shell for p in /usr/bin/python3 python3; do $$p -c 'import torch' >/dev/null 2>&1 && { echo $$p; break; }; done),/usr/bin/python3)
NVCC ?= $(shell command -v nvcc 2>/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; })
CUDA_ARCHS ?= 80 90
CPU_ARCH ?= native

CXX ?= g++
CXXFLAGS = -std=c++17 -O3 -march=$(CPU_ARCH) -fopenmp -Wall -Wextra -I. -I$(OPENBLAS_INC)
# OpenBLAS built on OpenMP: its threads are the OpenMP threads of the rest of the program. The
# pthread build spins its own threads, which fight the OpenMP loops for the cores (3x slower here).
MULTIARCH := $(shell $(CXX) -print-multiarch 2>/dev/null)
OPENBLAS_DIR ?= /usr/lib/$(MULTIARCH)/openblas-openmp
OPENBLAS_INC ?= /usr/include/$(MULTIARCH)/openblas-openmp
LDLIBS = -L$(OPENBLAS_DIR) -Wl,-rpath,$(OPENBLAS_DIR) -lopenblas -lsentencepiece -lsentencepiece_train -lpthread
NVCCFLAGS = -std=c++17 -O3 -I. -I$(OPENBLAS_INC) $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
            -Xcompiler "-O3 -march=$(CPU_ARCH) -fopenmp -Wall -Wno-parentheses"
NVLDLIBS = -L$(OPENBLAS_DIR) -Xlinker -rpath,$(OPENBLAS_DIR) -lopenblas -lsentencepiece -lsentencepiece_train -lpthread \
           -lcublas -lcublasLt -lgomp

HEADERS = $(wildcard llmc/*.h llmc/*.cuh)
DEPS_STAMP = build/.deps-build
TEST_DEPS_STAMP = build/.deps-test

.PHONY: test bench clean
.DEFAULT_GOAL := train

$(DEPS_STAMP): dev/install_deps.sh
	@dev/install_deps.sh build
	@mkdir -p build && touch $@

$(TEST_DEPS_STAMP): dev/install_deps.sh
	@dev/install_deps.sh test
	@mkdir -p build && touch $@

ifneq ($(NVCC),)
train: train_gpt.cu $(HEADERS) | $(DEPS_STAMP)
	$(NVCC) $(NVCCFLAGS) $< -o $@ $(NVLDLIBS)
else
train: train_gpt.cu $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) -x c++ $< -o $@ $(LDLIBS)
endif

build/test_gpt_cpu: test/test_gpt_cpu.cpp test/tensorfile.h test/testing.h $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

build/test_data: test/test_data.cpp test/testing.h $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

build/test_runlog: test/test_runlog.cpp test/testing.h $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

build/test_cpu_units: test/test_cpu_units.cpp test/testing.h $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

prepare_data: dev/data/prepare_data.cpp $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

build/ref/debug_state.bin: test/reference.py | $(TEST_DEPS_STAMP)  # and trained.ckpt, debug_trained.bin
	@mkdir -p build/ref
	$(PYTHON) test/reference.py --out build/ref

TEST_BINS = build/test_gpt_cpu build/test_data build/test_runlog build/test_cpu_units prepare_data train

# The CUDA tests and kernel checks: built (so CI compiles them) whenever nvcc exists; they run
# only where there is a GPU.
ifneq ($(NVCC),)
DEV_CUDA = $(patsubst dev/cuda/%.cu,build/dev_%,$(wildcard dev/cuda/*.cu))
TEST_BINS += build/test_gpt_cuda $(DEV_CUDA)

build/test_gpt_cuda: test/test_gpt_cuda.cu train_gpt.cu test/tensorfile.h test/testing.h $(HEADERS) | $(DEPS_STAMP)
	$(NVCC) $(NVCCFLAGS) $< -o $@ $(NVLDLIBS)

build/dev_%: dev/cuda/%.cu dev/cuda/common.h $(HEADERS) | $(DEPS_STAMP)
	$(NVCC) $(NVCCFLAGS) $< -o $@ $(NVLDLIBS)
endif

test: $(TEST_DEPS_STAMP) $(TEST_BINS) build/ref/debug_state.bin
	@$(PYTHON) test/run_tests.py

bench: train $(TEST_DEPS_STAMP)
	$(PYTHON) scripts/bench.py cpu
	@if nvidia-smi -L >/dev/null 2>&1; then $(PYTHON) scripts/bench.py gpu; else echo "GPU benchmark: skipped (no GPU)"; fi

clean:
	rm -rf build train prepare_data
