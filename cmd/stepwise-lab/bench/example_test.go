package bench_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/stepwise-go/stepwise/cmd/stepwise-lab/bench"
)

// Main with a few flags: settle 300 merchants with the hand-written loop and with Stepwise,
// once each, in batches of 100, and read the ratio from the report's last line, as a script
// would.
func ExampleMain() {
	var report bytes.Buffer
	args := []string{"--only", "floor,stepwise", "--merchants", "300", "--batches", "100", "--rounds", "1"}
	if err := bench.Main(context.Background(), args, &report, io.Discard); err != nil {
		fmt.Println(err)
		return
	}
	lines := strings.Split(strings.TrimSpace(report.String()), "\n")
	last := lines[len(lines)-1]
	ratio, err := strconv.ParseFloat(strings.TrimPrefix(last, "stepwise/floor B=100: "), 64)
	fmt.Println(strings.HasPrefix(last, "stepwise/floor B=100: "), err == nil && ratio > 0)
	// Output: true true
}
