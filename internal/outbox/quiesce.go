package outbox

// Quiesce makes this Outbox's dispatchers claim nothing more and send nothing more: the sends
// already handed to a Sender finish (within the kind's Timeout) and their outcomes are
// recorded; operations claimed but not yet handed to a Sender go back to RETRYABLE, marked
// not sent (certainly not sent, so no UNKNOWN_EXTERNAL); the dispatcher job is then handed
// back to River (snoozed, available at once) for a dispatcher in another process.
//
// Call it when the process is asked to stop (SIGTERM), before the River client's Stop:
// Stop alone lets a dispatcher go on claiming and sending until its slice ends, and the hard
// stop after it cancels sends in flight, which then end UNKNOWN_EXTERNAL. Quiesce cannot be
// undone; the Outbox is meant to be discarded with its client.
//
// Guards against: a shutdown that keeps sending until it is killed, and sends cut off
// mid-request by the hard stop.
func (o *Outbox) Quiesce() { o.draining.Store(true) }
