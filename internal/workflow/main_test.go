package workflow_test

import (
	"os"
	"testing"

	"github.com/stepwise-go/stepwise/internal/testkit"
	"github.com/stepwise-go/stepwise/workflowtest"
)

func TestMain(m *testing.M) {
	workflowtest.RegisterRole("wf-worker", runWorkerRole)
	os.Exit(testkit.Main(m))
}
