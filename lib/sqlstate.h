/* sqlstate: whose fault a failed statement is, from its SQLSTATE, shared by the relay and the
 * demos so that both draw the line in one place.
 *
 * A failure is the row's (or message's) own when the data itself is refused: class 22 (a value
 * the column cannot take), 23 (a constraint), 54 (a limit the data exceeds: an index entry too
 * large) and P0 (a trigger's or function's RAISE on that row). Only such a failure may count an
 * attempt against a row, dead-letter it or park a message. Everything else is someone else's, and
 * waits: either something passing (a lost connection, a failover's read-only window, a deadlock, a
 * lock or statement timeout, resources, a shutdown) or the setup (privileges, a missing table or
 * column, authentication), which lasts until an operator fixes it. Unknown classes are taken as the
 * setup's: an error nobody classified never destroys an event. */
#ifndef OUTBOX_SQLSTATE_H
#define OUTBOX_SQLSTATE_H

typedef enum {
    SQLSTATE_FAULT_ROW,       /* 22, 23, 54, P0: the data; retrying the row fails the same way */
    SQLSTATE_FAULT_TRANSIENT, /* 08, 0A, 25, 40, 53, 55, 57, 58, XX, none: passes by itself */
    SQLSTATE_FAULT_SETUP,     /* 42, 28, 3D, 3F and the rest: an operator must act */
} SqlstateFault;

/* The fault of a five-character SQLSTATE; NULL or "" (no state: the connection broke, or libpq
 * failed on its own) is transient. Pure; never fails. */
SqlstateFault sqlstate_fault(const char *sqlstate);

/* "row", "transient" or "setup", for log lines and metrics. Static storage. */
const char *sqlstate_fault_name(SqlstateFault fault);

#endif
