# CUDA backend (Hopper, sm_90a): test binary and device-run helpers. Included by the Makefile.
#   make cuda        the CUDA objects (defined in the Makefile; compiles on a GPU-less machine)
#   make cuda-tests  build/cuda/test_cuda_ops: every CUDA op against the CPU op (tests/cuda/);
#                    build/cuda/test_cuda_cache: the cache row codecs and a device cache against the host's;
#                    build/cuda/test_cuda_sample: the GPU sampler against the CPU sampler, bit for bit;
#                    build/cuda/test_cuda_engine: the engine on the GPU (batch invariance, seeded sampling
#                    against the CPU backend, GPU sampling path against the host path);
#                    build/cuda/test_cuda_index_seqs: the batched index selection against the per-sequence
#                    ops (DI_BENCH=1: their times; DI_TEST_ON_CPU=1: the harness on the CPU, no GPU); every
#                    tests/cuda/test_*.c is one binary (wildcard below)
#   make deepinfer-cuda  the CLI with the CUDA backend linked in (`--device cuda`), static like below
# Run on an H200 with scripts/gpu_tests.sh.

# Exactness first (src/backend/cuda/cuda_common.cuh): the CPU reference is built without FP
# contraction, so the kernels must not fuse a multiply and an add the CPU rounds separately. The
# kernels already spell those with __fmul_rn/__fadd_rn; -fmad=false guards the rest.
NVFLAGS += -fmad=false

CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(shell command -v $(NVCC) 2>/dev/null))
CUDA_INC   := $(if $(CUDA_HOME),-I$(CUDA_HOME)/include)
CUDA_TEST_SRC := $(sort $(wildcard tests/cuda/test_*.c))
CUDA_TEST_BIN := $(CUDA_TEST_SRC:tests/cuda/%.c=$(BUILD)/cuda/%)
# The device machine lacks jansson / PCRE2 / utf8proc: link them (and the CUDA runtime) statically.
CUDA_TEST_LIBS := -L$(CUDA_HOME)/lib64 -lcudart_static -Wl,-Bstatic -ljansson -lpcre2-8 -lutf8proc -Wl,-Bdynamic \
                  -lstdc++ -lm -lpthread -ldl -lrt

.PHONY: cuda-tests
cuda-tests: $(CUDA_TEST_BIN)

$(BUILD)/cuda/tests/cuda/%.o: tests/cuda/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(CUDA_INC) -MMD -MP -c $< -o $@

$(BUILD)/cuda/test_%: $(BUILD)/cuda/tests/cuda/test_%.o $(CUDA_OBJ) $(BUILD)/libdeepinfer.a
	$(CC) $(CFLAGS) -o $@ $< $(CUDA_OBJ) $(BUILD)/libdeepinfer.a $(CUDA_TEST_LIBS)

-include $(wildcard $(BUILD)/cuda/tests/cuda/*.d)

# The Makefile's .cu rule records no header dependencies: rebuild every CUDA object when a CUDA header
# changes.
$(CUDA_OBJ): $(wildcard src/backend/cuda/*.cuh src/backend/cuda/*.h) src/backend/backend.h src/io/formats.h

# ---- deepinfer-static (PyTorch-peer benchmark, scripts/bench_gpu.sh) ----
# The device machine has no jansson / PCRE2 / utf8proc: a deepinfer CLI with them linked statically,
# carried there to run `mkmodel --preset full-layer` (and later `bench gpu`) next to bench/torch_layer.py.
.PHONY: deepinfer-static
deepinfer-static: $(BUILD)/deepinfer-static

$(BUILD)/deepinfer-static: $(TOOL_OBJ) $(BUILD)/libdeepinfer.a
	$(CC) $(CFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libdeepinfer.a \
	    -Wl,-Bstatic -ljansson -lpcre2-8 -lutf8proc -Wl,-Bdynamic -lm -pthread

# ---- deepinfer-cuda: the CLI with the CUDA backend (generate / verify --device cuda) ----
# backend_select.c resolves di_backend_cuda_create through a weak reference: the CUDA objects linked
# here define it; the plain `deepinfer` (no CUDA objects) answers --device cuda with "built without CUDA".
.PHONY: deepinfer-cuda
deepinfer-cuda: $(BUILD)/deepinfer-cuda

$(BUILD)/deepinfer-cuda: $(TOOL_OBJ) $(CUDA_OBJ) $(BUILD)/libdeepinfer.a
	$(CC) $(CFLAGS) -o $@ $(TOOL_OBJ) $(CUDA_OBJ) $(BUILD)/libdeepinfer.a $(CUDA_TEST_LIBS)

# ---- host emulation of the CUDA sampler (no GPU needed) ----
# The kernel's own source compiled for the host, one thread per block (DI_CUDA_SAMPLE_EMULATE), checked
# against the CPU sampler bit for bit by tests/cuda/test_cuda_sample.c; CI runs it (tests/all.sh).
.PHONY: cuda-sample-emu
cuda-sample-emu: $(BUILD)/emu/test_cuda_sample_emu
$(BUILD)/emu/cuda_sample_emu.o: src/backend/cuda/cuda_sample.cu src/backend/cuda/cuda_sample.h src/engine/sampler.h
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -g -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -D_GNU_SOURCE \
	    -DDI_CUDA_SAMPLE_EMULATE -x c++ -Iinclude -Isrc $(CUDA_INC) -c $< -o $@
$(BUILD)/emu/test_cuda_sample_emu: tests/cuda/test_cuda_sample.c $(BUILD)/emu/cuda_sample_emu.o $(BUILD)/libdeepinfer.a
	$(CC) $(CFLAGS) $(CUDA_INC) -DDI_SAMPLE_EMU -o $@ $< $(BUILD)/emu/cuda_sample_emu.o $(BUILD)/libdeepinfer.a $(LDLIBS) -lstdc++

# ---- host emulation of the heap path's pipelined replacements (no GPU needed) ----
# cuda_heap_pipe.cuh (the GPU's source) on one warp of fibers against its serial steps; CI runs it.
.PHONY: cuda-heap-emu
cuda-heap-emu: $(BUILD)/emu/test_cuda_heap_pipe_emu
$(BUILD)/emu/test_cuda_heap_pipe_emu: tests/emu/test_cuda_heap_pipe_emu.cc src/backend/cuda/cuda_heap_pipe.cuh src/backend/cuda/cuda_gemm_bf16_emu.h src/backend/cuda/cuda_bf16_bits.cuh $(BUILD)/libdeepinfer.a
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -g -ffp-contract=off -fno-strict-aliasing -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas \
	    -D_GNU_SOURCE -Iinclude -Isrc -o $@ $< $(BUILD)/libdeepinfer.a $(LDLIBS)

# ---- host emulation of the exact bf16 GEMMs (no GPU needed) ----
# cuda_gemm_bf16.cu's own source (kernels and launch logic) compiled for the host, the block's threads as
# fibers (cuda_gemm_bf16_emu.h), checked against the CPU op bit for bit; CI runs it (tests/all.sh).
.PHONY: cuda-bf16-emu
cuda-bf16-emu: $(BUILD)/emu/test_cuda_gemm_bf16_emu
$(BUILD)/emu/cuda_gemm_bf16_emu.o: src/backend/cuda/cuda_gemm_bf16.cu src/backend/cuda/cuda_gemm_bf16.h src/backend/cuda/cuda_gemm_bf16_emu.h \
                                   src/backend/cuda/cuda_bf16_bits.cuh
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -g -ffp-contract=off -fno-strict-aliasing -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas \
	    -D_GNU_SOURCE -DDI_CUDA_BF16_EMULATE -x c++ -Iinclude -Isrc -c $< -o $@
$(BUILD)/emu/test_cuda_gemm_bf16_emu: tests/emu/test_cuda_gemm_bf16_emu.c $(BUILD)/emu/cuda_gemm_bf16_emu.o $(BUILD)/libdeepinfer.a
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/emu/cuda_gemm_bf16_emu.o $(BUILD)/libdeepinfer.a $(LDLIBS) -lstdc++
