# deepinfer build. Targets:
#   make            library (static + shared), the deepinfer CLI and the test binaries
#   make test       install missing dependencies, build, run every test (then ASan/UBSan subset,
#                   fuzz smoke and the CUDA compile check when nvcc is present)
#   make demo       install missing dependencies, build, run the main job on the embedded tiny model
#   make cuda       build the CUDA objects (sm_90a) into build/cuda/
#   make asan-test  run the fast test subset under AddressSanitizer + UBSan
#   make fuzz-smoke build the libFuzzer harnesses with clang and run each briefly
# Sources are picked up by wildcard: a new src/**/*.c, tools/*.c or tests/test_*.c needs no edit here.

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
SAN     ?=
PKGS    := jansson libpcre2-8 libutf8proc
CFLAGS  := -std=c11 $(OPT) -g -ffp-contract=off -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -fPIC -pthread \
           -Iinclude -Isrc $(SAN) $(EXTRA_CFLAGS)
LDLIBS  := -ljansson -lpcre2-8 -lutf8proc -lm -pthread
TESTLIBS:= -lcmocka

LIB_SRC  := $(sort $(shell find src -name '*.c'))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
TOOL_SRC := $(sort $(wildcard tools/*.c))
TOOL_OBJ := $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_SUP := $(filter-out $(TEST_SRC),$(sort $(wildcard tests/*.c)))
TEST_SUP_OBJ := $(TEST_SUP:%.c=$(BUILD)/%.o)
DEPS     := $(LIB_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TEST_SUP_OBJ:.o=.d) $(TEST_BIN:=.d)

.PHONY: all lib cli tests test demo deps cuda asan-build asan-list asan-test fuzz-smoke clean
all: lib cli tests
lib: $(BUILD)/libdeepinfer.a $(BUILD)/libdeepinfer.so
cli: $(BUILD)/deepinfer
tests: $(TEST_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libdeepinfer.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libdeepinfer.so: $(LIB_OBJ)
	$(CC) $(CFLAGS) -shared -o $@ $^ $(LDLIBS)

$(BUILD)/deepinfer: $(TOOL_OBJ) $(BUILD)/libdeepinfer.a
	$(CC) $(CFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libdeepinfer.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(TEST_SUP_OBJ) $(BUILD)/libdeepinfer.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -MMD -MP -MF $@.d -o $@ $< $(TEST_SUP_OBJ) $(BUILD)/libdeepinfer.a $(LDLIBS) $(TESTLIBS)

-include $(DEPS)

deps:
	@sh scripts/install-deps.sh

test: deps
	sh tests/all.sh

demo: deps
	$(MAKE) cli
	sh scripts/demo.sh $(BUILD)/deepinfer

# ---- sanitizers: fast subset = test files carrying the marker "di-test: asan" ----
ASAN_TESTS := $(sort $(basename $(notdir $(shell grep -l 'di-test: asan' tests/test_*.c 2>/dev/null))))
ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
asan-build:
	$(MAKE) BUILD=build-asan OPT=-O1 SAN="$(ASAN_FLAGS)" $(addprefix build-asan/tests/,$(ASAN_TESTS))
asan-list:
	@echo $(ASAN_TESTS)
asan-test: asan-build
	ASAN_OPTIONS=detect_leaks=1 sh tests/run_tests.sh build-asan $(ASAN_TESTS)

# ---- fuzzing: fuzz/fuzz_*.c, one libFuzzer harness each ----
# The library is compiled once with clang + ASan/UBSan + fuzzer instrumentation into
# build-fuzz/libdeepinfer-fuzz.a; each harness only compiles its own file and links it.
FUZZ_SRC  := $(sort $(wildcard fuzz/fuzz_*.c))
FUZZ_BIN  := $(FUZZ_SRC:fuzz/%.c=build-fuzz/%)
FUZZ_SECONDS ?= 15
FUZZ_CFLAGS := -std=c11 -O1 -g -ffp-contract=off -D_GNU_SOURCE -Iinclude -Isrc -fsanitize=fuzzer-no-link,address,undefined
FUZZ_OBJ  := $(LIB_SRC:%.c=build-fuzz/obj/%.o)
build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@
build-fuzz/libdeepinfer-fuzz.a: $(FUZZ_OBJ)
	@rm -f $@
	ar rcs $@ $^
build-fuzz/%: fuzz/%.c build-fuzz/libdeepinfer-fuzz.a
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< build-fuzz/libdeepinfer-fuzz.a $(LDLIBS)
-include $(FUZZ_OBJ:.o=.d)
fuzz-smoke: deps
	$(MAKE) -j$$(nproc) $(FUZZ_BIN)
	sh fuzz/smoke.sh $(FUZZ_SECONDS) $(FUZZ_BIN)

# ---- CUDA (Hopper, sm_90a). Compiles here without a GPU; runs on the device machine. ----
NVCC      ?= nvcc
CUDA_SRC  := $(sort $(shell find src/backend/cuda -name '*.cu' 2>/dev/null))
CUDA_OBJ  := $(CUDA_SRC:%.cu=$(BUILD)/cuda/%.o)
NVFLAGS   := -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -Iinclude -Isrc
$(BUILD)/cuda/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@
cuda: $(CUDA_OBJ)
	@echo "CUDA objects: $(CUDA_OBJ)"

# CUDA test/bench binaries and device scripts live in cuda.mk (owned by the CUDA backend work).
-include cuda.mk

clean:
	rm -rf build build-asan build-fuzz
