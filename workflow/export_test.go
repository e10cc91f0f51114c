package workflow

// DisableFenceForTest removes fencing (token check, fenced write, lost-lease reaction), so
// the fault suite can prove that it catches a build without the fence. Test binaries only.
func DisableFenceForTest(e *Engine) { e.disableFence = true }
