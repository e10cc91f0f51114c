package checkpoint

// MarkHeartbeatingForTest makes l look renewed by a Heartbeat (Advance then leaves a lease
// with more than half left alone) without one renewing it, so that a test can let the
// heartbeat fall behind at will.
func MarkHeartbeatingForTest(l *Lease) { l.heartbeats.Store(true) }

// IsHeld is isHeld, for the external tests.
var IsHeld = isHeld
