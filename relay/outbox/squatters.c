#include "squatters.h"

#include <stdlib.h>
#include <string.h>

static bool seen(const SquatSeen *s, int pid)
{
    for (int i = 0; s && i < s->n; i++)
        if (s->pids[i] == pid)
            return true;
    return false;
}

bool squat_counts(const PGresult *look, int row, const SquatSeen *before, SquatSeen *now)
{
    if (strcmp(PQgetvalue(look, row, 1), "slot-without-lanes") != 0)
        return true;
    int pid = atoi(PQgetvalue(look, row, 0));
    if (now->n < SQUAT_SEEN_MAX)
        now->pids[now->n++] = pid;
    return seen(before, pid);
}
