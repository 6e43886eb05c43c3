# attnd — `make` builds, `make test` proves, `make bench` measures, `make run` serves.
#
#   make              build/attnd, build/libattn.a
#   make check        the quick loop: the C suites once, no sanitizer, no script
#   make test         every suite and script, the kernel's cases on each kernel,
#                     then the C suites under ASan + UBSan
#   make run          the server on its defaults (ATTND_* variables change them)
#   make bench        the benchmark table
#   make web-test     the page at GET / in Debian's Chromium (playwright-core)
#   make ops-test     promtool, a real Prometheus scraping attnd, docker/k8s/ validated,
#                     docker/nginx.conf routing KV caches
#   make container-test  docker/Dockerfile, compose.yaml and the k8s Deployment
#                     (podman kube play) run with podman
#   make install      attnd, its systemd unit, libattn (attn.h, libattn.a, attn.pc)
#   make fuzz         the libFuzzer target on the request path, FUZZ_TIME seconds
#   make reliability  fuzzing, soak, overload, slow clients, fail-over, drain,
#                     valgrind: one table, a measured figure and PASS/FAIL a row
#
# On a fresh Debian machine the first of these installs the packages it needs
# (tools/deps.sh: apt-get when root, otherwise it prints the one command).

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
SAN     ?=
# Warnings are errors for whoever works on attnd (a git checkout) and in make
# check and make test, but not for a packager's build of a release (no .git)
# or any build that sets WERROR=0: a newer compiler's new warning must not
# stop a distribution's build.
ifeq ($(origin WERROR),undefined)
WERROR := $(if $(wildcard .git),1,0)
ifneq ($(filter check test,$(MAKECMDGOALS)),)
WERROR := 1
endif
endif
export WERROR # to the makes that make test starts
CFLAGS_COMMON = -std=c11 -D_GNU_SOURCE -g -Wall -Wextra $(if $(filter 1,$(WERROR)),-Werror) -pthread
# Recursively expanded on purpose: pkg-config may only exist once tools/deps.sh ran.
# jansson is the tests' independent JSON parser, the reference the codec
# (api/json/) is held to; attnd itself neither includes nor links it.
PKG_CFLAGS = $(shell pkg-config --cflags openblas jansson libmicrohttpd 2>/dev/null)
PKG_CFLAGS_LIB = $(shell pkg-config --cflags openblas 2>/dev/null)
PKG_CFLAGS_SRV = $(shell pkg-config --cflags libmicrohttpd 2>/dev/null)
PKG_LIBS_LIB = $(shell pkg-config --libs openblas 2>/dev/null) -lm
PKG_LIBS_SRV = $(shell pkg-config --libs libmicrohttpd 2>/dev/null)
PKG_LIBS_JANSSON = $(shell pkg-config --libs jansson 2>/dev/null)
PKG_LIBS_TEST = $(shell pkg-config --libs check libcurl 2>/dev/null) $(PKG_LIBS_JANSSON)
ifeq ($(SAN),1)
SANFLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif

# The layers. Each is compiled seeing only the headers it may use, so that an
# include that reaches across a layer does not compile (tests/test_layers.sh
# checks that it does not):
#   cpu/       what this CPU can run; libc only (libattn and the codec use it)
#   lib/       libattn: lib/, cpu/ and OpenBLAS
#   api/json/  the codec, a library of its own: api/json/ and cpu/ only,
#              nothing of the API layer or of libattn
#   api/       api/ and the codec's header (json/codec.h), and of libattn
#              only its public header, attn.h, linked alone into BUILD/include
#   server/    server/ and api/: nothing of libattn
#   tests/     everything
INC_CPU    = -Icpu
INC_LIB    = -Ilib -Icpu $(PKG_CFLAGS_LIB)
INC_CODEC  = -Iapi/json -Icpu
INC_API    = -Iapi -I$(BUILD)/include
INC_SERVER = -Iserver -Iapi $(PKG_CFLAGS_SRV)
INC_TESTS  = -Ilib -Iapi -Iserver -Icpu $(PKG_CFLAGS)
# (of two patterns, the one with the shorter stem, api/json/, wins)
$(BUILD)/obj/cpu/%.o:      CFLAGS_LAYER = $(INC_CPU)
$(BUILD)/obj/lib/%.o:      CFLAGS_LAYER = $(INC_LIB)
$(BUILD)/obj/api/%.o:      CFLAGS_LAYER = $(INC_API)
$(BUILD)/obj/api/json/%.o: CFLAGS_LAYER = $(INC_CODEC)
$(BUILD)/obj/server/%.o:   CFLAGS_LAYER = $(INC_SERVER)
$(BUILD)/obj/tests/%.o:    CFLAGS_LAYER = $(INC_TESTS)
$(BUILD)/obj/web_assets.o: CFLAGS_LAYER = $(INC_SERVER)

CFLAGS_ALL = $(CFLAGS_COMMON) $(OPT) $(SANFLAGS) $(CFLAGS_LAYER) $(CFLAGS_ISA) $(CFLAGS)
LDFLAGS_ALL = $(SANFLAGS) -pthread $(LDFLAGS)
OBJCOPY ?= objcopy

CPU_SRC  := $(sort $(wildcard cpu/*.c))
LIB_SRC  := $(sort $(wildcard lib/*.c))
CODEC_SRC := $(sort $(wildcard api/json/*.c))
API_SRC  := $(sort $(wildcard api/*.c))
SRV_SRC  := $(sort $(filter-out server/main.c,$(wildcard server/*.c)))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TEST_SCRIPTS := $(sort $(wildcard tests/test_*.sh))
TEST_SUPPORT := $(sort $(wildcard tests/support/*.c))

CPU_OBJ  := $(CPU_SRC:%.c=$(BUILD)/obj/%.o)
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CODEC_OBJ := $(CODEC_SRC:%.c=$(BUILD)/obj/%.o)
API_OBJ  := $(API_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/openapi_yaml.o \
            $(BUILD)/obj/openapi_json.o
SRV_OBJ  := $(SRV_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/web_assets.o
SUPPORT_OBJ := $(TEST_SUPPORT:%.c=$(BUILD)/obj/%.o)
TESTS    := $(TEST_SRC:tests/%.c=$(BUILD)/%)

DEPS_STAMP = build/.deps-ok

.PHONY: all test check run bench clean deps sanitize web-test ops-test container-test install \
        fuzz fuzz-build fuzz-corpus reliability exhaustive
# Keep the test objects between runs (they are intermediate to pattern rules).
.SECONDARY:
all: $(BUILD)/attnd $(BUILD)/libattn.a

deps: $(DEPS_STAMP)
$(DEPS_STAMP): tools/deps.sh
	@sh tools/deps.sh build
	@mkdir -p build && touch $@

# libattn's kernels, one file per instruction set (lib/kern_*.c), each compiled
# for its own; lib/kernel.c runs one only on a CPU that has the instructions.
ifeq ($(shell uname -m),x86_64)
$(BUILD)/obj/lib/kern_avx2.o: CFLAGS_ISA = -mavx2 -mfma -mf16c
$(BUILD)/obj/lib/kern_avx512.o: CFLAGS_ISA = -mavx512f -mavx2 -mfma -mf16c
$(BUILD)/obj/lib/kern_avx512_bf16.o: CFLAGS_ISA = -mavx512f -mavx512bw -mavx512bf16 -mavx2 -mfma
$(BUILD)/obj/lib/kern_amx_bf16.o: CFLAGS_ISA = -mavx512f -mavx512bw -mavx512bf16 -mavx2 -mfma -mamx-tile -mamx-bf16
endif

$(BUILD)/obj/%.o: %.c | $(DEPS_STAMP) $(BUILD)/include/attn.h $(BUILD)/layers.env
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -MMD -MP -c $< -o $@

# libattn's public header, alone in a directory of its own for api/ to see.
# A link, so that an error message's path opens the real file.
$(BUILD)/include/attn.h: lib/attn.h
	@mkdir -p $(dir $@)
	ln -sf $(abspath $<) $@

# Each layer's flags, for tests/test_layers.sh; rewritten only when they change.
$(BUILD)/layers.env: FORCE
	@mkdir -p $(dir $@)
	@{ echo "CC='$(CC)'"; echo "CFLAGS_COMMON='$(CFLAGS_COMMON) $(CFLAGS)'"; \
	   echo "INC_CPU='$(INC_CPU)'"; echo "INC_LIB='$(INC_LIB)'"; \
	   echo "INC_CODEC='$(INC_CODEC)'"; echo "INC_API='$(INC_API)'"; \
	   echo "INC_SERVER='$(INC_SERVER)'"; \
	   echo "LDFLAGS_ALL='$(LDFLAGS_ALL)'"; echo "PKG_LIBS_LIB='$(PKG_LIBS_LIB)'"; } > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@
.PHONY: FORCE
FORCE:

# The contract, embedded so that the binary serves GET /openapi.yaml and
# GET /openapi.json on its own: each file as a byte array (a NUL after it)
# and its length, $(call embed,FILE,NAME).
define embed
@mkdir -p $(dir $@)
@{ echo '#include <stddef.h>'; \
   echo 'const char $(2)[] = {'; \
   od -An -v -tx1 $(1) | sed -e 's/\([0-9a-f][0-9a-f]\)/0x\1,/g'; \
   echo '0x00};'; \
   echo 'const size_t $(2)_len = sizeof $(2) - 1;'; } > $@
endef
$(BUILD)/openapi_yaml.c: api/openapi.yaml
	$(call embed,$<,api_openapi_yaml)
$(BUILD)/openapi_json.c: $(BUILD)/openapi.json
	$(call embed,$<,api_openapi_json)
$(BUILD)/obj/openapi_%.o: $(BUILD)/openapi_%.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

# The JSON form of the contract, converted at build time by a converter of
# ours (tools/yaml2json.c: C and libc only, no new build dependency), which
# reads the part of YAML the contract is written in and refuses anything
# else, or anything YAML 1.1 and 1.2 read differently, rather than guess.
# tests/test_openapi.sh checks it against PyYAML's reading of the YAML.
HOSTCC ?= $(CC)
$(BUILD)/yaml2json: tools/yaml2json.c
	@mkdir -p $(dir $@)
	$(HOSTCC) -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra $(if $(filter 1,$(WERROR)),-Werror) -o $@ $<
$(BUILD)/openapi.json: api/openapi.yaml $(BUILD)/yaml2json
	./$(BUILD)/yaml2json $< > $@.tmp && mv $@.tmp $@

# The page (GET /, server/web/), embedded the same way: one byte array per file.
# server/web/package.json only tells Node (18, Debian's) that attnd.js is an
# ES module, for the clients run outside the browser; it is not served.
WEB_FILES := $(sort $(filter-out server/web/package.json,$(wildcard server/web/*)))
$(BUILD)/web_assets.c: $(WEB_FILES) tools/embed-web.sh
	@mkdir -p $(dir $@)
	@sh tools/embed-web.sh $(WEB_FILES) > $@
$(BUILD)/obj/web_assets.o: $(BUILD)/web_assets.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

# libattn.a is one object: libattn's files (and cpu/) linked together, every
# name but the attn_ ones made local, so that a program may have a function
# of its own called sdpa_alloc or cpu_features. The tests link it too.
$(BUILD)/libattn.a: $(LIB_OBJ) $(CPU_OBJ)
	@rm -f $@
	$(LD) -r -o $(BUILD)/obj/libattn.o $^
	$(OBJCOPY) --wildcard --keep-global-symbol='attn_*' $(BUILD)/obj/libattn.o
	ar rcs $@ $(BUILD)/obj/libattn.o
# libcodec.a, the JSON codec (api/json/, with its own copy of cpu/), made the
# same way: only the codec_ names global. It needs nothing of libattnapi.a
# or libattn.a (tests/test_layers.sh links a program against it alone).
$(BUILD)/libcodec.a: $(CODEC_OBJ) $(CPU_OBJ)
	@rm -f $@
	$(LD) -r -o $(BUILD)/obj/libcodec.o $^
	$(OBJCOPY) --wildcard --keep-global-symbol='codec_*' $(BUILD)/obj/libcodec.o
	ar rcs $@ $(BUILD)/obj/libcodec.o
$(BUILD)/libattnapi.a: $(API_OBJ)
	@rm -f $@
	ar rcs $@ $^
$(BUILD)/libattnsrv.a: $(SRV_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/attnd: $(BUILD)/obj/server/main.o $(BUILD)/libattnsrv.a $(BUILD)/libattnapi.a \
               $(BUILD)/libcodec.a $(BUILD)/libattn.a
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(PKG_LIBS_SRV) $(PKG_LIBS_LIB)

# The tests call cpu/ too (its copies in the libraries are hidden).
$(BUILD)/test_%: $(BUILD)/obj/tests/test_%.o $(SUPPORT_OBJ) $(CPU_OBJ) $(BUILD)/libattnsrv.a \
                 $(BUILD)/libattnapi.a $(BUILD)/libcodec.a $(BUILD)/libattn.a
	$(CC) $(LDFLAGS_ALL) -o $@ $^ $(PKG_LIBS_TEST) $(PKG_LIBS_SRV) $(PKG_LIBS_LIB)

# The quick loop: every C suite of this build once, on the kernel libattn
# picks (ATTN_KERNEL=generic or ATTN_KERNELS="avx2 generic" choose), no
# sanitizer, no script. tests/run-suites.sh prints each suite's result line
# and fails when any suite fails; it says how to run one suite or one case.
check: $(TESTS) $(BUILD)/attnd
	@sh tests/run-suites.sh $(BUILD) $(TESTS)

# What CI runs: every suite and script once on the widest kernel this CPU
# runs, the test cases tagged "kernel" again on each other kernel
# (TEST_KERNELS, or ATTN_KERNELS when set); then the C suites once more
# under ASan + UBSan, on that widest kernel only. The other kernels' forward
# and backward tiles (lib/kern_body.h, the same C over other vector
# operations) run in the plain pass only; their micro-kernels and row steps,
# which test_kernels and test_lib call by name for every kernel, run under
# the sanitizers too.
# make test builds on every core (a make -jN of its own passes its jobs on).
BUILD_JOBS = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 2))
TEST_KERNELS = $(or $(ATTN_KERNELS),avx512 avx2 generic)
SAN_KERNELS = $(firstword $(TEST_KERNELS))
test: $(DEPS_STAMP)
	@sh tools/deps.sh test
	@$(MAKE) --no-print-directory $(BUILD_JOBS) build/attnd $(TEST_SRC:tests/%.c=build/%)
	@ATTN_KERNELS="$(TEST_KERNELS)" sh tests/run-suites.sh build \
	    $(TEST_SRC:tests/%.c=build/%) $(TEST_SCRIPTS)
	@$(MAKE) --no-print-directory $(BUILD_JOBS) BUILD=build/san SAN=1 OPT=-O1 \
	    build/san/attnd $(TEST_SRC:tests/%.c=build/san/%)
	@# No fork under the sanitizers: each suite is one process, so LeakSanitizer
	@# checks everything it allocated when it exits (and fails the suite).
	@CK_FORK=no ATTN_KERNELS="$(SAN_KERNELS)" sh tests/run-suites.sh build/san \
	    $(TEST_SRC:tests/%.c=build/san/%)

run: $(BUILD)/attnd
	./$(BUILD)/attnd

bench: $(BUILD)/attnd $(BUILD)/libattn.a
	@sh tools/deps.sh bench
	@sh bench/run.sh $(BUILD)

# The page in a real browser; skips with one line where Chromium or Node.js
# cannot be had (tests/node/run.sh).
web-test: $(BUILD)/attnd
	@sh tests/node/run.sh $(BUILD) chromium tests/node/page.test.mjs

# Prometheus (Debian's, with promtool), the Kubernetes manifests (with the
# KEDA and KServe alternatives and the ingress), and docker/nginx.conf
# routing KV caches in Debian's nginx.
ops-test: $(BUILD)/attnd
	@sh tests/node/run.sh $(BUILD) "prometheus nginx" tests/node/ops.test.mjs tests/node/balancer.test.mjs

# The image and the compose stack, built and run with podman + runc.
container-test:
	@sh tests/container/run.sh

# make install [PREFIX=/usr/local] [DESTDIR=]: attnd and its systemd unit, and
# libattn for C programs: `cc prog.c $$(pkg-config --cflags --libs attn)`.
# libattn is installed static only: its interface (the parameter structs of
# attn.h) still grows with each version, and a static library cannot be
# swapped under a program built against another layout.
PREFIX ?= /usr/local
VERSION = $(shell sed -n 's/^\#define ATTND_VERSION "\(.*\)"/\1/p' server/config.h)
install: $(BUILD)/attnd $(BUILD)/libattn.a
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/include \
	    $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/lib/systemd/system \
	    $(DESTDIR)$(PREFIX)/share/doc/attnd/docs
	install -m 755 $(BUILD)/attnd $(DESTDIR)$(PREFIX)/bin/attnd
	install -m 644 $(BUILD)/libattn.a $(DESTDIR)$(PREFIX)/lib/libattn.a
	install -m 644 lib/attn.h $(DESTDIR)$(PREFIX)/include/attn.h
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' tools/attn.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/attn.pc
	sed -e 's|@BINDIR@|$(PREFIX)/bin|g' -e 's|@PREFIX@|$(PREFIX)|g' docker/attnd.service \
	    > $(DESTDIR)$(PREFIX)/lib/systemd/system/attnd.service
	install -m 644 README.md $(DESTDIR)$(PREFIX)/share/doc/attnd/README.md
	install -m 644 docs/*.md docs/*.png $(DESTDIR)$(PREFIX)/share/doc/attnd/docs

# The libFuzzer target (tests/fuzz/fuzz_api.c) is built by clang with ASan,
# UBSan and coverage in build/fuzz; the seeds come from the API suite's own
# request bodies, captured by a copy of it linked with tests/fuzz/capture.c.
FUZZ_TIME ?= 60
FUZZ_CFLAGS = -fsanitize=fuzzer-no-link
$(BUILD)/fuzz_api: $(BUILD)/obj/tests/fuzz/fuzz_api.o $(BUILD)/obj/tests/support/api_invariants.o \
                   $(BUILD)/obj/tests/support/ref.o $(BUILD)/libattnapi.a $(BUILD)/libcodec.a \
                   $(BUILD)/libattn.a
	$(CC) $(LDFLAGS_ALL) -fsanitize=fuzzer -o $@ $^ $(PKG_LIBS_JANSSON) $(PKG_LIBS_LIB)
$(BUILD)/capture_test_api: $(BUILD)/obj/tests/test_api.o $(BUILD)/obj/tests/fuzz/capture.o \
                           $(SUPPORT_OBJ) $(CPU_OBJ) $(BUILD)/libattnapi.a $(BUILD)/libcodec.a \
                           $(BUILD)/libattn.a
	$(CC) $(LDFLAGS_ALL) -Wl,--wrap=api_handle -o $@ $^ $(PKG_LIBS_TEST) $(PKG_LIBS_LIB)
fuzz-build: $(DEPS_STAMP)
	@sh tools/deps.sh fuzz
	@$(MAKE) --no-print-directory build/capture_test_api
	@$(MAKE) --no-print-directory BUILD=build/fuzz CC=clang SAN=1 OPT=-O1 \
	    CFLAGS="$(FUZZ_CFLAGS)" build/fuzz/fuzz_api
fuzz: fuzz-build
	@sh tests/fuzz/run.sh build/fuzz $(FUZZ_TIME)
# Rewrites tests/fuzz/corpus as the smallest set with the coverage of it, the
# seeds and what earlier `make fuzz` runs found.
fuzz-corpus: fuzz-build
	@sh tests/fuzz/run.sh build/fuzz merge

# One table: fuzzing, soak, overload, slow clients, fail-over, drain,
# valgrind (docs/reliability.md). Durations: FUZZ_TIME, RELIABILITY_SECONDS and the others that
# tests/reliability/run.sh lists.
RELIABILITY_SUITES = build/test_api build/test_codec build/test_lib build/test_mha \
                     build/test_kernels build/test_variants
reliability: $(DEPS_STAMP)
	@sh tools/deps.sh reliability
	@$(MAKE) --no-print-directory fuzz-build build/attnd $(RELIABILITY_SUITES)
	@FUZZ_TIME=$(FUZZ_TIME) bash tests/reliability/run.sh build

# Opt-in, about an hour on two cores: every float32 printed and read back
# (tests/float_exhaustive.c says what it checks).
exhaustive: $(BUILD)/float_exhaustive
	./$(BUILD)/float_exhaustive
$(BUILD)/float_exhaustive: $(BUILD)/obj/tests/float_exhaustive.o $(BUILD)/obj/tests/support/float_check.o \
                           $(BUILD)/libcodec.a
	$(CC) $(LDFLAGS_ALL) -o $@ $^ -lm

clean:
	rm -rf build

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
