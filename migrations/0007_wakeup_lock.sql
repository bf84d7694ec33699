-- A wakeup that costs producers one lock. 0004's trigger ran a plpgsql function on every insert
-- statement: a lock, then a query of outbox_wakeup_state for a sleeping relay. With a relay
-- draining beside them, that query cost producers 25-30 % of their single-event inserts at 4
-- clients (bench/bench.sh; the lock alone measured no cost). Now "some relay is asleep" is the
-- lock itself, and the trigger's WHEN condition, which PostgreSQL evaluates without calling the
-- function, is all a producer runs while every relay is awake.
--
-- The protocol, on one advisory lock (1331849732; relay/relay.c calls the functions):
--   - Each producer's insert statement tries to take the lock shared, held until it commits. If
--     it cannot, some relay holds it exclusively: the producer notifies.
--   - A relay session that found nothing for --sleep-after calls outbox_relay_sleep(). It becomes
--     the guard if it can take the lock exclusively at once; it follows if another session
--     already guards; it stays awake (and asks again shortly) if producers hold the lock. A guard
--     or follower then claims once more and waits for a notification.
--   - The guard holds the lock while it sleeps. Because it got it only once no producer held it
--     shared, every producer either committed before that final claim (which sees its rows) or
--     tries the lock later and notifies. A follower saw the guard's lock before its own final
--     claim: the same holds.
--   - Notifications wake every listening session. A guard that a producer's notification woke,
--     or that has work, calls outbox_relay_wake() before it claims: that releases the lock and
--     notifies, so followers wake too and take up the question again rather than sleep
--     unguarded. A guard its own poll timer woke claims and, finding nothing, sleeps on. A woken
--     follower asks again.
-- A producer never waits on the lock, and a long producer transaction only keeps relays awake.
-- If a guard's connection dies, the lock goes with its server process and no one is told: the
-- relay, reconnected, ends that process if it outlived the connection and notifies 'guard left'
-- (relay/engine/wakeup.c); should it not come back, followers wake at their poll timer
-- (--poll-interval).
CREATE OR REPLACE FUNCTION outbox_wakeup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_relay', '');
    RETURN NULL;
END
$$;

-- (Re)creates the wakeup trigger of an outbox table; `outbox-relay migrate --table` uses it too.
CREATE OR REPLACE FUNCTION outbox_wakeup_install(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP TRIGGER IF EXISTS outbox_wakeup ON %s', tbl);
    EXECUTE format('CREATE TRIGGER outbox_wakeup AFTER INSERT ON %s FOR EACH STATEMENT'
                   ' WHEN (NOT pg_try_advisory_xact_lock_shared(1331849732))'
                   ' EXECUTE FUNCTION outbox_wakeup()', tbl);
END
$$;

-- Every table that has the wakeup trigger gets the new one.
SELECT outbox_wakeup_install(tgrelid::regclass) FROM pg_trigger
WHERE tgname = 'outbox_wakeup' AND tgfoid = 'outbox_wakeup()'::regprocedure;

-- 'guard', 'follow' or 'busy' (see above). The guard's lock is held by the session.
CREATE OR REPLACE FUNCTION outbox_relay_sleep() RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_try_advisory_lock(1331849732) THEN
        RETURN 'guard';
    END IF;
    -- Taken by someone: exclusively (a guard) unless it can be shared (producers). The probe is a
    -- transaction lock, gone when this statement's transaction ends, whatever happens.
    IF pg_try_advisory_xact_lock_shared(1331849732) THEN
        RETURN 'busy';
    END IF;
    RETURN 'follow';
END
$$;

-- A guard gives up the lock and wakes the followers (at the commit of the calling statement). A
-- session guarding by then ignores this payload: it is the guard the followers will find.
CREATE OR REPLACE FUNCTION outbox_relay_wake() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_unlock(1331849732);
    PERFORM pg_notify('outbox_relay', 'guard left');
END
$$;

-- Like outbox_lane in 0006: the grant survives revoking PUBLIC's EXECUTE.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
        GRANT EXECUTE ON FUNCTION outbox_relay_sleep(), outbox_relay_wake() TO outbox_relay;
    END IF;
END
$$;

-- The flags of 0004 (outbox_wakeup_state) are no longer read, but the table stays: a relay from
-- before this file still writes them, and would fail its batches without the table. It just
-- wakes at its poll timer until it is upgraded. The lock is a new key, so such a relay's
-- transaction lock on 0004's key is never mistaken for a guard.
