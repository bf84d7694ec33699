-- Wakes the relay as soon as an INSERT into the outbox commits. The trigger fires once per
-- statement (not per row) and PostgreSQL folds identical notifications of one transaction into
-- one, so a producer transaction sends at most one notification whatever it inserts. The relay
-- also polls on a timer, so a lost notification only delays, never loses, an event.
CREATE OR REPLACE FUNCTION outbox_wakeup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_relay', '');
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS outbox_wakeup ON outbox;
CREATE TRIGGER outbox_wakeup AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_wakeup();
