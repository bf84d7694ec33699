/* relay: the process (relay.h, engine.h). */
#include "relay.h"

#include <signal.h>
#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "log.h"
#include "monotime.h"

static void relay_stop(Relay *r);

void relay_fail(Relay *r)
{
    r->exit_status = 1;
    relay_stop(r);
}

int relay_in_flight(const Relay *r)
{
    int n = 0;
    for (int i = 0; i < r->n_sessions; i++)
        n += r->sessions[i].batch.in_flight;
    return n;
}

/* Sessions paused for room in the producer's queue or for the Schema Registry go on. */
static void resume_waiting(Relay *r)
{
    for (int i = 0; i < r->n_sessions && !r->purging; i++) {
        Session *other = &r->sessions[i];
        if (other->waiting && other->phase == PHASE_PRODUCING)
            session_event(other, EVENT_PRODUCER_ROOM);
    }
}

/* The serializer's schema arrived, or its registry may be back: paused sessions try again. */
static void on_serializer_ready(void *arg)
{
    relay_enter(arg);
    resume_waiting(arg);
}

/* Every session looks at the lane group at its next step between batches: the relay's away
 * state changed. Flags only, no session_step: this runs inside a session's step or report. */
static void look_at_lanes(Relay *r)
{
    for (int i = 0; i < r->n_sessions; i++) {
        r->sessions[i].rebalance_due = true;
        r->sessions[i].wake_pending = true;
    }
}

/* An acknowledgement: Kafka answers this relay, which is away no more (its sessions take their
 * share again at their next look) and starts any later streak from nothing. */
static void kafka_answers(Relay *r)
{
    r->kafka_timeouts = 0;
    backoff_reset(&r->away_backoff);
    bool was_trial = r->away_trial;
    r->away_trial = false;
    if (!r->kafka_away && !was_trial)
        return;
    ev_timer_stop(r->loop, &r->away_timer);
    log_info("kafka answers again: the relay keeps its share of the lanes", NULL);
    r->kafka_away = false;
    look_at_lanes(r); /* its mark goes */
}

LaneMark relay_lane_mark(const Relay *r)
{
    return r->kafka_away ? LANE_MARK_AWAY : r->away_trial ? LANE_MARK_TRYING : LANE_MARK_NONE;
}

void relay_kafka_timed_out(Relay *r)
{
    long after = r->cfg->kafka_away_after;
    r->kafka_timeouts++;
    if (r->kafka_away || after == 0 || (!r->away_trial && r->kafka_timeouts < after))
        return;
    r->kafka_away = true;
    r->away_trial = false;
    double retry = backoff_next(&r->away_backoff);
    log_warn("kafka unreachable from this relay: its lanes go to the other relays that reach it, "
             "if any",
             "timeouts=%d retry_in_s=%.1f", r->kafka_timeouts, retry);
    ev_timer_stop(r->loop, &r->away_timer);
    ev_timer_set(&r->away_timer, retry, 0.0);
    ev_timer_start(r->loop, &r->away_timer);
    look_at_lanes(r);
}

/* The away relay's backoff is over. One that gave its lanes up (others reach Kafka) takes its
 * share back to try: nothing else tells it Kafka answers again, as it produces nothing; one more
 * timeout sends it away for longer (relay_kafka_timed_out). One that kept its lanes (no member
 * reaches Kafka) needs no trial: its own batches tell. Nor does its wait grow meanwhile: only a
 * failed trial lengthens it. Grown for as long as the outage for everyone lasted (up to 10 min),
 * it kept the relay that lost the race to the first acknowledgement after that outage out of
 * the group for as long again, though its Kafka answered too, while the backlog waited on fewer
 * relays. */
static void on_away_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    relay_enter(r);
    if (!r->kafka_away || r->stopping)
        return;
    if (relay_lanes_owned(r) > 0) {
        backoff_reset(&r->away_backoff);
        ev_timer_set(w, backoff_next(&r->away_backoff), 0.0);
        ev_timer_start(loop, w);
        return;
    }
    log_info("trying kafka again: the relay takes its share of the lanes back", NULL);
    r->kafka_away = false;
    r->away_trial = true;
    for (int i = 0; i < r->n_sessions; i++)
        session_event(&r->sessions[i], EVENT_REBALANCE_DUE);
}

static void on_delivery(void *opaque, rd_kafka_resp_err_t err, void *arg)
{
    Relay *r = arg;
    relay_enter(r);
    BatchRow *br = opaque;
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR && r->recreate_after > 0) {
        backoff_reset(&r->recreate); /* this producer works: a later fatal error is a new one */
        r->recreate_after = 0;
    }
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
        kafka_answers(r);
    SessionEvent report = {.kind = EVENT_REPORT, .row = br, .err = err};
    r->in_report = true;
    session_step(br->owner, &report);
    if (r->purging && relay_in_flight(r) == 0) {
        r->purging = false;
        ev_timer_stop(r->loop, &r->purge_timer);
    }
    resume_waiting(r);
    r->in_report = false;
}

static void on_room_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    relay_enter(r);
    resume_waiting(r);
}

void relay_waiter_failed(Relay *r)
{
    for (int i = 0; i < r->n_sessions; i++)
        if (wakeup_notified(&r->sessions[i].wake, GUARD_LEFT))
            session_event(&r->sessions[i], EVENT_WAKE);
}

void relay_room_after_report(Relay *r)
{
    if (ev_is_active(&r->room_timer))
        return;
    ev_timer_set(&r->room_timer, 0.0, 0.0);
    ev_timer_start(r->loop, &r->room_timer);
}

bool relay_producer_ready(Relay *r)
{
    if (!kafka_fatal(r->kafka))
        return true;
    /* The producer is shared: recreate it only once every session's batch is done, so every
     * message of the old one has been reported. */
    for (int i = 0; i < r->n_sessions; i++)
        if (r->sessions[i].batch.n > 0)
            return false;
    /* Never from inside one of its own reports: kafka_poll goes on polling it after the report.
     * No path leads here from there today (relay_batch_done defers its wakes to the loop; a
     * session that lets an abandoned batch go rebalances first), and this keeps it so. */
    if (r->in_report)
        return false;
    /* No producer at all: its recreation failed, and the relay is stopping (relay_fail). */
    if (!r->kafka)
        return false;
    /* The last one failed before any message of it was acknowledged (an InitProducerId the
     * cluster refuses, say): the next waits, the caller's retry backoff brings it. */
    ev_tstamp now = monotime_now();
    if (now < r->recreate_after)
        return false;
    /* librdkafka opens the TLS files in rd_kafka_new, here on the loop: one swapped for a FIFO
     * since start-up would stop it. The files are pinned (opened without waiting, each checked
     * regular: kafka_conf_pin_files) before the old producer is touched, so a refusal, at the
     * stat or at the open after it, skips this try with the old producer kept for the next, and
     * the caller's retry backoff brings the next. Not the fatal "cannot recreate" (the relay goes
     * on), and said at error level once per distinct reason, as the file may stay for long and
     * the next try comes every 30 s at most. */
    char err[600];
    rd_kafka_conf_t *conf = rd_kafka_conf_dup(r->kconf_template);
    KafkaPins pins;
    if (!kafka_conf_pin_files(conf, &pins, err, sizeof(err))) {
        rd_kafka_conf_destroy(conf);
        double delay = backoff_next(&r->recreate);
        r->recreate_after = now + delay;
        bool again = strncmp(err, r->recreate_refused, sizeof(r->recreate_refused) - 1) == 0;
        char q[700];
        log_write(again ? LOG_DEBUG : LOG_ERROR, "kafka producer recreation waits",
                  "error=%s retry_in_s=%.2f", log_quote(err, q, sizeof(q)), delay);
        snprintf(r->recreate_refused, sizeof(r->recreate_refused), "%.*s",
                 (int)sizeof(r->recreate_refused) - 1, err);
        return false;
    }
    r->recreate_refused[0] = '\0';
    /* The old one is destroyed off the loop (rd_kafka_destroy may block while its broker threads
     * finish a connection attempt or a name lookup); every report of it is in (above), and none
     * can reach this relay again. One is destroyed at a time: while another (this relay's last,
     * or another database's) still is, the caller's retry backoff brings it back (the files
     * pinned for this try are let go, and pinned anew then). */
    if (!kafka_producer_retire(r->kafka)) {
        kafka_pins_close(&pins);
        rd_kafka_conf_destroy(conf);
        return false;
    }
    r->kafka = NULL;
    r->recreate_after = now + backoff_next(&r->recreate);
    /* What can fail from here is no refused file (a thread or descriptor limit): fatal. */
    r->kafka = kafka_producer_new_pinned(r->loop, conf, &pins, on_delivery, r, err, sizeof(err));
    if (!r->kafka) {
        log_error("cannot recreate the Kafka producer", "error=%s", err);
        relay_fail(r);
        return false;
    }
    log_info("kafka producer recreated", NULL);
    return true;
}

void relay_batch_done(Relay *r)
{
    if (r->stopping || !kafka_fatal(r->kafka))
        return; /* stopping: no session claims again (and the producer may be being freed) */
    for (int i = 0; i < r->n_sessions; i++)
        if (r->sessions[i].batch.n > 0)
            return;
    /* The producer may be recreated now. A session that found it could not be (another's batch
     * was out) waits out its retry backoff, grown with each look meanwhile (up to 30 s): it
     * claims now instead, and its claim recreates the producer: from the loop, by its retry
     * timer set to fire at once, not from here. This runs inside another session's step, and
     * (an abandoned batch's last report, advance) inside the failed producer's own delivery
     * report, which the recreation would free under kafka_poll. */
    for (int i = 0; i < r->n_sessions; i++) {
        Session *s = &r->sessions[i];
        if (!s->producer_wait)
            continue;
        s->producer_wait = false;
        if (s->setup_fault)
            continue; /* its probe keeps the retry backoff: one per batch done would be a pace
                       * set by the other sessions' batches */
        ev_timer_stop(r->loop, &s->retry_timer);
        ev_timer_set(&s->retry_timer, 0.0, 0.0);
        ev_timer_start(r->loop, &s->retry_timer);
    }
}

int relay_lanes_owned(const Relay *r)
{
    int owned = 0;
    for (int i = 0; i < r->n_sessions; i++)
        owned += r->sessions[i].lanes.n_owned;
    return owned;
}

/* Whether o can claim now, were it not resting: connected, with no setup fault (it probes,
 * holding no lanes) and no abandoned batch whose reports are still out (it claims nothing until
 * they are in). */
static bool session_can_claim(const Session *o)
{
    return o->phase != PHASE_DOWN && !o->setup_fault && !o->batch.abandoned;
}

bool relay_session_resting(const Relay *r, const Session *s)
{
    /* The first active_sessions sessions that can claim do: one that cannot (its connection
     * down, a setup fault, an abandoned batch) leaves its place to the next, so a relay never
     * stops claiming while it still has a session that could. Counting such a session, the
     * sessions above it rested while it claimed nothing: a setup fault of session 0 alone kept
     * the whole relay from delivering. */
    int before = 0;
    for (int i = 0; i < s->index; i++)
        if (session_can_claim(&r->sessions[i]))
            before++;
    return before >= r->active_sessions;
}

/* Full claims in a row that bring the resting sessions in. One full claim is only a moment's
 * lag: at 10,000 events/s a stall of a tenth of a second fills a 1,000-row claim, and one
 * session works that off in a few claims (measured: a session that joined for such a stall at
 * the start of a 10,000/s run held the latency at the two sessions' figure for the rest of it).
 * Ten in a row is a backlog of ten batches, which the second session helps to drain. A count,
 * not a time, so that it means the same on any machine. */
#define FULL_CLAIMS_TO_JOIN 10

void relay_batch_claimed(Relay *r, bool full)
{
    if (!full) {
        r->full_claims = 0;
        return;
    }
    r->full_claims++;
    r->backlog_seen_at = monotime_now();
    if (r->full_claims < FULL_CLAIMS_TO_JOIN || r->active_sessions >= r->n_sessions || r->stopping)
        return;
    log_info("claims come back full: every claim session takes part", "sessions=%d was=%d",
             r->n_sessions, r->active_sessions);
    r->active_sessions = r->n_sessions;
    for (int i = 0; i < r->n_sessions; i++) {
        Session *s = &r->sessions[i];
        if (s->lanes.slot >= 0 || s->stopping)
            continue; /* a member already */
        s->wake_pending = true;
        session_event(s, EVENT_REBALANCE_DUE); /* joins the group */
    }
}

/* Sessions above --min-sessions rest once --session-rest-after has passed without a full claim
 * (and with no batch of one still out).
 * On a small host one session's larger batches cost PostgreSQL less per event than two
 * sessions' smaller ones, and that is what latency wants while the relay keeps up (measured:
 * docs/architecture.md#sessions); a backlog wants them all. Joining after FULL_CLAIMS_TO_JOIN full
 * claims and resting only after a long quiet spell keeps lanes from moving back and forth: every
 * change of the group re-divides the lanes of every relay. */
static void on_rest_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    relay_enter(r);
    int min = (int)r->cfg->min_sessions;
    double quiet = (double)r->cfg->session_rest_after_ms / 1000.0;
    /* A batch from a full claim still out (waiting for a slow or unreachable Kafka, say) is a
     * backlog not yet worked off: resting now would only bring the sessions back with the next
     * claim, and move every relay's lanes twice. */
    for (int i = 0; i < r->n_sessions; i++)
        if (r->sessions[i].batch.n > 0 && r->sessions[i].batch_from_full_claim)
            r->backlog_seen_at = monotime_now();
    if (r->active_sessions <= min || r->stopping || monotime_now() - r->backlog_seen_at < quiet)
        return;
    log_info("no full claim for a while: the sessions above --min-sessions rest",
             "sessions=%d was=%d quiet_s=%.0f", min, r->active_sessions, quiet);
    r->active_sessions = min;
    for (int i = 0; i < r->n_sessions; i++)
        if (relay_session_resting(r, &r->sessions[i]))
            session_event(&r->sessions[i], EVENT_LOOK); /* leaves the group between batches */
}

/* A purge reaches only the messages queued or in flight at that moment: one inside a request
 * that was partly written when the purge came is left alone, and when its connection then fails
 * librdkafka puts it back in the partition queue, where (message.timeout.ms=0) nothing ever
 * reports it, and every session would wait on `purging` for ever. So the purge is repeated every
 * second until every report is in. */
#define PURGE_REPEAT_S 1.0

static void on_purge_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    Relay *r = w->data;
    relay_enter(r);
    if (r->purging && r->kafka)
        kafka_purge(r->kafka);
    else
        ev_timer_stop(loop, w);
}

void relay_start_purge(Relay *r)
{
    r->purging = true;
    kafka_purge(r->kafka);
    ev_timer_again(r->loop, &r->purge_timer);
}

static void relay_stop(Relay *r)
{
    r->stopping = true;
    ev_timer_stop(r->loop, &r->rest_timer);
    ev_timer_stop(r->loop, &r->away_timer);
    for (int i = 0; i < r->n_sessions; i++)
        session_event(&r->sessions[i], EVENT_STOP);
}

static void on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    Relay *r = w->data;
    relay_enter(r);
    if (++r->signals > 1) {
        /* Second signal: leave now; the server rolls back the open transactions. */
        static const char msg[] = "level=warn msg=\"second signal, exiting immediately\"\n";
        ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)ignored;
        _exit(128 + w->signum);
    }
    log_info("shutting down", "signal=%s in_flight=%d", strsignal(w->signum), relay_in_flight(r));
    relay_stop(r);
}

/* Relays between relay_create and relay_free: one per database the process serves. */
static int relays_alive;

int relays_in_process(void)
{
    return relays_alive > 1 ? relays_alive : 1;
}

static Relay *relay_create(struct ev_loop *loop, const Config *cfg, rd_kafka_conf_t *kconf,
                           bool signals, char *err, size_t errlen)
{
    Relay *r = calloc(1, sizeof(*r));
    if (r) {
        relays_alive++;
        r->loop = loop;
        r->cfg = cfg;
        r->n_sessions = (int)cfg->sessions;
        r->active_sessions = (int)cfg->min_sessions;
        if (r->active_sessions > r->n_sessions)
            r->active_sessions = r->n_sessions;
        r->logged_owned = -1;
        wakeup_waiter_init(r);
        r->sessions = calloc((size_t)r->n_sessions, sizeof(Session));
    }
    bool ok = r && r->sessions;
    for (int i = 0; ok && i < r->n_sessions; i++)
        ok = session_init(&r->sessions[i], r, i);
    if (!ok) {
        relay_free(r);
        rd_kafka_conf_destroy(kconf);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->serializer = serializer_new(loop, cfg, on_serializer_ready, r, err, errlen);
    if (!r->serializer && *err) {
        relay_free(r);
        rd_kafka_conf_destroy(kconf);
        return NULL;
    }
    kafka_conf_layout_partitioner(kconf, cfg);
    r->kconf_template = rd_kafka_conf_dup(kconf);
    backoff_init(&r->recreate, RETRY_BASE_S, RETRY_CAP_S, 0);
    r->kafka = kafka_producer_new(loop, kconf, on_delivery, r, err, errlen);
    if (!r->kafka) {
        relay_free(r);
        return NULL;
    }
    ev_init(&r->room_timer, on_room_timer);
    r->room_timer.data = r;
    ev_init(&r->purge_timer, on_purge_timer);
    r->purge_timer.repeat = PURGE_REPEAT_S;
    r->purge_timer.data = r;
    /* The first trial of an away relay comes after 2 x --delivery-timeout (its second half
     * random), the later ones after twice as long each, up to ten minutes: a trial that fails
     * holds its share's rows up for one delivery timeout, a smaller part of a longer cut. */
    double away_base = (double)cfg->delivery_timeout_ms / 1000.0 * 2.0;
    backoff_init(&r->away_backoff, away_base, away_base > 600.0 ? away_base : 600.0, 0);
    ev_init(&r->away_timer, on_away_timer);
    r->away_timer.data = r;
    ev_init(&r->rest_timer, on_rest_timer);
    /* A tenth of the quiet spell, within 0.1-1 s: resting comes soon after it is due. */
    double look = (double)cfg->session_rest_after_ms / 10000.0;
    r->rest_timer.repeat = look < 0.1 ? 0.1 : look > 1.0 ? 1.0 : look;
    r->rest_timer.data = r;
    if (r->active_sessions < r->n_sessions)
        ev_timer_again(loop, &r->rest_timer);
    ev_signal_init(&r->sigterm, on_signal, SIGTERM);
    r->sigterm.data = r;
    ev_signal_init(&r->sigint, on_signal, SIGINT);
    r->sigint.data = r;
    if (signals) {
        ev_signal_start(loop, &r->sigterm);
        ev_signal_start(loop, &r->sigint);
    }
    return r;
}

Relay *relay_new(struct ev_loop *loop, const Config *cfg, rd_kafka_conf_t *kconf, char *err,
                 size_t errlen)
{
    return relay_create(loop, cfg, kconf, true, err, errlen);
}

Relay *relay_new_quiet(struct ev_loop *loop, const Config *cfg, rd_kafka_conf_t *kconf, char *err,
                       size_t errlen)
{
    return relay_create(loop, cfg, kconf, false, err, errlen);
}

void relay_set_stopped_hook(Relay *r, RelayStoppedFn fn, void *arg)
{
    r->on_stopped = fn;
    r->on_stopped_arg = arg;
}

void relay_set_database(Relay *r, const char *log_context, MetricsDb *m)
{
    snprintf(r->log_context, sizeof(r->log_context), "%s", log_context ? log_context : "");
    r->metrics = m;
}

void relay_enter(const Relay *r)
{
    log_set_context(r->log_context[0] ? r->log_context : NULL);
    metrics_select(r->metrics);
}

bool relay_session_stopped(Relay *r)
{
    if (--r->running > 0)
        return false;
    if (!r->on_stopped)
        return true;
    r->on_stopped(r, r->on_stopped_arg);
    return false;
}

void relay_drain(Relay *r)
{
    relay_enter(r);
    relay_stop(r);
}

void relay_start(Relay *r)
{
    relay_enter(r);
    r->running = r->n_sessions;
    for (int i = 0; i < r->n_sessions; i++) {
        session_connect(&r->sessions[i]);
    }
}

int relay_run(Relay *r)
{
    relay_start(r);
    ev_run(r->loop, 0);
    return relay_finish(r);
}

int relay_finish(Relay *r)
{
    relay_enter(r);
    unsigned long long sent = 0, failed = 0, dead = 0, copies = 0, breaks = 0;
    for (int i = 0; i < r->n_sessions; i++) {
        sent += r->sessions[i].total_sent;
        failed += r->sessions[i].total_failed;
        dead += r->sessions[i].total_dead;
        copies += r->sessions[i].total_copies;
        breaks += r->sessions[i].order_breaks;
    }
    /* Events (sent=, failed_attempts=): the dead events' copies to the dead-letter topic apart. */
    log_info("stopped",
             "sent=%llu failed_attempts=%llu dead_lettered=%llu dead_letter_published=%llu "
             "order_breaks=%llu",
             sent, failed, dead, copies, breaks);
    return r->exit_status;
}

void relay_status(const Relay *r, RelayStatus *out)
{
    memset(out, 0, sizeof(*out));
    out->postgres_up = true;
    out->kafka_up = r->kafka && kafka_up(r->kafka);
    out->registry_up = relay_registry_up(r);
    out->stopping = r->stopping;
    out->lanes_owned = relay_lanes_owned(r);
    out->kafka_away = (int)relay_lane_mark(r);
    for (int i = 0; i < r->n_sessions; i++) {
        const Session *s = &r->sessions[i];
        out->postgres_up = out->postgres_up && s->pg && pg_conn_up(s->pg);
        /* An old server is a fault of the setup no retry cures: /readyz names it. */
        const char *refused = s->pg ? pg_conn_refused(s->pg) : NULL;
        if (refused && !out->setup_error[0])
            snprintf(out->setup_error, sizeof(out->setup_error), "%s", refused);
        if (s->phase != PHASE_DOWN && s->lanes.slot >= 0 && !s->setup_fault &&
            !relay_session_resting(r, s))
            out->claim_sessions++;
        if (s->setup_fault && !out->setup_error[0])
            snprintf(out->setup_error, sizeof(out->setup_error), "%s", s->setup_error);
        if (s->kafka_fault[0] && !out->setup_error[0])
            snprintf(out->setup_error, sizeof(out->setup_error), "%s", s->kafka_fault);
        if (s->lanes.live_sessions > out->live_sessions)
            out->live_sessions = s->lanes.live_sessions;
        /* Distinct types: each session holds those of its own lanes' batches, and two may hold
         * one (at most --sessions times HOLD_TYPES_MAX compared). */
        for (int t = 0; t < s->hold.n; t++) {
            bool before = false;
            for (int j = 0; j < i && !before; j++)
                for (int k = 0; k < r->sessions[j].hold.n && !before; k++)
                    before = strcmp(r->sessions[j].hold.types[k], s->hold.types[t]) == 0;
            for (int k = 0; k < t && !before; k++)
                before = strcmp(s->hold.types[k], s->hold.types[t]) == 0;
            out->held_aggregate_types += !before;
        }
    }
}

/* The payloads of the sessions' batches a producer being freed may still point into (the
 * results and encoded values of batches still out or given up), freed after it is destroyed. */
typedef struct KeptPayloads {
    int n;
    BatchRetired kept[];
} KeptPayloads;

/* Runs on the thread that destroyed the producer (kafka_producer_free_then): touches nothing but
 * what it was handed. */
static void free_kept_payloads(void *arg)
{
    KeptPayloads *k = arg;
    for (int i = 0; i < k->n; i++)
        batch_retired_free(&k->kept[i]);
    free(k);
}

/* Frees r's producer with the payloads its messages may point into (kafka_producer_free_then).
 * false, nothing done, when there is no room to hand them over, or a batch given up holds rows
 * again (its new results could not be kept too): the caller frees the producer in place. */
static bool free_producer_with_payloads(Relay *r, int flush_ms)
{
    if (!r->sessions)
        return false;
    for (int i = 0; i < r->n_sessions; i++)
        if (r->sessions[i].batch.n > 0 && batch_given_up(&r->sessions[i].batch))
            return false;
    KeptPayloads *k = calloc(1, sizeof(*k) + (size_t)r->n_sessions * sizeof(BatchRetired));
    if (!k)
        return false;
    k->n = r->n_sessions;
    for (int i = 0; i < r->n_sessions; i++) {
        Batch *b = &r->sessions[i].batch;
        if (b->n > 0)
            batch_retire(b); /* its rows stay readable for the reports the flush serves */
        batch_take_retired(b, &k->kept[i]);
    }
    kafka_producer_free_then(r->kafka, flush_ms, free_kept_payloads, k);
    return true;
}

void relay_free(Relay *r)
{
    relay_free_within(r, 1000);
}

void relay_free_within(Relay *r, int flush_ms)
{
    if (!r)
        return;
    ev_signal_stop(r->loop, &r->sigterm);
    ev_signal_stop(r->loop, &r->sigint);
    ev_timer_stop(r->loop, &r->purge_timer);
    ev_timer_stop(r->loop, &r->rest_timer);
    ev_timer_stop(r->loop, &r->away_timer);
    /* The producer goes first: its last delivery reports still point into the batches. With
     * every batch empty nothing of it points into the relay any more, and it is destroyed off the
     * loop (kafka_producer_retire): a database removed by SIGHUP is freed on the loop (on_reap,
     * databases.c), where rd_kafka_destroy would stall every other database; while another
     * replaced producer is still being destroyed, kafka_producer_free hands it to a thread too.
     * A batch still out, or given up at the shutdown timeout (empty once marked, but its messages
     * may still be at the producer), leaves payloads the producer points into: those results go
     * with the producer to its thread (kafka_producer_free_then), freed only once it is
     * destroyed, so neither the purge's flush nor the destroy runs on the loop. */
    bool reported = true;
    for (int i = 0; r->sessions && i < r->n_sessions; i++)
        reported =
            reported && r->sessions[i].batch.n == 0 && !batch_given_up(&r->sessions[i].batch);
    if (reported ? !kafka_producer_retire(r->kafka) : !free_producer_with_payloads(r, flush_ms))
        kafka_producer_free(r->kafka, flush_ms);
    /* After the producer: a report its last flush serves could arm the room timer again
     * (relay_room_after_report), which must not outlive the relay. */
    ev_timer_stop(r->loop, &r->room_timer);
    wakeup_waiter_free(r);
    for (int i = 0; r->sessions && i < r->n_sessions; i++)
        session_free(&r->sessions[i]);
    free(r->sessions);
    serializer_free(r->serializer);
    if (r->kconf_template)
        rd_kafka_conf_destroy(r->kconf_template);
    relays_alive--;
    free(r);
}

bool relay_check_registry(Relay *r, char *err, size_t errlen)
{
    return !r->serializer || serializer_probe(r->serializer, NULL, 0, err, errlen);
}

bool relay_take_registry_probe(Relay *to, const Relay *from)
{
    return to->serializer && from->serializer &&
           serializer_take_probe(to->serializer, from->serializer);
}

bool relay_registry_up(const Relay *r)
{
    return !r->serializer || serializer_up(r->serializer);
}
