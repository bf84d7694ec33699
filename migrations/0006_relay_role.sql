-- Least-privilege roles, so that neither the relay nor the applications need the owner's role.
--
--   outbox_relay     what `outbox-relay run`, `dead`, `requeue`, `purge-dead` and `status` need:
--                    read the outbox, update its delivery columns only, delete (--on-sent
--                    delete, retention and purge-dead only; REVOKE DELETE ON outbox FROM
--                    outbox_relay if you use none of them). (Before 0007 it kept its sleeping
--                    flag in outbox_wakeup_state: that grant is gone since 0009.)
--                    No CREATE anywhere: `migrate` runs as the owner, never as the relay. pg_locks,
--                    pg_database and pg_stat_activity (lanes, status) are readable by every role;
--                    LISTEN and advisory locks need no grant.
--   outbox_producer  INSERT into the outbox's aggregate_type, aggregate_id, event_type, payload
--                    and headers only (the id comes from an identity column: no sequence grant
--                    needed; the relay's columns are not the writers', see 0009). Add
--                    SELECT (id, event_id) if you use RETURNING.
--
-- Both are created NOLOGIN, and only if missing (roles are cluster-wide). Log in through a member:
--   CREATE ROLE relay_login LOGIN PASSWORD '...' IN ROLE outbox_relay;
--   -- or: GRANT outbox_relay TO relay_login; ALTER ROLE relay_login LOGIN PASSWORD '...';
-- An owner without CREATEROLE cannot create them: the file then warns and skips their grants
-- instead of failing. `outbox-relay migrate` prints that warning, and its grants step (run after
-- the migrations on every migrate, relay/cmd/grants.c) exits 1 naming the missing roles: have an
-- administrator create them, then run `outbox-relay migrate` again, which gives these grants (and
-- 0008's) without this file. Applied with psql instead, the file is idempotent: run it again.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['outbox_relay', 'outbox_producer'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created meanwhile by a concurrent run (psql takes no migrate lock)
            WHEN insufficient_privilege THEN
                RAISE WARNING 'role % is missing and % may not create it: grants skipped', r, current_user
                    USING HINT = format('CREATE ROLE %I NOLOGIN, then run 0006_relay_role.sql again', r);
            END;
        END IF;
    END LOOP;
END
$$;

DO $$
DECLARE
    -- The outbox's schema (usually public). A GRANT on a schema this role does not own only warns.
    s text := (SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'outbox'::regclass);
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_relay') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %s TO outbox_relay', s);
        GRANT SELECT, DELETE ON outbox TO outbox_relay;
        -- The claim's FOR UPDATE needs UPDATE on some column; these are all the relay writes.
        GRANT UPDATE (sent_at, attempts, rejections, last_error, next_attempt_at, dead_at,
                      dead_letter_topic) ON outbox TO outbox_relay;
        -- The generated lane column; PUBLIC has EXECUTE by default, this survives revoking that.
        GRANT EXECUTE ON FUNCTION outbox_lane(text, text) TO outbox_relay;
        IF to_regprocedure('outbox_relay_sleep()') IS NOT NULL THEN -- the wakeup of 0007
            GRANT EXECUTE ON FUNCTION outbox_relay_sleep(), outbox_relay_wake() TO outbox_relay;
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'outbox_producer') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %s TO outbox_producer', s);
        -- The columns of the integration contract only (0009 says why); REVOKE first, since a
        -- table-wide INSERT given before would cover every column.
        REVOKE INSERT ON outbox FROM outbox_producer;
        GRANT INSERT (aggregate_type, aggregate_id, event_type, payload, headers)
            ON outbox TO outbox_producer;
        GRANT EXECUTE ON FUNCTION outbox_lane(text, text) TO outbox_producer;
    END IF;
END
$$;
