#include "sqlstate.h"

#include <string.h>

SqlstateFault sqlstate_fault(const char *sqlstate)
{
    if (!sqlstate || strlen(sqlstate) < 2)
        return SQLSTATE_FAULT_TRANSIENT;
    /* 54: a program limit the row's data exceeds, such as an index entry too large for its
     * key (54000). */
    static const char *const row[] = {"22", "23", "54", "P0"};
    /* 25: read-only during a failover (25006), an aborted transaction (25P02); 55: lock_timeout
     * (55P03), an object in use; 57: cancelled, shut down, crash recovery; XX: internal. */
    /* 0A: "cached plan must not change result type" after a schema change (0A000); the relay
     * prepares the statement afresh on the next try (relay/io/pg_request.c). */
    static const char *const transient[] = {"08", "0A", "25", "40", "53", "55", "57", "58", "XX"};
    for (size_t i = 0; i < sizeof(row) / sizeof(row[0]); i++)
        if (strncmp(sqlstate, row[i], 2) == 0)
            return SQLSTATE_FAULT_ROW;
    for (size_t i = 0; i < sizeof(transient) / sizeof(transient[0]); i++)
        if (strncmp(sqlstate, transient[i], 2) == 0)
            return SQLSTATE_FAULT_TRANSIENT;
    return SQLSTATE_FAULT_SETUP;
}

const char *sqlstate_fault_name(SqlstateFault fault)
{
    switch (fault) {
    case SQLSTATE_FAULT_ROW:
        return "row";
    case SQLSTATE_FAULT_TRANSIENT:
        return "transient";
    case SQLSTATE_FAULT_SETUP:
        break;
    }
    return "setup";
}
