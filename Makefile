# Sluice build. Targets: all deps run test unit integration bench fuzz clean.
#   make                     -> build/bin/sluice-runtime (+ unit tests' deps)
#   make SAN=address,undefined -> sanitized tree under build/san-address-undefined
#   make test                -> deps, build, cmocka unit tests, pytest integration
.DEFAULT_GOAL := all

CC      ?= cc
SAN     ?=
ifeq ($(SAN),)
BUILD   ?= build
SANFLAGS :=
else
BUILD   ?= build/san-$(subst $(comma),-,$(SAN))
SANFLAGS := -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=undefined
endif
comma := ,

PKGS    := libevent libevent_pthreads libevent_openssl jansson yaml-0.1 libpcre2-8 liburcu-qsbr \
           libprotobuf-c openssl sqlite3 libnghttp2 hiredis libpq
# gRPC core: shared libraries pull in their own dependencies.
GRPC_LIBS  := -lgrpc -lgpr
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

CFLAGS  ?= -O2 -g
CFLAGS  += -std=gnu11 -Wall -Wextra -Werror -D_GNU_SOURCE -D_LGPL_SOURCE \
           -fno-strict-aliasing $(SANFLAGS) \
           -Icommon $(RUNTIME_DIRS:%=-I%) -Ipolicies -Icontroller -I$(BUILD)/gen $(PKG_CFLAGS)
LDFLAGS += $(SANFLAGS)
# libcrypt (libxcrypt): crypt_r for the basic-auth policy's password hashes.
LDLIBS  += $(PKG_LIBS) $(GRPC_LIBS) -lcrypt -lpthread -lm

PROTOS      := $(wildcard proto/sluice/v1/*.proto)
PROTO_C     := $(patsubst proto/%.proto,$(BUILD)/gen/%.pb-c.c,$(PROTOS))
PROTO_H     := $(PROTO_C:.c=.h)

COMMON_SRC  := $(wildcard common/*.c)
# The runtime by layer (DESIGN.md "Layout"): net/ listeners and TLS, http/
# codecs, proxy/ the protocol-independent request and its upstream side,
# control/ generations, the config stream and admin, tlog/ the traffic log
# pipeline (rings, logger thread, sinks). Headers are included by
# name, so every layer's folder is on the include path.
RUNTIME_DIRS := runtime runtime/net runtime/http runtime/proxy runtime/control runtime/tlog
RUNTIME_SRC := $(filter-out runtime/main.c,$(wildcard $(RUNTIME_DIRS:%=%/*.c)))
POLICY_SRC  := $(wildcard policies/*.c policies/*/*.c)
CTRL_SRC    := $(filter-out controller/main.c,$(wildcard controller/*.c))

# Policies link into both binaries: the controller runs their validators
# and compile step (policies/policy.h), the runtime their hooks too.
COMMON_OBJ  := $(COMMON_SRC:%.c=$(BUILD)/obj/%.o) $(PROTO_C:$(BUILD)/gen/%.c=$(BUILD)/obj/gen/%.o) \
               $(POLICY_SRC:%.c=$(BUILD)/obj/%.o)
RUNTIME_OBJ := $(RUNTIME_SRC:%.c=$(BUILD)/obj/%.o)
CTRL_OBJ    := $(CTRL_SRC:%.c=$(BUILD)/obj/%.o)

LIBCOMMON   := $(BUILD)/lib/libsl-common.a
LIBRUNTIME  := $(BUILD)/lib/libsl-runtime.a
RUNTIME_BIN := $(BUILD)/bin/sluice-runtime
LIBCTRL     := $(BUILD)/lib/libsl-controller.a
CTRL_BIN    := $(BUILD)/bin/sluice-controller

UNIT_SRC    := $(wildcard tests/unit/*/test_*.c tests/unit/*/*/test_*.c)
UNIT_BIN    := $(UNIT_SRC:%.c=$(BUILD)/%)

.PHONY: all deps run test unit integration bench fuzz clean format perf-tools
.SECONDARY:

BINS := $(RUNTIME_BIN) $(if $(wildcard controller/main.c),$(CTRL_BIN))
# Test helpers (tests/tools/*.c): small programs the integration tests run.
TOOL_SRC    := $(wildcard tests/tools/*.c)
TOOL_BIN    := $(TOOL_SRC:%.c=$(BUILD)/%)
OPENLOAD    := $(BUILD)/perf/openload
all: $(BINS) $(UNIT_BIN) $(TOOL_BIN) $(OPENLOAD)

# --- generated code --------------------------------------------------------
$(BUILD)/gen/%.pb-c.c $(BUILD)/gen/%.pb-c.h: proto/%.proto
	@mkdir -p $(BUILD)/gen
	protoc-c --proto_path=proto --c_out=$(BUILD)/gen $<

# --- objects ---------------------------------------------------------------
# Every object waits for the generated headers: many include snapshot.pb-c.h.
$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-unused-parameter -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(LIBCOMMON): $(COMMON_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(LIBRUNTIME): $(RUNTIME_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(RUNTIME_BIN): $(BUILD)/obj/runtime/main.o $(LIBRUNTIME) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(LIBCTRL): $(CTRL_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(CTRL_BIN): $(BUILD)/obj/controller/main.o $(LIBCTRL) $(LIBCOMMON)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Unit tests may #include the .c under test to reach static functions; the
# archives then only fill in what the test does not define itself.
TEST_LIBS := $(LIBRUNTIME) $(if $(CTRL_SRC),$(LIBCTRL)) $(LIBCOMMON)
$(BUILD)/tests/unit/%: tests/unit/%.c $(TEST_LIBS) | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Icontroller -Itests/unit -MMD -MP -o $@ $< $(TEST_LIBS) \
	    $(LDFLAGS) $(LDLIBS) -lcmocka

$(BUILD)/tests/tools/%: tests/tools/%.c $(LIBCOMMON) | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -o $@ $< $(LIBCOMMON) $(LDFLAGS) $(LDLIBS)

# Small measuring programs of perf/ (perf/*.c), built by `make perf-tools`.
PERF_SRC := $(wildcard perf/*.c)
PERF_BIN := $(PERF_SRC:perf/%.c=$(BUILD)/perf/%)
$(BUILD)/perf/%: perf/%.c $(TEST_LIBS) | $(PROTO_H)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -o $@ $< $(TEST_LIBS) $(LDFLAGS) $(LDLIBS)
perf-tools: $(PERF_BIN)
# The open-loop load generator of `make bench` (latency at fixed rates): a
# stand-alone program, built with `all` so that its integration test finds it.
$(OPENLOAD): perf/openload.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -o $@ $< $(LDFLAGS) -lm

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# --- set-up ----------------------------------------------------------------
# Debian packages the build, the tests and `make run` need. Idempotent: only
# missing packages are installed, so this is fast when all are present.
DEB_PKGS := build-essential pkg-config libevent-dev libnghttp2-dev \
    libprotobuf-c-dev protobuf-c-compiler libgrpc-dev libjansson-dev libyaml-dev \
    libssl-dev libcrypt-dev liburcu-dev libsqlite3-dev libhiredis-dev libpcre2-dev \
    libcmocka-dev python3 python3-pytest python3-yaml curl nginx haproxy \
    wrk nghttp2-client redis-server clang libclang-rt-14-dev iproute2 util-linux \
    valgrind python3-grpcio python3-protobuf protobuf-compiler python3-websockets python3-h2 \
    python3-ruamel.yaml python3-cryptography python3-jsonschema \
    openssl prometheus clickhouse-server gnuplot-nox libpq-dev postgresql
deps:
	@missing=$$(for p in $(DEB_PKGS); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; \
	  done); \
	if [ -n "$$missing" ]; then \
	  echo "installing: $$missing"; \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# --- run / test ------------------------------------------------------------
run: deps
	@$(MAKE) --no-print-directory -j$(JOBS) $(BINS)
	@BUILD=$(BUILD) ./examples/run.sh

JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@$(MAKE) --no-print-directory unit integration

unit: $(UNIT_BIN)
	@fail=0; for t in $(UNIT_BIN); do echo "== $$t"; $$t || fail=1; done; \
	[ $$fail = 0 ] || { echo "unit tests failed"; exit 1; }

# --durations: the 15 slowest tests after the summary, to keep the suite
# well under 20 minutes.
PYTEST_ARGS ?=
integration: $(BINS)
	SLUICE_BUILD=$(BUILD) /usr/bin/python3 -m pytest -q -ra --durations=15 tests/integration $(PYTEST_ARGS)

bench: deps
	@$(MAKE) --no-print-directory $(BINS) $(OPENLOAD)
	BUILD=$(BUILD) ./perf/bench.sh

# Fuzz drivers (libFuzzer); FUZZ_SECONDS per driver, default 60.
FUZZ_SECONDS ?= 60
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) ./tests/fuzz/run.sh

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build
