# outbox-relay build. `make` builds bin/outbox-relay; `make test` builds the normal and the
# sanitizer (ASan + UBSan) variants and runs every test against the sanitizer build; `make bench`
# runs the benchmark (bench/bench.sh, not part of `make test`) against the normal build.

CC       ?= cc
PKGS     := libpq rdkafka jansson
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

.PHONY: all asan tools test unit bench deps check-deps format format-check clean quickstart

all: bin/outbox-relay

# Fail early with the package to install instead of a wall of compiler errors.
bin/.deps-ok: tools/check-deps.sh
	@CC="$(CC)" sh tools/check-deps.sh
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

asan: bin/asan/outbox-relay

# Test tools: the mock Kafka broker and a real consumer, both on librdkafka.
bin/%: tests/tools/%.c | bin/.deps-ok
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $< $(DEP_LIBS) -o $@

tools: $(TOOL_BIN)

# Unit tests (cmocka) link the relay's modules, built with the sanitizers.
bin/asan/test_%: tests/unit/test_%.c $(ASAN_LIB_OBJ)
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $(SAN_FLAGS) $^ $(DEP_LIBS) -lcmocka -o $@

unit: $(UNIT_BIN)

test: bin/outbox-relay bin/asan/outbox-relay $(TOOL_BIN) $(UNIT_BIN)
	@sh tests/run.sh

# The benchmark: throughput, latency, producer cost and memory of the non-sanitizer build, on a
# throwaway PostgreSQL and the project's broker. Sizes and durations: see bench/bench.sh.
bin/naive-relay: bench/naive_relay.c | bin/.deps-ok
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $< $(DEP_LIBS) -o $@

bench: bin/outbox-relay $(TOOL_BIN) bin/naive-relay
	@bash bench/bench.sh

# The relay end to end on a throwaway PostgreSQL and the project's broker.
quickstart: bin/outbox-relay $(TOOL_BIN)
	@bash scripts/quickstart.sh

deps:
	sh tools/install-deps.sh

format:
	clang-format -i relay/*.[ch] tests/unit/*.c tests/tools/*.c bench/*.c

format-check:
	clang-format --dry-run --Werror relay/*.[ch] tests/unit/*.c tests/tools/*.c bench/*.c

clean:
	rm -rf bin
