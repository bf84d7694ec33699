/* diagnose: why the claim floor is off, said so an operator can act on it.
 *
 * SQL_FLOOR_CHECK (statements.h) answers only yes or no: "{seq} is drawn in order from a sequence
 * the relay may read". When it says no, the start-up warning used to blame the column whatever the
 * cause; the usual cause is a missing grant (SELECT on the order column's sequence, which
 * `migrate` gives outbox_relay only when that role exists), or no table at all. This query looks at
 * each condition on its own and the function below turns the first one that fails into a sentence
 * with the statement that fixes it. `outbox-relay check` runs it; the relay can send it beside
 * SQL_FLOOR_CHECK and log its sentence in place of the generic one. */
#ifndef OUTBOX_DIAGNOSE_H
#define OUTBOX_DIAGNOSE_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

#include "table.h"

/* A template for table_sql (placeholders {table_text}, {seq_text}): one row, never an error for a
 * missing table or column, and readable by any role (catalogs and has_*_privilege only). */
extern const char *const diagnose_floor_sql;

/* Reads a result of diagnose_floor_sql for map's table. Returns true when the claim floor can be
 * on (the same answer as SQL_FLOOR_CHECK); otherwise false with one sentence in why naming the
 * cause and the statement that fixes it (no trailing newline). A result that is not one row of
 * the expected shape (the query failed) gives false and says so. */
bool diagnose_floor(const PGresult *res, const TableMap *map, char *why, size_t whylen);

#endif
