# outbox-relay build. `make` builds bin/outbox-relay; `make test` builds the normal and the
# sanitizer (ASan + UBSan) variants and runs every test against the sanitizer build; `make bench`
# runs the benchmark (bench/bench.sh, not part of `make test`) against the normal build.

# `make test`, `quickstart`, `demo` and `bench` work as the first command on a fresh Debian 12:
# they first install what tools/packages.txt lists and the machine lacks (as root; otherwise they
# print the apt-get line and stop). This runs while the Makefile is read, before the pkg-config
# lines below, which would otherwise see a machine without pkg-config or the libraries.
ifneq ($(filter test quickstart demo bench,$(MAKECMDGOALS)),)
$(shell sh tools/install-deps.sh --auto >&2)
ifneq ($(.SHELLSTATUS),0)
$(error packages are missing, see above)
endif
endif

CC       ?= cc
PKGS     := libpq rdkafka jansson libmicrohttpd
# Debian's libev-dev ships no pkg-config file, so it is linked by name.
DEP_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
DEP_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lev -lm
# Unused parameters are the norm in callbacks whose signatures libev, libpq, librdkafka and
# cmocka impose, and the option tables (lib/opts.h) leave their optional trailing fields out;
# everything else of -Wall -Wextra stays on (and CI adds -Werror).
WARN     := -Wall -Wextra -Wshadow -Wformat=2 -Wno-unused-parameter -Wno-missing-field-initializers
CFLAGS   ?= -O2 -g
# The floors of the code (README, "Code layout"): lib/ is shared by the relay and the demos;
# the relay is relay/ (main, configuration) over relay/outbox, relay/io, relay/engine and
# relay/cmd. Headers are included by bare name; tools/check-floors.sh checks who includes whom.
RELAY_DIRS := relay relay/outbox relay/io relay/engine relay/cmd
INCLUDES := -Ilib $(addprefix -I,$(RELAY_DIRS)) -Ibin/gen
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) $(DEP_CFLAGS)
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

VERSION  := $(shell cat VERSION 2>/dev/null || echo 0.0.0)

SHARED_SRC := $(wildcard lib/*.c)
RELAY_SRC  := $(foreach d,$(RELAY_DIRS),$(wildcard $(d)/*.c))
RELAY_HDR  := $(wildcard lib/*.h) $(foreach d,$(RELAY_DIRS),$(wildcard $(d)/*.h))
MIGRATIONS := $(sort $(wildcard migrations/*.sql))
UNIT_SRC   := $(filter-out tests/unit/test_demo_%,$(wildcard tests/unit/test_*.c))
TOOL_SRC   := $(wildcard tests/tools/*.c)

# Objects mirror their source paths: bin/obj/relay/engine/session.o from relay/engine/session.c.
objs = $(patsubst %.c,$(1)/%.o,$(2))
OBJ      := $(call objs,bin/obj,$(SHARED_SRC) $(RELAY_SRC)) bin/obj/migrations_gen.o
ASAN_OBJ := $(call objs,bin/asan/obj,$(SHARED_SRC) $(RELAY_SRC)) bin/asan/obj/migrations_gen.o
ASAN_LIB_OBJ := $(filter-out %/relay/main.o,$(ASAN_OBJ))
UNIT_BIN := $(patsubst tests/unit/%.c,bin/asan/%,$(UNIT_SRC))
TOOL_BIN := $(patsubst tests/tools/%.c,bin/%,$(TOOL_SRC))

# The demo programs (producer-demo, consumer-demo) use lib/ and nothing of relay/; their schemas
# are embedded like the relay's migrations.
DEMO_CFLAGS := $(shell pkg-config --cflags libmicrohttpd 2>/dev/null) -Ilib -Ibin/gen
DEMO_LIBS   := $(shell pkg-config --libs libmicrohttpd 2>/dev/null) -lpthread
PRODUCER_SRC := $(wildcard producer-demo/*.c)
CONSUMER_SRC := $(wildcard consumer-demo/*.c)
DEMO_UNIT_SRC := $(wildcard tests/unit/test_demo_*.c)

PRODUCER_OBJ      := $(call objs,bin/obj,$(SHARED_SRC) $(PRODUCER_SRC)) bin/obj/producer_schema.o
PRODUCER_ASAN_OBJ := $(call objs,bin/asan/obj,$(SHARED_SRC) $(PRODUCER_SRC)) bin/asan/obj/producer_schema.o
CONSUMER_OBJ      := $(call objs,bin/obj,$(SHARED_SRC) $(CONSUMER_SRC)) bin/obj/consumer_schema.o
CONSUMER_ASAN_OBJ := $(call objs,bin/asan/obj,$(SHARED_SRC) $(CONSUMER_SRC)) bin/asan/obj/consumer_schema.o
# Unit tests of the demos link every demo module except the two main.c files.
DEMO_LIB_ASAN_OBJ := $(sort $(filter-out %/main.o,$(PRODUCER_ASAN_OBJ) $(CONSUMER_ASAN_OBJ)))
DEMO_UNIT_BIN := $(patsubst tests/unit/%.c,bin/asan/%,$(DEMO_UNIT_SRC))
DEMO_BIN := bin/producer-demo bin/consumer-demo
DEMO_ASAN_BIN := bin/asan/producer-demo bin/asan/consumer-demo
DEMO_HDR := $(wildcard lib/*.h producer-demo/*.h consumer-demo/*.h)

.PHONY: all asan tools test unit deps check-deps format format-check clean quickstart demos demo bench \
        fresh-test mutate check-floors

all: bin/outbox-relay $(DEMO_BIN)

# Fail early with the package to install instead of a wall of compiler errors.
bin/.deps-ok: tools/check-deps.sh tools/install-deps.sh tools/packages.txt
	@sh tools/check-deps.sh
	@mkdir -p bin && touch $@

bin/gen/migrations_gen.c: $(MIGRATIONS) tools/embed-migrations.sh | bin/.deps-ok
	@mkdir -p $(@D)
	sh tools/embed-migrations.sh $(MIGRATIONS) > $@.tmp && mv $@.tmp $@

bin/obj/lib/%.o: lib/%.c $(wildcard lib/*.h) | bin/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) -Ilib $(CFLAGS) -c $< -o $@

bin/asan/obj/lib/%.o: lib/%.c $(wildcard lib/*.h) | bin/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) -Ilib $(CFLAGS) $(SAN_FLAGS) -c $< -o $@

bin/obj/relay/%.o: relay/%.c $(RELAY_HDR) | bin/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(INCLUDES) $(CFLAGS) -DOUTBOX_RELAY_VERSION='"$(VERSION)"' -c $< -o $@

bin/asan/obj/relay/%.o: relay/%.c $(RELAY_HDR) | bin/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(INCLUDES) $(CFLAGS) $(SAN_FLAGS) -DOUTBOX_RELAY_VERSION='"$(VERSION)"' -c $< -o $@

bin/obj/migrations_gen.o: bin/gen/migrations_gen.c
	$(CC) $(BASE_CFLAGS) $(INCLUDES) $(CFLAGS) -c $< -o $@

bin/asan/obj/migrations_gen.o: bin/gen/migrations_gen.c
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(INCLUDES) $(CFLAGS) $(SAN_FLAGS) -c $< -o $@

bin/outbox-relay: $(OBJ)
	$(CC) $(CFLAGS) $^ $(DEP_LIBS) -o $@

bin/asan/outbox-relay: $(ASAN_OBJ)
	$(CC) $(CFLAGS) $(SAN_FLAGS) $^ $(DEP_LIBS) -o $@

asan: bin/asan/outbox-relay $(DEMO_ASAN_BIN)

# ---- demos ----------------------------------------------------------------------------------

bin/gen/%_schema.c: %-demo/schema.sql tools/embed-text.sh | bin/.deps-ok
	@mkdir -p $(@D)
	sh tools/embed-text.sh $*_schema_sql $< > $@.tmp && mv $@.tmp $@

bin/obj/%_schema.o: bin/gen/%_schema.c
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -c $< -o $@

bin/asan/obj/%_schema.o: bin/gen/%_schema.c
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $(SAN_FLAGS) -c $< -o $@

# The demos' own objects (a static pattern: one rule for both demo directories).
DEMO_OWN_OBJ      := $(call objs,bin/obj,$(PRODUCER_SRC) $(CONSUMER_SRC))
DEMO_OWN_ASAN_OBJ := $(call objs,bin/asan/obj,$(PRODUCER_SRC) $(CONSUMER_SRC))

$(DEMO_OWN_OBJ): bin/obj/%.o: %.c $(DEMO_HDR) | bin/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(DEMO_CFLAGS) -I$(<D) $(CFLAGS) -DOUTBOX_RELAY_VERSION='"$(VERSION)"' -c $< -o $@

$(DEMO_OWN_ASAN_OBJ): bin/asan/obj/%.o: %.c $(DEMO_HDR) | bin/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(DEMO_CFLAGS) -I$(<D) $(CFLAGS) $(SAN_FLAGS) -DOUTBOX_RELAY_VERSION='"$(VERSION)"' -c $< -o $@

bin/producer-demo: $(PRODUCER_OBJ)
	$(CC) $(CFLAGS) $^ $(DEP_LIBS) $(DEMO_LIBS) -o $@

bin/asan/producer-demo: $(PRODUCER_ASAN_OBJ)
	$(CC) $(CFLAGS) $(SAN_FLAGS) $^ $(DEP_LIBS) $(DEMO_LIBS) -o $@

bin/consumer-demo: $(CONSUMER_OBJ)
	$(CC) $(CFLAGS) $^ $(DEP_LIBS) $(DEMO_LIBS) -o $@

bin/asan/consumer-demo: $(CONSUMER_ASAN_OBJ)
	$(CC) $(CFLAGS) $(SAN_FLAGS) $^ $(DEP_LIBS) $(DEMO_LIBS) -o $@

demos: $(DEMO_BIN) $(DEMO_ASAN_BIN)

# The whole chain on a throwaway PostgreSQL and the mock broker (scripts/demo.sh).
demo: bin/outbox-relay $(DEMO_BIN) $(TOOL_BIN)
	@bash scripts/demo.sh

bin/asan/test_demo_%: tests/unit/test_demo_%.c $(DEMO_LIB_ASAN_OBJ)
	$(CC) $(BASE_CFLAGS) $(DEMO_CFLAGS) -Iproducer-demo -Iconsumer-demo $(CFLAGS) $(SAN_FLAGS) $^ $(DEP_LIBS) $(DEMO_LIBS) -lcmocka -o $@

# Test tools: the mock Kafka broker and a real consumer, both on librdkafka.
bin/%: tests/tools/%.c | bin/.deps-ok
	$(CC) $(BASE_CFLAGS) $(INCLUDES) $(CFLAGS) $< $(DEP_LIBS) -o $@

tools: $(TOOL_BIN)

# Unit tests (cmocka) link the relay's modules, built with the sanitizers.
bin/asan/test_%: tests/unit/test_%.c $(ASAN_LIB_OBJ)
	$(CC) $(BASE_CFLAGS) $(INCLUDES) $(CFLAGS) $(SAN_FLAGS) $^ $(DEP_LIBS) -lcmocka -o $@

unit: $(UNIT_BIN) $(DEMO_UNIT_BIN)

test: bin/outbox-relay bin/asan/outbox-relay $(TOOL_BIN) $(UNIT_BIN) $(DEMO_UNIT_BIN) \
      $(DEMO_BIN) $(DEMO_ASAN_BIN)
	@sh tools/check-floors.sh
	@sh tests/run.sh

# Who may include whom (README, "Code layout"); also the first step of `make test`.
check-floors:
	@sh tools/check-floors.sh

# Mutation testing: each deliberate bug of tests/mutants/ is applied to a scratch copy, built,
# and must be caught by the tests its patch names (tests/mutate.sh, docs/mutation.md). Not run
# by CI; takes about as long as the tests it runs.
mutate:
	@bash tests/mutate.sh

# The benchmark: throughput, latency, producer cost and memory of the non-sanitizer build, on a
# throwaway PostgreSQL and the project's broker. Sizes and durations: see bench/bench.sh.
bin/naive-relay: bench/naive_relay.c | bin/.deps-ok
	$(CC) $(BASE_CFLAGS) $(INCLUDES) $(CFLAGS) $< $(DEP_LIBS) -o $@

bench: bin/outbox-relay $(TOOL_BIN) bin/naive-relay
	@bash bench/bench.sh

# The relay end to end on a throwaway PostgreSQL and the project's broker.
quickstart: bin/outbox-relay $(TOOL_BIN)
	@bash scripts/quickstart.sh

# Installs the packages of tools/packages.txt the machine lacks (as root, or with sudo).
deps:
	sh tools/install-deps.sh

# The quick start proven on a fresh Debian 12: a debootstrap minbase chroot with only make and git
# added, this commit cloned into it, `make $(FRESH_CMD)` as its first command (root only; CI runs
# it). FRESH_CMD=test runs the whole suite there instead.
FRESH_CMD ?= quickstart
fresh-test:
	@bash tools/fresh-chroot.sh $(FRESH_CMD)

FORMAT_SRC = lib/*.[ch] $(addsuffix /*.[ch],$(RELAY_DIRS)) producer-demo/*.[ch] consumer-demo/*.[ch] \
             tests/unit/*.c tests/tools/*.c

format:
	clang-format -i $(FORMAT_SRC) bench/*.c

format-check:
	clang-format --dry-run --Werror $(FORMAT_SRC) bench/*.c

clean:
	rm -rf bin

# ---- fuzzing (issue 20; tests/fuzz/README.md) -----------------------------------------------
# libFuzzer harnesses for every parser of untrusted or semi-trusted input, built with clang and
# ASan + UBSan. `make fuzzers` builds them; `make test` runs each for a few seconds over its
# committed seeds and regression inputs (tests/it/96_fuzz_short.sh); `make fuzz` runs each for
# FUZZ_SECONDS (default 600), FUZZ_PARALLEL (default 1, at most 2 on a 2-core machine) at once.
FUZZ_CC     ?= clang
FUZZ_CFLAGS ?= -O1 -g
FUZZ_SAN    := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_INC    := $(INCLUDES) -Iproducer-demo -Iconsumer-demo $(DEMO_CFLAGS)
FUZZ_SRC    := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN    := $(patsubst tests/fuzz/%.c,bin/fuzz/%,$(FUZZ_SRC))
# What each harness links: the relay's parsers, or one demo's.
FUZZ_RELAY_OBJ    := $(call objs,bin/fuzz/obj,$(SHARED_SRC) relay/config.c relay/kafka_guard.c \
                       relay/tls_report.c $(wildcard relay/outbox/*.c))
FUZZ_PRODUCER_OBJ := $(call objs,bin/fuzz/obj,$(SHARED_SRC) producer-demo/order.c producer-demo/idem.c)
FUZZ_CONSUMER_OBJ := $(call objs,bin/fuzz/obj,$(SHARED_SRC) consumer-demo/event.c)
FUZZ_SECONDS  ?= 600
FUZZ_PARALLEL ?= 1

.PHONY: fuzzers fuzz
fuzzers: $(FUZZ_BIN)

bin/fuzz/obj/%.o: %.c $(RELAY_HDR) $(DEMO_HDR) | bin/.deps-ok
	@mkdir -p $(@D)
	$(FUZZ_CC) $(BASE_CFLAGS) $(FUZZ_INC) $(FUZZ_CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer-no-link \
	    -DOUTBOX_RELAY_VERSION='"$(VERSION)"' -c $< -o $@

bin/fuzz/fuzz_order: FUZZ_LINK = $(FUZZ_PRODUCER_OBJ)
bin/fuzz/fuzz_event: FUZZ_LINK = $(FUZZ_CONSUMER_OBJ)
FUZZ_LINK ?= $(FUZZ_RELAY_OBJ)
bin/fuzz/fuzz_order: $(FUZZ_PRODUCER_OBJ)
bin/fuzz/fuzz_event: $(FUZZ_CONSUMER_OBJ)
$(filter-out bin/fuzz/fuzz_order bin/fuzz/fuzz_event,$(FUZZ_BIN)): $(FUZZ_RELAY_OBJ)

bin/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(RELAY_HDR) $(DEMO_HDR)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(BASE_CFLAGS) $(FUZZ_INC) $(FUZZ_CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer $< \
	    $(FUZZ_LINK) $(DEP_LIBS) $(DEMO_LIBS) -o $@

fuzz: $(FUZZ_BIN)
	@FUZZ_PARALLEL=$(FUZZ_PARALLEL) bash tests/fuzz/run.sh $(FUZZ_SECONDS)

test: $(FUZZ_BIN)
FORMAT_SRC += tests/fuzz/*.c
