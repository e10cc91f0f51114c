package checkpoint

import "github.com/stepwise-go/stepwise/internal/checkpoint"

// ErrFenced is the error of a step whose commit was refused because another worker claimed
// the run after this one's lease lapsed: the step's transaction rolled back, none of its rows
// landed, and the worker stopped. It is the same error as workflow.ErrFenced.
var ErrFenced = checkpoint.ErrFenced
