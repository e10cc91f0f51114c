package workflow

// Quiesce makes this Engine's attempts stop at their next step boundary: the step in flight
// finishes and commits, and releases the run's lease in that same commit; the attempt then
// hands the run back to River (snoozed, available at once), so another process resumes it
// without waiting for the lease to lapse. Steps not yet begun are never begun here.
//
// Call it when the process is asked to stop (SIGTERM), before the River client's Stop:
// Stop alone stops fetching new jobs but lets a running attempt go on stepping until its
// slice ends, and the hard stop after it cancels the step in flight instead of finishing it.
// Quiesce cannot be undone; the Engine is meant to be discarded with its client.
//
// Guards against: a shutdown that keeps starting steps until it is killed, and a
// takeover that waits a whole lease for the run of a process that stopped cleanly.
func (e *Engine) Quiesce() { e.draining.Store(true) }
