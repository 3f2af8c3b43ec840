# make train    builds ./train (the CUDA backend too when nvcc is installed)
# make test     builds everything, generates the PyTorch reference, runs every test
# make bench    CPU benchmarks: ./train against PyTorch, and the cost of telemetry
# make fuzz     builds the libFuzzer harnesses of test/fuzz and runs each for FUZZ_RUNS inputs
# make sanitize builds the CPU tests and a CPU-only ./train with ASan + UBSan into build/sanitize
#               and runs them, a short training run with a checkpoint and a resume included
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
            -Xcompiler "-O3 -march=$(CPU_ARCH) -fopenmp -Wall -Wno-parentheses" $(CUDNN_CFLAGS)
NVLDLIBS = -L$(OPENBLAS_DIR) -Xlinker -rpath,$(OPENBLAS_DIR) -lopenblas -lsentencepiece -lsentencepiece_train -lpthread \
           -lcublas -lcublasLt -lgomp

# MPI (data-parallel training over processes, llmc/distributed.h), NCCL's header (its GPU
# collectives, llmc/nccl.cuh) and cuDNN's (its fused attention, llmc/cudnn_attention.cuh), each used
# when found; the libraries are opened at run time, when needed. Expanded when used, so after the
# build packages are installed. NCCL's and cuDNN's headers where the CUDA toolkit, the system or an
# active conda environment has them, or else in PyTorch's CUDA wheels (nvidia/<package>/include
# on the sys.path of the python3 on PATH), whose libraries ./train then opens from beside them
# (llmc/dynamic_library.h).
MPI_INC = $(shell mpicxx --showme:incdirs 2>/dev/null)
MPI_CFLAGS = $(if $(MPI_INC),-DUSE_MPI $(addprefix -I,$(MPI_INC)))
MPI_LDLIBS = $(if $(MPI_INC),$(addprefix -L,$(shell mpicxx --showme:libdirs)) -lmpi)
wheel_include = $(if $(NVCC),$(shell python3 -c 'import os, sys; \
    print(next((i for i in (os.path.join(os.path.abspath(d), "nvidia", sys.argv[1], "include") for d in filter(None, sys.path)) \
                if os.path.isfile(os.path.join(i, sys.argv[2]))), ""))' $(1) $(2) 2>/dev/null))
NCCL_SYSTEM_INC = $(firstword $(dir $(wildcard $(dir $(NVCC))../include/nccl.h /usr/include/nccl.h \
                                               $(if $(CONDA_PREFIX),$(CONDA_PREFIX)/include/nccl.h))))
NCCL_INC = $(or $(NCCL_SYSTEM_INC),$(call wheel_include,nccl,nccl.h))
NCCL_CFLAGS = $(if $(NCCL_INC),-DUSE_NCCL -I$(NCCL_INC))
CUDNN_SYSTEM_INC = $(firstword $(dir $(wildcard $(dir $(NVCC))../include/cudnn_graph.h /usr/include/cudnn_graph.h \
                                                /usr/include/$(MULTIARCH)/cudnn_graph.h \
                                                $(if $(CONDA_PREFIX),$(CONDA_PREFIX)/include/cudnn_graph.h))))
CUDNN_INC = $(or $(CUDNN_SYSTEM_INC),$(call wheel_include,cudnn,cudnn_graph.h))
CUDNN_CFLAGS = $(if $(CUDNN_INC),-DUSE_CUDNN -I$(CUDNN_INC))

HEADERS = $(wildcard llmc/*.h llmc/*.cuh)
DEPS_STAMP = build/.deps-build
TEST_DEPS_STAMP = build/.deps-test

.PHONY: test bench clean fuzz sanitize
.DEFAULT_GOAL := train

$(DEPS_STAMP): dev/install_deps.sh
	@dev/install_deps.sh build
	@mkdir -p build && touch $@

$(TEST_DEPS_STAMP): dev/install_deps.sh
	@dev/install_deps.sh test
	@mkdir -p build && touch $@

ifneq ($(NVCC),)
train: train_gpt.cu $(HEADERS) | $(DEPS_STAMP)
	$(NVCC) $(NVCCFLAGS) $(MPI_CFLAGS) $(NCCL_CFLAGS) $< -o $@ $(NVLDLIBS) $(MPI_LDLIBS) -ldl
else
train: train_gpt.cu $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $(MPI_CFLAGS) -x c++ $< -o $@ $(LDLIBS) $(MPI_LDLIBS)
endif

build/test_gpt_cpu: test/test_gpt_cpu.cpp test/adamw_check.h test/tensorfile.h test/testing.h $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

build/test_data: test/test_data.cpp test/testing.h $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

build/test_runlog: test/test_runlog.cpp test/testing.h $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

build/test_cpu_units: test/test_cpu_units.cpp test/testing.h $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

build/hf_logits: test/hf_logits.cpp $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

prepare_data: dev/data/prepare_data.cpp $(HEADERS) | $(DEPS_STAMP)
	$(CXX) $(CXXFLAGS) $< -o $@ $(LDLIBS)

# and model.ckpt, trained.ckpt, plain.ckpt, none.ckpt, qwen3.ckpt, llama3.ckpt,
# debug_{trained,plain,none,freeze,qwen3,llama3}.bin
build/ref/debug_state.bin: test/reference.py scripts/attnlog/model_torch.py scripts/attnlog/layout.py | $(TEST_DEPS_STAMP)
	@mkdir -p build/ref
	PYTHONPATH=scripts $(PYTHON) test/reference.py --out build/ref

TEST_BINS = build/test_gpt_cpu build/test_data build/test_runlog build/test_cpu_units build/hf_logits prepare_data train

# The reference test/test_bpe.py compares attnlog.bpe with: Hugging Face's tokenizers library, as
# its Node.js build from npm (Debian has no Python build of it). When npm cannot fetch it, the
# comparison is skipped, and says so.
TOKENIZERS_NPM = tokenizers@0.23.2
build/npm/node_modules/tokenizers/package.json: | $(DEPS_STAMP)
	@mkdir -p build/npm
	@npm install --prefix build/npm --no-audit --no-fund --no-save $(TOKENIZERS_NPM) >build/npm/install.log 2>&1 \
	    || echo "note: npm could not install $(TOKENIZERS_NPM) (build/npm/install.log): the comparison with it is skipped"

# The CUDA tests and kernel checks: built (so CI compiles them) whenever nvcc exists; they run
# only where there is a GPU.
ifneq ($(NVCC),)
DEV_CUDA = $(patsubst dev/cuda/%.cu,build/dev_%,$(wildcard dev/cuda/*.cu))
TEST_BINS += build/test_gpt_cuda $(DEV_CUDA)

build/test_gpt_cuda: test/test_gpt_cuda.cu train_gpt.cu test/adamw_check.h test/tensorfile.h test/testing.h $(HEADERS) | $(DEPS_STAMP)
	$(NVCC) $(NVCCFLAGS) $< -o $@ $(NVLDLIBS)

build/dev_%: dev/cuda/%.cu dev/cuda/common.h $(HEADERS) | $(DEPS_STAMP)
	$(NVCC) $(NVCCFLAGS) $< -o $@ $(NVLDLIBS)

# ./train and its CUDA test with the candidate kernels in place of the defaults (kCandidateKernels,
# llmc/cuda_common.cuh): what a GPU machine checks and times before a candidate becomes the default.
build/train_candidates: train_gpt.cu $(HEADERS) | $(DEPS_STAMP)
	$(NVCC) $(NVCCFLAGS) -DLLMC_CANDIDATE_KERNELS $(MPI_CFLAGS) $(NCCL_CFLAGS) $< -o $@ $(NVLDLIBS) $(MPI_LDLIBS) -ldl

build/test_gpt_cuda_candidates: test/test_gpt_cuda.cu train_gpt.cu test/adamw_check.h test/tensorfile.h test/testing.h $(HEADERS) | $(DEPS_STAMP)
	$(NVCC) $(NVCCFLAGS) -DLLMC_CANDIDATE_KERNELS $< -o $@ $(NVLDLIBS)
endif

# Fuzzing: harnesses of the checkpoint, shard, run log and safetensors parsers, built with clang's libFuzzer,
# ASan and UBSan, and with -DFAIL_THROWS: a rejected input is a normal return (test/fuzz/fuzz.h).
# Each starts from seeds that make_seeds writes with the project's own writers.
FUZZ_CXX ?= clang++
FUZZ_FLAGS = -std=c++17 -g -O1 -fno-omit-frame-pointer -DFAIL_THROWS -I. -Itest/fuzz
FUZZ_HARNESSES = $(patsubst test/fuzz/%.cpp,build/fuzz/%,$(wildcard test/fuzz/fuzz_*.cpp))
FUZZ_RUNS ?= 1000000
# Inputs up to 64 KB; an allocation above 64 MB (1000 times the largest input) is a finding.
FUZZ_OPTIONS = -max_len=65536 -malloc_limit_mb=64 -timeout=10 -print_final_stats=1
CPU_HEADERS = $(wildcard llmc/*.h)

build/fuzz/fuzz_%: test/fuzz/fuzz_%.cpp test/fuzz/fuzz.h $(CPU_HEADERS) | $(TEST_DEPS_STAMP)
	@mkdir -p build/fuzz
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $< -o $@

build/fuzz/make_seeds: test/fuzz/make_seeds.cpp test/fuzz/fuzz.h $(CPU_HEADERS) | $(TEST_DEPS_STAMP)
	@mkdir -p build/fuzz
	$(FUZZ_CXX) $(FUZZ_FLAGS) $< -o $@

build/fuzz/seeds/.made: build/fuzz/make_seeds
	rm -rf build/fuzz/seeds
	build/fuzz/make_seeds build/fuzz/seeds && touch $@

# New inputs that reach new code go into build/fuzz/corpus/NAME; a finding into build/fuzz/NAME-crash-*.
fuzz: $(FUZZ_HARNESSES) build/fuzz/seeds/.made
	@for h in $(patsubst build/fuzz/fuzz_%,%,$(FUZZ_HARNESSES)); do \
	    mkdir -p build/fuzz/corpus/$$h; echo "== fuzz_$$h: $(FUZZ_RUNS) runs"; start=$$(date +%s); \
	    build/fuzz/fuzz_$$h -runs=$(FUZZ_RUNS) $(FUZZ_OPTIONS) -artifact_prefix=build/fuzz/$$h- \
	        build/fuzz/corpus/$$h build/fuzz/seeds/$$h 2>build/fuzz/$$h.log || { tail -n 60 build/fuzz/$$h.log; exit 1; }; \
	    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' build/fuzz/$$h.log; \
	    echo "   $$(( $$(date +%s) - start )) s, no finding (log: build/fuzz/$$h.log)"; \
	done

# The sanitizers' build: the CPU tests and a CPU-only ./train with ASan and UBSan, every error
# fatal (test/run_tests.py sets the options and the suppressions of test/sanitize/lsan.supp).
SANITIZE_FLAGS = -std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
                 -fopenmp -Wall -Wextra -I. -I$(OPENBLAS_INC)
SANITIZE_BINS = build/sanitize/test_cpu_units build/sanitize/test_data build/sanitize/test_runlog \
                build/sanitize/test_gpt_cpu build/sanitize/train

build/sanitize/test_%: test/test_%.cpp test/testing.h test/tensorfile.h test/adamw_check.h $(CPU_HEADERS) | $(DEPS_STAMP)
	@mkdir -p build/sanitize
	$(CXX) $(SANITIZE_FLAGS) $< -o $@ $(LDLIBS)

build/sanitize/train: train_gpt.cu $(CPU_HEADERS) | $(DEPS_STAMP)
	@mkdir -p build/sanitize
	$(CXX) $(SANITIZE_FLAGS) -x c++ $< -o $@ $(LDLIBS)

sanitize: $(TEST_DEPS_STAMP) $(SANITIZE_BINS) prepare_data build/ref/debug_state.bin
	@FUZZ_OPTIONS='$(FUZZ_OPTIONS)' $(PYTHON) test/run_tests.py --only sanitize

# Everything, with the fuzzers' smoke runs and the sanitizers' build; first, that no header of
# llmc/ includes one of a higher layer (dev/include_layers.py).
test: $(TEST_DEPS_STAMP) $(TEST_BINS) $(FUZZ_HARNESSES) build/fuzz/seeds/.made $(SANITIZE_BINS) build/ref/debug_state.bin \
      build/npm/node_modules/tokenizers/package.json
	@$(PYTHON) dev/include_layers.py --check
	@FUZZ_OPTIONS='$(FUZZ_OPTIONS)' $(PYTHON) test/run_tests.py

bench: train $(TEST_DEPS_STAMP)
	$(PYTHON) scripts/bench.py cpu
	@if nvidia-smi -L >/dev/null 2>&1; then $(PYTHON) scripts/bench.py gpu; else echo "GPU benchmark: skipped (no GPU)"; fi

clean:
	rm -rf build train prepare_data
