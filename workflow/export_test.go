package workflow

import "github.com/riverqueue/river"

// DisableFenceForTest removes fencing (token check, fenced write, lost-lease reaction), so
// the fault suite can prove that it catches a build without the fence. Test binaries only.
func DisableFenceForTest(e *Engine) { e.disableFence = true }

// MaintenanceInsertOptsForTest are the options the periodic maintenance job is inserted with.
func MaintenanceInsertOptsForTest(e *Engine) *river.InsertOpts { return e.maintenanceInsertOpts() }
