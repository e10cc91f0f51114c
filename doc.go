/*
Package stepwise is the module's root and its one handle: Client, built by NewClient from one
Config (River's config inside it, one map of kinds), as river.Client is River's. Register
steppers with AddWorker beside your own River workers, then Start the client, and Stop it on
SIGTERM to drain. The work is done in the sub-packages:

  - workflow: step functions on River jobs, each step committed with its cursor and fenced
    by the run's token; runs resumed from their last committed cursor after a crash.
  - checkpoint: the fenced, leased checkpoint rows the steps commit through.
  - outbox: the operation ledger; external side effects enqueued in the step's transaction
    and delivered under a stable operation_id, with an honest outcome.
  - reconcile: settles UNKNOWN_EXTERNAL operations by asking the external system (a
    Checker), and compares totals with its statement.
  - console: a read-mostly web console over runs and operations.
  - schedule: cron specs as durable, deterministic slots, one run per shard, with misfire
    and overlap policies; a business date's slot in the schedule's zone.
  - migrations: River's schema and Stepwise's, and the guard against a database newer than
    the binary.
  - retention: pruning of finished history (the events of succeeded runs and of settled
    operations) in small batches; runs, operations and people's decisions are kept.
  - stepwisetype: what the packages share, as River's rivertype does: DBTX, the one database
    interface their functions take.
  - workflowtest: invariant checks, chaos drills and child processes for users' own tests;
    workflowtest/fakebank, a strict fault-injecting fake payment provider, and
    workflowtest/pgserver, which finds or starts a PostgreSQL for tests.

The README's quick start wires them with one Client; docs/design.md gives the protocols,
the invariants and what is and is not promised.
*/
package stepwise
