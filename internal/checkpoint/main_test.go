package checkpoint_test

import (
	"os"
	"testing"

	"github.com/stepwise-go/stepwise/internal/testkit"
)

func TestMain(m *testing.M) { os.Exit(testkit.Main(m)) }
