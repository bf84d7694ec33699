# outbox-relay build. `make` builds bin/outbox-relay; `make test` builds the normal and the
# sanitizer (ASan + UBSan) variants and runs every test against the sanitizer build; `make bench`
# runs the benchmark (bench/bench.sh, not part of `make test`) against the normal build.

# `make test`, `quickstart`, `demo` and `bench` work as the first command on a fresh Debian 12:
# they first install what tools/packages.txt lists and the machine lacks (as root; otherwise they
# print the apt-get line and stop). This runs while the Makefile is read, before the pkg-config
# lines below, which would otherwise see a machine without pkg-config or the libraries.
ifneq ($(filter test quickstart demo bench bench-redis,$(MAKECMDGOALS)),)
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
# cmocka impose; everything else of -Wall -Wextra stays on (and CI adds -Werror).
WARN     := -Wall -Wextra -Wshadow -Wformat=2 -Wno-unused-parameter
CFLAGS   ?= -O2 -g
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) $(DEP_CFLAGS) -Irelay -Ibin/gen
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

VERSION  := $(shell cat VERSION 2>/dev/null || echo 0.0.0)

RELAY_SRC  := $(wildcard relay/*.c)
LIB_SRC    := $(filter-out relay/main.c,$(RELAY_SRC))
MIGRATIONS := $(sort $(wildcard migrations/*.sql))
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
TOOL_SRC   := $(wildcard tests/tools/*.c)

OBJ      := $(patsubst relay/%.c,bin/obj/%.o,$(RELAY_SRC)) bin/obj/migrations_gen.o
LIB_OBJ  := $(patsubst relay/%.c,bin/obj/%.o,$(LIB_SRC)) bin/obj/migrations_gen.o
ASAN_OBJ := $(patsubst relay/%.c,bin/asan/obj/%.o,$(RELAY_SRC)) bin/asan/obj/migrations_gen.o
ASAN_LIB_OBJ := $(patsubst relay/%.c,bin/asan/obj/%.o,$(LIB_SRC)) bin/asan/obj/migrations_gen.o
UNIT_BIN := $(patsubst tests/unit/%.c,bin/asan/%,$(UNIT_SRC))
TOOL_BIN := $(patsubst tests/tools/%.c,bin/%,$(TOOL_SRC))

# The demo programs (producer-demo, consumer-demo) share demo-common/ and the relay's log and
# backoff modules; their schemas are embedded like the relay's migrations.
DEMO_CFLAGS := $(shell pkg-config --cflags libmicrohttpd 2>/dev/null) -Idemo-common
DEMO_LIBS   := $(shell pkg-config --libs libmicrohttpd hiredis 2>/dev/null) -lpthread
DEMO_RELAY  := log backoff secrets optval
COMMON_SRC   := $(wildcard demo-common/*.c)
PRODUCER_SRC := $(wildcard producer-demo/*.c)
CONSUMER_SRC := $(wildcard consumer-demo/*.c)
DEMO_UNIT_SRC := $(wildcard tests/unit/test_demo_*.c)

# demo objects of one build flavour ($(1) = bin/obj or bin/asan/obj)
demo_objs = $(patsubst %.c,$(1)/demo/%.o,$(COMMON_SRC) $(2)) \
            $(patsubst %,$(1)/%.o,$(DEMO_RELAY))
PRODUCER_OBJ      := $(call demo_objs,bin/obj,$(PRODUCER_SRC)) bin/obj/producer_schema.o
PRODUCER_ASAN_OBJ := $(call demo_objs,bin/asan/obj,$(PRODUCER_SRC)) bin/asan/obj/producer_schema.o
CONSUMER_OBJ      := $(call demo_objs,bin/obj,$(CONSUMER_SRC)) bin/obj/consumer_schema.o
CONSUMER_ASAN_OBJ := $(call demo_objs,bin/asan/obj,$(CONSUMER_SRC)) bin/asan/obj/consumer_schema.o
# Unit tests of the demos link every demo module except the two main.c files.
DEMO_LIB_ASAN_OBJ := $(filter-out %/main.o,$(PRODUCER_ASAN_OBJ) $(CONSUMER_ASAN_OBJ))
DEMO_UNIT_BIN := $(patsubst tests/unit/%.c,bin/asan/%,$(DEMO_UNIT_SRC))
DEMO_BIN := bin/producer-demo bin/consumer-demo
DEMO_ASAN_BIN := bin/asan/producer-demo bin/asan/consumer-demo

.PHONY: all asan tools test unit deps check-deps format format-check clean quickstart demos demo bench bench-redis \
        fresh-test mutate

all: bin/outbox-relay $(DEMO_BIN)

# Fail early with the package to install instead of a wall of compiler errors.
bin/.deps-ok: tools/check-deps.sh tools/install-deps.sh tools/packages.txt
	@sh tools/check-deps.sh
	@mkdir -p bin && touch $@

bin/gen/migrations_gen.c: $(MIGRATIONS) tools/embed-migrations.sh | bin/.deps-ok
	@mkdir -p $(@D)
	sh tools/embed-migrations.sh $(MIGRATIONS) > $@.tmp && mv $@.tmp $@

bin/obj/%.o: relay/%.c $(wildcard relay/*.h) | bin/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -DOUTBOX_RELAY_VERSION='"$(VERSION)"' -c $< -o $@

bin/obj/migrations_gen.o: bin/gen/migrations_gen.c
	$(CC) $(BASE_CFLAGS) $(CFLAGS) -c $< -o $@

bin/asan/obj/%.o: relay/%.c $(wildcard relay/*.h) | bin/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $(SAN_FLAGS) -DOUTBOX_RELAY_VERSION='"$(VERSION)"' -c $< -o $@

bin/asan/obj/migrations_gen.o: bin/gen/migrations_gen.c
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $(SAN_FLAGS) -c $< -o $@

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

DEMO_HDR := $(wildcard demo-common/*.h producer-demo/*.h consumer-demo/*.h) relay/log.h relay/backoff.h relay/secrets.h relay/optval.h

bin/obj/demo/%.o: %.c $(DEMO_HDR) | bin/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(BASE_CFLAGS) $(DEMO_CFLAGS) -I$(<D) $(CFLAGS) -DOUTBOX_RELAY_VERSION='"$(VERSION)"' -c $< -o $@

bin/asan/obj/demo/%.o: %.c $(DEMO_HDR) | bin/.deps-ok
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
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $< $(DEP_LIBS) -o $@

tools: $(TOOL_BIN)

# Unit tests (cmocka) link the relay's modules, built with the sanitizers.
bin/asan/test_%: tests/unit/test_%.c $(ASAN_LIB_OBJ)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $(SAN_FLAGS) $^ $(DEP_LIBS) -lcmocka -o $@

unit: $(UNIT_BIN)

test: bin/outbox-relay bin/asan/outbox-relay $(TOOL_BIN) $(UNIT_BIN) $(DEMO_UNIT_BIN) \
      $(DEMO_BIN) $(DEMO_ASAN_BIN)
	@sh tests/run.sh

# Mutation testing: each deliberate bug of tests/mutants/ is applied to a scratch copy, built,
# and must be caught by the tests its patch names (tests/mutate.sh, docs/mutation.md). Not run
# by CI; takes about as long as the tests it runs.
mutate:
	@bash tests/mutate.sh

# The benchmark: throughput, latency, producer cost and memory of the non-sanitizer build, on a
# throwaway PostgreSQL and the project's broker. Sizes and durations: see bench/bench.sh.
bin/naive-relay: bench/naive_relay.c | bin/.deps-ok
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $< $(DEP_LIBS) -o $@

bench: bin/outbox-relay $(TOOL_BIN) bin/naive-relay
	@bash bench/bench.sh

# The demos' Redis fast path against PostgreSQL alone (bench/redis_bench.sh, not in make test).
bin/http-replay: bench/http_replay.c | bin/.deps-ok
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $< -lpthread -o $@

bench-redis: bin/outbox-relay $(DEMO_BIN) $(TOOL_BIN) bin/http-replay
	@bash bench/redis_bench.sh

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

FORMAT_SRC = relay/*.[ch] demo-common/*.[ch] producer-demo/*.[ch] consumer-demo/*.[ch] \
             tests/unit/*.c tests/tools/*.c

format:
	clang-format -i $(FORMAT_SRC) bench/*.c

format-check:
	clang-format --dry-run --Werror $(FORMAT_SRC) bench/*.c

clean:
	rm -rf bin
