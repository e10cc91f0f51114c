// Package bench is "stepwise-lab bench": it measures what Stepwise costs against the
// loop a settlement team would write by hand in pgx, on one machine, in one run, and prints
// the table (README.md in this directory says how to read it).
//
// # What is measured
//
// The settle step is the sample's own code, settlement.SettleBatch: per merchant a sum of its
// card transactions of the day, a settlement row, two ledger rows and a payout in the
// operation ledger, for a batch of B merchants in one statement (plus the payouts' insert).
// It runs three ways on the same database and identical data:
//
//   - floor (a): plain pgx, one transaction per batch holding SettleBatch and a fenced cursor
//     UPDATE, after one claim;
//   - stepwise (b): settlement.SettleWorker as a Stepwise run worked by a River client (claim,
//     fenced steps, cursor, run status, dispatcher wake after each commit, job completion in
//     the last step);
//   - river (c): one River job per merchant, settled and completed in one transaction
//     (JobCompleteTx), at River's default fetch settings and with a 5ms FetchCooldown.
//
// The concurrent part settles one date in 8 shards three ways: 8 Stepwise runs at once in
// this process, 8 hand-written loops at once, and one Stepwise run for the whole date.
//
// Then: payout delivery to the zero-latency fake bank (ops/s), reconciler lookups (lookups/s),
// takeover after kill -9 of the worker process holding a run (median and max), one
// maintenance pass with a backlog of 100,000 pending runs (and its statements' plans), runs
// that wait for a signal (a maintenance pass with 10,000 of them waiting, the statements they
// cost between passes, and the wake latency from a signal's commit to the run's next step), settle
// throughput with 1, 2 and 4 worker processes over 8 shards, and time per merchant as the
// merchant table grows to a million, with the settle statement's executed plan. The history
// section compares a step, delivery, enqueue and a claim on a ledger of 10M operations and 1M
// runs with the same on a fresh one (paired rounds), and prunes the old history beside a
// settle loop (paired windows: the step slowdown and the rows/s). Each section prints its peak
// RSS.
//
// # Fairness
//
// Each section runs on its own database cloned from one template. In the settle section every
// run settles a fresh business date whose transactions are identical to every other date's,
// so earlier runs' settlements stay in the tables (steady state, as in production) and no run
// pays for another's leftovers; variants alternate within each round. The best run of each
// variant is reported, with the spread of the per-round paired ratios. Every run's output is
// counted in the database afterwards (settlements, ledger rows, payouts), so a variant that
// skipped work would fail the bench rather than win it.
//
// # Worker processes
//
// The takeover and scale sections re-execute the running binary with STEPWISE_BENCH_ROLE set;
// Main then runs a worker (the sample's Service, as serve wires it) instead of the bench. A
// worker exits when the bench's end of its stdin closes, so none outlives the bench.
//
// # Example
//
//	stepwise-lab bench --quick                 # every section, small: about a minute
//	stepwise-lab bench                         # the full table: several minutes
//	stepwise-lab bench --only floor,stepwise --batches 100 --trace
//
// The last lines are "stepwise/floor B=<n>: <ratio>", one per batch size, then
// "stepwise/floor concurrent=8: <ratio>", for scripts.
package bench
