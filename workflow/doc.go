// Package workflow runs long, checkpointed batch jobs as River workers: each job is a step
// function whose every step commits its business writes, its cursor and its outbox rows in
// one Postgres transaction, fenced by a token so a worker that lost its lease can never
// commit.
//
// # Writing a step function
//
// A step function is River job args (the run's input), a cursor type (what survives a
// crash) and a Step method:
//
//	type SettleArgs struct{ Date string `json:"date"` }
//	func (SettleArgs) Kind() string { return "settle" }
//
//	type SettleCursor struct{ AfterMerchant int64 `json:"after_merchant"` }
//
//	type SettleWorker struct {
//		workflow.StepperDefaults[SettleArgs, SettleCursor]
//	}
//
//	func (w *SettleWorker) Step(ctx context.Context, s *workflow.Step[SettleArgs, SettleCursor]) (workflow.Next, error) {
//		last, n, err := settleBatch(ctx, s.Tx, s.Args.Date, s.Cursor.AfterMerchant, 500)
//		if err != nil {
//			return workflow.Next{}, err // rolled back; retried from the last committed cursor
//		}
//		if n == 0 {
//			return workflow.Done(), nil
//		}
//		s.Cursor.AfterMerchant = last
//		return workflow.Continue(), nil
//	}
//
// # When the cursor's shape changes
//
// The cursor is data one release commits and the next one reads; during a rolling deploy
// old and new workers take the same runs in turn. A release that changes the cursor's shape
// declares a new version and reads the old one (docs/design.md, *Rolling deploys and cursor
// versions*):
//
//	// The next release: SettleWorker now embeds StepperDefaults[SettleArgs, SettleCursorV2].
//	type SettleCursorV2 struct {
//		After int64 `json:"after"`
//		Batch int   `json:"batch"`
//	}
//
//	func (w *SettleWorker) CursorVersion() int { return 2 }
//
//	func (w *SettleWorker) UpgradeCursor(from int, raw json.RawMessage) (SettleCursorV2, error) {
//		var v1 SettleCursor
//		if err := json.Unmarshal(raw, &v1); err != nil {
//			return SettleCursorV2{}, err
//		}
//		return SettleCursorV2{After: v1.AfterMerchant}, nil
//	}
//
// The version is committed with every cursor. A worker that meets an older cursor upgrades
// it, and the next step commits it in the new version; one that meets a newer cursor (an
// old worker) releases the run untouched, without counting a failure, for a worker that
// reads it (Run.Awaiting says so meanwhile).
//
// # Wiring
//
// One stepwise.Client (the module's root package) runs step functions, as the README's quick
// start does: stepwise.AddWorker(workers, &SettleWorker{}) beside your own River workers,
// stepwise.NewClient(pool, config), client.Start, client.RunStart to start a run by key, and
// client.Stop on SIGTERM. The engine behind it is internal: the client installs its worker,
// queue and periodic job into your river.Config, runs its maintenance in every process and
// drains it on Stop. NewClient refuses a Config.Workflow.Slice (or a step worker's
// StepOptions.Slice) that is not shorter than the river.Config's RescueStuckJobsAfter, with
// the fix: River would rescue healthy runs as stuck.
//
// # The step protocol
//
// The engine (internal/workflow, worker.go) follows the step protocol of docs/design.md:
//
//  1. Claim the run's lease (internal/checkpoint: Store.Claim); if held, snooze until it lapses.
//  2. Per step: begin with the stall timeout armed, run Step in the tx, then the fenced
//     write of cursor and lease (Store.Advance); on Done also the run's status and
//     river.JobCompleteTx, whose returned state is checked; commit.
//  3. A heartbeat renews the lease and cancels the step's context if it cannot.
//  4. After Config.Slice, release the lease in the last commit, recorded as a release on
//     purpose (runstate.go), and JobSnooze(0).
//  5. Maintenance (a leader-run periodic job, and the client's maintenance loop in every
//     process) re-enqueues runs whose worker vanished:
//     takeover after about Lease + MaintenanceInterval, not River's hour, and not River's
//     leader failover either, since every process runs the loop. A run nobody holds
//     (its job fetched and not yet claimed, or released on purpose and not yet recorded by
//     River) is left alone for two Leases.
//  6. Outcomes: Continue, Done, Sleep/Until, Fail, and the waits WaitForOperations,
//     WaitForChildren, WaitForSignal (woken by the commit that satisfies them; see
//     docs/design.md, "Waits"); an error or panic rolls back and River
//     retries it after the back-off the river.Config's RetryPolicy gives for the run's
//     failures in a row (never the job's errors ever); on the job's last attempt the job
//     snoozes instead, so River's attempt count never ends a run. The run fails when its failures (crashes taken over plus step
//     errors, never slices) reach its job's MaxAttempts in a row without progress: a
//     failure recorded after the run committed steps since the previous one restarts the
//     count at 1. A poison run (an item that kills the worker, a step that always errors)
//     makes no progress and still fails after MaxAttempts failures; a long run on machines
//     that crash now and then does not. A resume (stepwise.Client.RunResume) continues a failed
//     run later.
//
// Every change of a run's state is one transition of internal/workflow/runstate.go, conditional on the
// state its caller saw.
//
// # Guarantees
//
// A step runs at least once; its Postgres writes take effect once. A run key names one
// run forever (RunStart twice is one run). Nothing here calls external systems: a step
// enqueues operations with outbox.Enqueue in s.Tx, and the outbox delivers them.
//
// # Schedules
//
// Package schedule turns cron specs into durable, deterministic slots whose runs it starts
// here, with misfire and overlap policies. Only it records a run as a slot's: StartOpts has
// no schedule, slot or shard.
package workflow
