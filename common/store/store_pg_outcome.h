/*
 * store_pg_outcome.h - what the PostgreSQL store's results mean
 * (store_pg_outcome.c): outcomes after a commit, operations given up,
 * claims abandoned or given back.
 */
#ifndef IDEMPROXY_STORE_PG_OUTCOME_H
#define IDEMPROXY_STORE_PG_OUTCOME_H

#include "store_pg_priv.h"

/* o's batch committed: its held result is its outcome. */
void pg_op_committed(struct pg_op *o);
/* o's deadline passed without an outcome: STORE_ERROR; a claim that was
 * sent goes on abandoned. */
void pg_give_up(struct pg_op *o);
/* Claim o is abandoned: nobody will execute it, but it was sent and may
 * have committed; it goes on in the background until its outcome is
 * known, until its lease would have ended. */
void pg_abandon(struct pg_op *o);
/* Claim c won but nobody will execute it: give the key back in the
 * background, with c's owner token. */
void pg_give_back(const struct pg_op *c);

#endif
