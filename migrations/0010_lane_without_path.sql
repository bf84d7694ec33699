-- outbox_lane with no name left to the caller's search_path. 0009 qualified its functions and
-- operators, but its body still cast the separator to `text`: a type name, not a keyword as
-- bigint and smallint are, so PostgreSQL looks it up on the search_path of whoever runs the
-- function, which is every writer's INSERT (the generated lane column) and every UPDATE of a
-- row. A writer whose search_path lists a schema before pg_catalog thus ran, inside the relay's
-- function, a look-alike type planted there (a domain over text whose CHECK calls any function).
-- The function keeps no SET search_path, to stay inlinable on every insert: every name in its
-- body is qualified instead. Same value for every row, so the stored lanes stay right.
CREATE OR REPLACE FUNCTION outbox_lane(aggregate_type text, aggregate_id text) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (pg_catalog.hashtextextended(aggregate_type OPERATOR(pg_catalog.||) '/'::pg_catalog.text
                                        OPERATOR(pg_catalog.||) aggregate_id, 0::bigint)
            OPERATOR(pg_catalog.&) 63::bigint)::smallint
$$;
