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
PKGS     := libpq rdkafka jansson libmicrohttpd avro-c libcurl
# Debian's libev-dev ships no pkg-config file, so it is linked by name. -pthread: the relay's
# host name lookups run on threads of their own (relay/io/resolve.c).
DEP_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
DEP_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -lev -lm -pthread
# Unused parameters are the norm in callbacks whose signatures libev, libpq, librdkafka and
# cmocka impose; everything else of -Wall -Wextra stays on (and CI adds -Werror). The option
# tables (lib/opts.h) name their fields, so the fields they leave out are zero without a warning.
WARN     := -Wall -Wextra -Wshadow -Wformat=2 -Wno-unused-parameter
CFLAGS   ?= -O2 -g
# The floors of the code (docs/architecture.md#floors): lib/ is shared by the relay and the demos;
# the relay is relay/ (main, configuration) over relay/outbox, relay/io, relay/engine (the cycle),
# relay/service (metrics, ops, readiness, reload, sdnotify, upkeep) and relay/cmd. Headers are included by bare name; tools/check-floors.sh checks who includes whom.
RELAY_DIRS := relay relay/outbox relay/io relay/engine relay/service relay/cmd
INCLUDES := -Ilib $(addprefix -I,$(RELAY_DIRS)) -Ibin/gen
# -MMD -MP: each object's compiler writes the headers it read into a .d file beside it (included
# at the end of this file), so touching a header rebuilds exactly the objects that include it.
# Where libpq looks for pg_service.conf when PGSYSCONFDIR is unset: lib/db.c reads the same file
# (db_service_value) to check what a service sets.
PG_SYSCONFDIR := $(shell pg_config --sysconfdir 2>/dev/null)
BASE_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) $(DEP_CFLAGS) -MMD -MP \
               $(if $(PG_SYSCONFDIR),-DPG_SYSCONFDIR='"$(PG_SYSCONFDIR)"')
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

VERSION  := $(shell cat VERSION 2>/dev/null || echo 0.0.0)

# lib/rcache.c (the demos' Redis client) is lib/ for the demos only: the relay does not link
# hiredis. lib/conndeadline.c (request deadlines for a thread-per-connection server) is the
# demos' too: the relay's metrics port keeps its deadlines on its event loop. lib/sha256.c (the
# demos' request fingerprints and payload digests) has no use in the relay.
DEMO_ONLY_SRC := lib/rcache.c lib/conndeadline.c lib/sha256.c
SHARED_SRC := $(filter-out $(DEMO_ONLY_SRC),$(wildcard lib/*.c))
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
DEMO_LIBS   := $(shell pkg-config --libs libmicrohttpd hiredis 2>/dev/null) -lpthread
PRODUCER_SRC := $(wildcard producer-demo/*.c) $(DEMO_ONLY_SRC)
CONSUMER_SRC := $(wildcard consumer-demo/*.c) $(DEMO_ONLY_SRC)
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

.PHONY: all asan tools test test-ready unit deps check-deps format format-check clean quickstart demos demo bench bench-multidb \
        bench-redis fresh-test mutate check-floors compose-test docs-cycle

all: bin/outbox-relay $(DEMO_BIN)

# Fail early with the package to install instead of a wall of compiler errors.
bin/.deps-ok: tools/check-deps.sh tools/install-deps.sh tools/packages.txt
	@sh tools/check-deps.sh
	@mkdir -p bin && touch $@

bin/gen/migrations_gen.c: $(MIGRATIONS) tools/embed-migrations.sh | bin/.deps-ok
	@mkdir -p $(@D)
	sh tools/embed-migrations.sh $(MIGRATIONS) > $@.tmp && mv $@.tmp $@

# ---- objects: one template for every variant ------------------------------------------------
# An object's flags are BASE_CFLAGS, then those of its kind of source (by where the source is),
# then those of its variant. Each variant (normal, sanitizer, fuzz) is one line below that names
# its object directory, its compiler and its flags; the rules are written once, here. -MMD -MP
# (BASE_CFLAGS) puts each object's .d beside it in every variant, and the last line of this file
# includes them all.
VERSION_DEF := -DOUTBOX_RELAY_VERSION='"$(VERSION)"'
src_flags = $(strip \
    $(if $(filter relay/%,$<),$(INCLUDES) $(VERSION_DEF), \
    $(if $(filter bin/gen/%,$<),$(INCLUDES), \
    $(if $(filter producer-demo/% consumer-demo/% $(DEMO_ONLY_SRC),$<),$(DEMO_CFLAGS) -I$(<D) $(VERSION_DEF), \
    -Ilib))))

# $(call variant_rules,OBJDIR,CC variable,flags variable): OBJDIR/x/y.o from x/y.c, and
# OBJDIR/name.o from the generated bin/gen/name.c.
define variant_rules
$(1)/%.o: %.c | bin/.deps-ok
	@mkdir -p $$(@D)
	$$($(2)) $$(BASE_CFLAGS) $$(src_flags) $$($(3)) -c $$< -o $$@

$(1)/%.o: bin/gen/%.c | bin/.deps-ok
	@mkdir -p $$(@D)
	$$($(2)) $$(BASE_CFLAGS) $$(src_flags) $$($(3)) -c $$< -o $$@
endef

NORMAL_FLAGS = $(CFLAGS)
# OUTBOX_TEST_KNOBS: the test-only settings (docs/development.md, "Test-only knobs") exist in the
# sanitizer build the tests run, never in the build that is installed or packaged.
ASAN_FLAGS   = $(CFLAGS) $(SAN_FLAGS) -DOUTBOX_TEST_KNOBS
$(eval $(call variant_rules,bin/obj,CC,NORMAL_FLAGS))
$(eval $(call variant_rules,bin/asan/obj,CC,ASAN_FLAGS))
# The fuzz variant (bin/fuzz/obj, FUZZ_CC, FUZZ_OBJ_FLAGS) is stated with the fuzzers, below.

bin/outbox-relay: $(OBJ)
	$(CC) $(CFLAGS) $^ $(DEP_LIBS) -o $@

bin/asan/outbox-relay: $(ASAN_OBJ)
	$(CC) $(CFLAGS) $(SAN_FLAGS) $^ $(DEP_LIBS) -o $@

asan: bin/asan/outbox-relay $(DEMO_ASAN_BIN)

# ---- demos ----------------------------------------------------------------------------------

bin/gen/%_schema.c: %-demo/schema.sql tools/embed-text.sh | bin/.deps-ok
	@mkdir -p $(@D)
	sh tools/embed-text.sh $*_schema_sql $< > $@.tmp && mv $@.tmp $@

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
	$(CC) $(BASE_CFLAGS) $(DEMO_CFLAGS) -Iproducer-demo -Iconsumer-demo $(CFLAGS) $(SAN_FLAGS) $(filter %.c %.o,$^) $(DEP_LIBS) $(DEMO_LIBS) -lcmocka -o $@

# Test tools: the mock Kafka broker and a real consumer, both on librdkafka.
bin/%: tests/tools/%.c | bin/.deps-ok
	$(CC) $(BASE_CFLAGS) $(INCLUDES) $(CFLAGS) $< $(DEP_LIBS) -o $@

tools: $(TOOL_BIN)

# Unit tests (cmocka) link the relay's modules, built with the sanitizers.
bin/asan/test_%: tests/unit/test_%.c $(ASAN_LIB_OBJ)
	$(CC) $(BASE_CFLAGS) $(INCLUDES) $(CFLAGS) $(SAN_FLAGS) $(filter %.c %.o,$^) $(DEP_LIBS) -lcmocka -o $@

unit: $(UNIT_BIN) $(DEMO_UNIT_BIN)

# The engine's unit test (tests/unit/test_engine.c) links the engine with stand-ins for the
# PostgreSQL connection and the Kafka producer (tests/unit/fake_*.c) in place of relay/io's; the
# classification of producer errors (relay/io/kafka_errors.c) is the relay's own.
ENGINE_FAKE_SRC := tests/unit/fake_pg.c tests/unit/fake_kafka.c
ENGINE_TEST_OBJ := $(filter-out %/relay/io/pg.o %/relay/io/pg_request.o %/relay/io/kafka.o,$(ASAN_LIB_OBJ))
bin/asan/test_engine: tests/unit/test_engine.c $(ENGINE_FAKE_SRC) $(ENGINE_TEST_OBJ) \
                      tests/unit/fake_pg.h tests/unit/fake_kafka.h
	$(CC) $(BASE_CFLAGS) $(INCLUDES) -Itests/unit $(CFLAGS) $(SAN_FLAGS) $(filter %.c %.o,$^) $(DEP_LIBS) -lcmocka -o $@
# The upkeep session's (tests/unit/test_upkeep.c) over the same stand-ins.
bin/asan/test_upkeep: tests/unit/test_upkeep.c $(ENGINE_FAKE_SRC) $(ENGINE_TEST_OBJ) \
                      tests/unit/fake_pg.h tests/unit/fake_kafka.h
	$(CC) $(BASE_CFLAGS) $(INCLUDES) -Itests/unit $(CFLAGS) $(SAN_FLAGS) $(filter %.c %.o,$^) $(DEP_LIBS) -lcmocka -o $@


# Everything `make test` builds, built (the fuzzers join below), and everything it calls, here:
# the [build] and [test] packages of tools/packages.txt with their files, and the commands of
# tools/test-commands.txt, which must name every command the tests call that a minbase Debian
# lacks (tools/check-test-commands.sh). CI runs it in a fresh chroot after `make quickstart`,
# which proves `make test`'s install without its 15 minutes; `make test` runs it first.
test-ready: bin/outbox-relay bin/asan/outbox-relay $(TOOL_BIN) $(UNIT_BIN) $(DEMO_UNIT_BIN) \
            $(DEMO_BIN) $(DEMO_ASAN_BIN)
	@sh tools/install-deps.sh --report build test
	@bash tools/check-test-commands.sh

# `make test GROUP=faults` runs one group of the tests only (`unit`, or a directory of tests/it/:
# tests/it/README.md), `make test TESTS="98_schema 97_cloud"` the tests whose names contain one of
# the words (tests/run.sh NAME...); the build and checks before them are the same.
test: test-ready
	@sh tools/check-floors.sh
	@sh tools/check-mutants.sh
	@sh tools/check-driver.sh
	@sh tools/gen-cycle.sh | cmp -s - docs/session-cycle.md || \
		{ echo "docs/session-cycle.md differs from the driver's table: run make docs-cycle" >&2; exit 1; }
	@sh tests/run.sh $(if $(GROUP),--group $(GROUP)) $(TESTS)

# The session cycle's drawing, written from the driver's table (relay/engine/session.c).
docs-cycle:
	sh tools/gen-cycle.sh > docs/session-cycle.md.tmp && mv docs/session-cycle.md.tmp docs/session-cycle.md

# Who may include whom (docs/architecture.md#floors); also the first step of `make test`.
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

bench: bin/outbox-relay $(TOOL_BIN) bin/naive-relay bin/outbox-load
	@bash bench/bench.sh

# One relay serving many databases against one database at the same rate (also a part of bench).
# bin/outbox-load is its producer: one process pacing inserts into all the databases.
bin/outbox-load: bench/outbox_load.c | bin/.deps-ok
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $< $(shell pkg-config --libs libpq) -lm -o $@

bench-multidb: bin/outbox-relay $(TOOL_BIN) bin/outbox-load
	@bash bench/multidb.sh

# The demos' Redis fast path against PostgreSQL alone (bench/redis_bench.sh, not in make test).
bin/http-replay: bench/http_replay.c | bin/.deps-ok
	$(CC) $(BASE_CFLAGS) $(CFLAGS) $< -lpthread -o $@

bench-redis: bin/outbox-relay $(DEMO_BIN) $(TOOL_BIN) bin/http-replay
	@bash bench/redis_bench.sh

# The relay end to end on a throwaway PostgreSQL and the project's broker.
quickstart: bin/outbox-relay $(TOOL_BIN)
	@bash scripts/quickstart.sh

# Installs the packages of tools/packages.txt the machine lacks (as root, or with sudo): `make deps`
# what building and `make test` need; `make deps-package` the Debian packaging toolchain and the
# checkers of the shipped files (~150 packages, a Prometheus server among them: the [package]
# section says why), which only `make package`, `make package-test` and CI need. Both wait up to
# APT_LOCK_TIMEOUT seconds (default 300) for another apt or dpkg to finish.
.PHONY: deps-package
deps:
	sh tools/install-deps.sh build test

deps-package:
	sh tools/install-deps.sh package

# The quick start proven on a fresh Debian 12: a debootstrap minbase chroot with only make and git
# added, this commit cloned into it, `make $(FRESH_CMD)` as its first command (root only; CI runs
# it). FRESH_CMD=test runs the whole suite there instead (with TESTS="...": those tests only).
FRESH_CMD ?= quickstart
fresh-test:
	@bash tools/fresh-chroot.sh $(FRESH_CMD) $(if $(TESTS),"TESTS=$(TESTS)")

# docker-compose.yml brought up for real on a private Docker engine, with the two unpullable
# images swapped (tests/compose/). Root only; not part of `make test` (it needs dockerd and
# the [compose] packages, docker.io being large): CI runs it as a step of its own. The
# packages are installed here rather than at parse time, so `make test` never installs them.
# After a time-out, the test gets two minutes to remove what it made before it is killed.
compose-test:
	@sh tools/install-deps.sh --auto compose
	@timeout -k 120 900 bash tests/compose/compose_up.sh

FORMAT_SRC = lib/*.[ch] $(addsuffix /*.[ch],$(RELAY_DIRS)) producer-demo/*.[ch] consumer-demo/*.[ch] \
             tests/unit/*.c tests/tools/*.c tests/compose/*.c

format:
	clang-format -i $(FORMAT_SRC) bench/*.c

format-check:
	clang-format --dry-run --Werror $(FORMAT_SRC) bench/*.c

clean:
	rm -rf bin

# ---- install, man pages, systemd unit, Debian package, dashboards ----------------------------
# One block of new targets (docs/packaging.md). `make install` copies the three programs, their
# man pages, the systemd unit and the example configuration; DESTDIR stages it (packaging), and
# `make uninstall` removes what install put there (the configuration only while unchanged).
# Also installed: the Prometheus alerting rules and the Grafana dashboard (DATADIR).
# The Debian package (debian/rules) calls these same targets with PREFIX=/usr.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
MANDIR     ?= $(PREFIX)/share/man
DATADIR    ?= $(PREFIX)/share/outbox-relay
# /etc also under /usr/local: systemd and operators look there; `make install SYSCONFDIR=...`
SYSCONFDIR ?= /etc
# systemd reads units from /usr/local/lib/systemd/system too; Debian 12 keeps them in /lib.
UNITDIR    ?= $(PREFIX)/lib/systemd/system
INSTALL    ?= install

MAN_PAGES := bin/man/outbox-relay.1 bin/man/producer-demo.1 bin/man/consumer-demo.1
# man/NAME.in are generated from docs/configuration.md and docs/guarantees.md by `make docs` and
# committed, so building the package needs no Python (docs/development.md, "Documents"); the
# build fills in the date and version as tools/gen-man.sh does for section 1.
DOC_PAGES := bin/man/outbox-relay.conf.5 bin/man/outbox-relay-guarantees.7
MAN_DATE = $(shell if [ -n "$$SOURCE_DATE_EPOCH" ]; then date -u -d "@$$SOURCE_DATE_EPOCH" +%Y-%m-%d; \
    else git log -1 --format=%cs 2>/dev/null | grep . || date -u +%Y-%m-%d; fi)
bin/man/%.5: man/%.5.in VERSION
	@mkdir -p $(@D)
	sed -e 's/@DATE@/$(MAN_DATE)/g' -e 's/@VERSION@/$(VERSION)/g' $< > $@
bin/man/%.7: man/%.7.in VERSION
	@mkdir -p $(@D)
	sed -e 's/@DATE@/$(MAN_DATE)/g' -e 's/@VERSION@/$(VERSION)/g' $< > $@

.PHONY: man man-check install install-relay install-demos uninstall unit-check package docs docs-check \
        package-test package-fresh monitoring-check

# Each page: the hand-written prose of man/NAME.1.in around the sections the program prints
# from its own option table (--help-man), so the page and --help cannot drift apart.
bin/man/%.1: bin/% man/%.1.in tools/gen-man.sh VERSION
	@mkdir -p $(@D)
	sh tools/gen-man.sh $< man/$*.1.in "$(VERSION)" > $@.tmp && mv $@.tmp $@

man: $(MAN_PAGES) $(DOC_PAGES)

# groff with every warning on must stay silent, man must render each page, and every option of
# --help must be in the page (tools/man-check.sh).
man-check: $(MAN_PAGES) $(DOC_PAGES)
	@sh tools/man-check.sh $(MAN_PAGES)
	@for p in $(DOC_PAGES); do groff -man -ww -z $$p 2>&1 | grep . && exit 1; \
	    MANWIDTH=80 man --warnings -E UTF-8 -l $$p 2>&1 >/dev/null | grep . && exit 1; \
	    echo "man-check: $$p: groff -ww silent, man -l renders"; done; true

# The documents' generated parts (the option and metric references, the schema objects, the
# section 5 and 7 pages) from the code: `make docs` rewrites them, `make docs-check` (part of
# `make test`) fails when one differs or a quoted log line, option, name or link does not exist.
# systemd/relay.json, the sample configuration the package installs, is --help-config's output:
# written with the documents, and checked with them, so an option's new help cannot leave it stale.
docs: bin/outbox-relay docs-cycle
	python3 tools/docs.py gen
	bin/outbox-relay --help-config >systemd/relay.json

docs-check: bin/outbox-relay $(DEMO_BIN)
	@python3 tools/docs.py check
	@bin/outbox-relay --help-config | cmp -s - systemd/relay.json || \
	    { echo "docs-check: systemd/relay.json differs from --help-config: run \`make docs\` (and commit)"; exit 1; }

test-ready: docs-check

# The unit names the installed binary and configuration: written at install time, for the
# BINDIR and SYSCONFDIR of that install.
UNIT_SED = sed -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g'

# systemd-analyze verify wants the binary at the ExecStart path: check a unit generated for bin/.
unit-check: bin/outbox-relay bin/man/outbox-relay.1
	@sh tools/unit-check.sh

install-relay: bin/outbox-relay bin/man/outbox-relay.1 $(DOC_PAGES)
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 \
	    $(DESTDIR)$(MANDIR)/man7 $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/outbox-relay $(DESTDIR)$(DATADIR)
	$(INSTALL) -m 755 bin/outbox-relay $(DESTDIR)$(BINDIR)/outbox-relay
	$(INSTALL) -m 644 bin/man/outbox-relay.1 $(DESTDIR)$(MANDIR)/man1/outbox-relay.1
	$(INSTALL) -m 644 bin/man/outbox-relay.conf.5 $(DESTDIR)$(MANDIR)/man5/outbox-relay.conf.5
	$(INSTALL) -m 644 bin/man/outbox-relay-guarantees.7 $(DESTDIR)$(MANDIR)/man7/outbox-relay-guarantees.7
	$(UNIT_SED) systemd/outbox-relay.service.in > $(DESTDIR)$(UNITDIR)/outbox-relay.service
	@# The template outbox-relay@NAME (NAME.json, NAME.database-url): several relays on one host.
	$(UNIT_SED) systemd/outbox-relay.service.in | sed -f systemd/template.sed \
	    > $(DESTDIR)$(UNITDIR)/outbox-relay@.service
	chmod 644 $(DESTDIR)$(UNITDIR)/outbox-relay.service $(DESTDIR)$(UNITDIR)/outbox-relay@.service
	@# The Prometheus alerting rules and the Grafana dashboard, for the monitoring hosts to take.
	$(INSTALL) -m 644 monitoring/outbox-relay.rules.yml monitoring/outbox-relay.dashboard.json \
	    $(DESTDIR)$(DATADIR)/
	@# An operator's edited configuration is never overwritten.
	[ -e $(DESTDIR)$(SYSCONFDIR)/outbox-relay/relay.json ] || \
	    $(INSTALL) -m 644 systemd/relay.json $(DESTDIR)$(SYSCONFDIR)/outbox-relay/relay.json
	@# The unit loads it as a credential (it must exist); root-only, for the Kafka secrets.
	[ -e $(DESTDIR)$(SYSCONFDIR)/outbox-relay/kafka.properties ] || \
	    $(INSTALL) -m 600 systemd/kafka.properties $(DESTDIR)$(SYSCONFDIR)/outbox-relay/kafka.properties

install-demos: $(DEMO_BIN) bin/man/producer-demo.1 bin/man/consumer-demo.1
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1
	$(INSTALL) -m 755 $(DEMO_BIN) $(DESTDIR)$(BINDIR)/
	$(INSTALL) -m 644 bin/man/producer-demo.1 bin/man/consumer-demo.1 $(DESTDIR)$(MANDIR)/man1/

install: install-relay install-demos

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/outbox-relay $(DESTDIR)$(BINDIR)/producer-demo \
	    $(DESTDIR)$(BINDIR)/consumer-demo $(DESTDIR)$(UNITDIR)/outbox-relay.service \
	    $(DESTDIR)$(UNITDIR)/outbox-relay@.service \
	    $(addprefix $(DESTDIR)$(MANDIR)/man1/,outbox-relay.1 producer-demo.1 consumer-demo.1) \
	    $(DESTDIR)$(MANDIR)/man5/outbox-relay.conf.5 $(DESTDIR)$(MANDIR)/man7/outbox-relay-guarantees.7 \
	    $(addprefix $(DESTDIR)$(DATADIR)/,outbox-relay.rules.yml outbox-relay.dashboard.json)
	rmdir $(DESTDIR)$(DATADIR) 2>/dev/null || true
	@# The configuration goes only as installed; an edited one stays, and so does the secret
	@# the operator put beside it (database-url).
	! cmp -s systemd/kafka.properties $(DESTDIR)$(SYSCONFDIR)/outbox-relay/kafka.properties || \
	    rm -f $(DESTDIR)$(SYSCONFDIR)/outbox-relay/kafka.properties
	if cmp -s systemd/relay.json $(DESTDIR)$(SYSCONFDIR)/outbox-relay/relay.json; then \
	    rm -f $(DESTDIR)$(SYSCONFDIR)/outbox-relay/relay.json; \
	    rmdir $(DESTDIR)$(SYSCONFDIR)/outbox-relay 2>/dev/null || true; \
	else [ ! -e $(DESTDIR)$(SYSCONFDIR)/outbox-relay/relay.json ] || \
	    echo "uninstall: kept $(DESTDIR)$(SYSCONFDIR)/outbox-relay/relay.json (changed since install)"; fi

# outbox-relay_VERSION_ARCH.deb in bin/deb/, built from a copy of the tree (dpkg-buildpackage
# cleans the tree it builds in, which would take bin/ of this one with it).
package:
	@bash tools/deb-build.sh

# What CI runs as root: the package built, checked by lintian, installed with dpkg -i, and one
# delivery test against the installed /usr/bin/outbox-relay run by its unit's command line.
package-test: tools
	@bash tools/deb-ci.sh

# The issue's sequence for a clean Debian 12, literally: `make deps deps-package && dpkg-buildpackage -us -uc -b
# && dpkg -i ../outbox-relay_*.deb`, then `outbox-relay --version` and the delivery test against
# the installed binary. `make fresh-test FRESH_CMD=package-fresh` runs it as the first command in
# a minbase chroot (root; by hand, see docs/packaging.md for its duration). It builds in this
# tree (dpkg-buildpackage cleans bin/ first) and leaves the package installed: for a throwaway
# machine.
package-fresh:
	$(MAKE) deps deps-package
	dpkg-buildpackage -us -uc -b
	dpkg -i ../outbox-relay_$(VERSION)_*.deb
	outbox-relay --version
	$(MAKE) tools
	bash tests/pkg/installed_delivery.sh

# Prometheus alerting rules: syntax (promtool check rules) and each rule's unit test.
monitoring-check:
	@sh tools/monitoring-check.sh

# ---- fuzzing (issue 20; tests/fuzz/README.md) -----------------------------------------------
# libFuzzer harnesses for every parser of untrusted or semi-trusted input, built with clang and
# ASan + UBSan. `make fuzzers` builds them; `make test` runs each for a few seconds over its
# committed seeds and regression inputs (tests/it/security/96_fuzz_short.sh); `make fuzz` runs each for
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
FUZZ_PRODUCER_OBJ := $(call objs,bin/fuzz/obj,$(SHARED_SRC) producer-demo/order.c producer-demo/idem.c \
                                    lib/sha256.c)
FUZZ_CONSUMER_OBJ := $(call objs,bin/fuzz/obj,$(SHARED_SRC) consumer-demo/event.c lib/sha256.c)
FUZZ_SECONDS  ?= 600
FUZZ_PARALLEL ?= 1

.PHONY: fuzzers fuzz
fuzzers: $(FUZZ_BIN)

FUZZ_OBJ_FLAGS = $(FUZZ_CFLAGS) $(FUZZ_SAN) -fsanitize=fuzzer-no-link
$(eval $(call variant_rules,bin/fuzz/obj,FUZZ_CC,FUZZ_OBJ_FLAGS))

# fuzz_serializer: the Schema Registry encodings (relay/io/serializer.c, which calls the registry).
FUZZ_SERIALIZER_OBJ := $(FUZZ_RELAY_OBJ) $(call objs,bin/fuzz/obj,relay/io/serializer.c relay/io/registry.c \
                       relay/io/resolve.c)
bin/fuzz/fuzz_serializer: FUZZ_LINK = $(FUZZ_SERIALIZER_OBJ)
bin/fuzz/fuzz_serializer: $(FUZZ_SERIALIZER_OBJ)
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

test-ready: $(FUZZ_BIN)
FORMAT_SRC += tests/fuzz/*.c

# The header dependencies the compiler wrote (-MMD -MP, BASE_CFLAGS); absent before a first build.
-include $(shell find bin -name '*.d' 2>/dev/null)
