package chaos

import (
	"fmt"
	"strings"
	"time"

	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// Profiles are the named chaos profiles, each a Config (ProfileConfig). All run against the
// strict bank and are judged by every invariant, the request-log and takeover checks included.
var Profiles = []string{"classic", "long", "slow-bank", "paused-dispatcher", "sleepers", "mix"}

// profileDocs says what each profile provokes, for the command's usage.
var profileDocs = map[string]string{
	"classic":           "settle a date of many short steps; SIGKILL a random worker every 0.5-2s, SIGSTOP every sixth hit",
	"long":              "runs of a 150ms Slice that live hundreds of slices (past River's MaxAttempts), killed a few times: every run must finish, no healthy run taken over",
	"slow-bank":         "payouts against a bank answering around and above the sender timeout (and stalling), with kills and pauses: no concurrent or late sends",
	"paused-dispatcher": "SIGSTOP the process holding the most claimed payouts, past its claim, then SIGCONT: it must not send what it no longer holds",
	"sleepers":          "runs that Sleep(1h) while workers are killed: none may wake early",
	"mix":               "each of the other profiles in turn, with seeds derived from --seed, until --duration ends (the soak)",
}

// ProfileDoc returns the one-line description of a profile.
func ProfileDoc(name string) string { return profileDocs[name] }

// SmallMerchants is the size of the date the bounded settle profiles settle: small enough that
// a slow bank gets through it in seconds.
const SmallMerchants = 150

// ProfileConfig returns the config of a named profile. bounded gives the size run in
// `go test` (seconds); otherwise the command's size (minutes, at least 500 slices a long
// run). "mix" is not a single config: see RunMix.
func ProfileConfig(name string, bounded bool) (*Config, error) {
	const timeout = time.Second
	scale := func(b, full int) int {
		if bounded {
			return b
		}
		return full
	}
	dur := func(b, full time.Duration) time.Duration {
		if bounded {
			return b
		}
		return full
	}
	cfg, err := profileConfig(name, bounded, timeout, scale, dur)
	if err == nil && bounded && cfg.QuietTimeout == 0 {
		// A bounded run that is not at rest a minute after the chaos will not be: say so
		// within the CI budget.
		cfg.QuietTimeout = time.Minute
	}
	return cfg, err
}

func profileConfig(name string, bounded bool, timeout time.Duration, scale func(int, int) int, dur func(time.Duration, time.Duration) time.Duration) (*Config, error) {
	switch name {
	case "classic":
		return &Config{Profile: name, Duration: dur(30*time.Second, 2*time.Minute)}, nil
	case "long":
		// Runs living 30s of 150ms slices, each followed by a fetch (River polls every
		// 100ms in the steps workers): measured 2 slices a second on a loaded machine, so
		// ~60 slices a run, past MaxAttempts 25 after ~12s, leaving the second half of the
		// run to the killer (the command's: 5 minutes, 600+ slices). Nine runs on three
		// workers, so that a kill almost always lands on a worker holding runs.
		return &Config{Profile: name, Workload: "steps", Workers: 3, LongRuns: 9,
			LongLifetime: dur(30*time.Second, 5*time.Minute), StepTime: 5 * time.Millisecond, Slice: 150 * time.Millisecond,
			KillMin: 1500 * time.Millisecond, KillMax: 3 * time.Second, StopEvery: 5,
			Duration: dur(45*time.Second, 6*time.Minute)}, nil
	case "sleepers":
		// Each sleeper works a little longer than the lease (2s) before it sleeps.
		return &Config{Profile: name, Workload: "steps", Workers: 3, Sleepers: scale(30, 60), SleepFor: time.Hour,
			SleeperWork: 2500 * time.Millisecond,
			LongRuns:    2, LongLifetime: dur(8*time.Second, time.Minute), StepTime: 10 * time.Millisecond, Slice: 150 * time.Millisecond,
			KillMin: 1500 * time.Millisecond, KillMax: 3 * time.Second, StopEvery: 5,
			Duration: dur(15*time.Second, 2*time.Minute)}, nil
	case "slow-bank":
		return &Config{Profile: name, Merchants: scale(SmallMerchants, 5000), Shards: 4, BatchSize: 10, Workers: 3,
			Soak: !bounded, PayoutTimeout: timeout, ReconcileGrace: 3 * time.Second, PayoutConcurrency: 8,
			BankLatency: fakebank.LatencyProfile{Slow: 0.5, SlowMin: timeout / 2, SlowMax: timeout * 3 / 2, Stall: 0.05, StallFor: 3 * timeout},
			KillMin:     time.Second, KillMax: 3 * time.Second, StopEvery: 3,
			Duration: dur(12*time.Second, 3*time.Minute)}, nil
	case "paused-dispatcher":
		// Payout lease is 2 x Lease (4s); the freeze outlasts it, so the frozen process's
		// claims are recovered by others before it wakes up holding them.
		return &Config{Profile: name, Merchants: scale(SmallMerchants, 5000), Shards: 4, BatchSize: 10, Workers: 3,
			Soak: !bounded, PayoutTimeout: timeout, ReconcileGrace: 3 * time.Second, PayoutConcurrency: 8,
			BankLatency:     fakebank.LatencyProfile{Slow: 1, SlowMin: 200 * time.Millisecond, SlowMax: 600 * time.Millisecond},
			PauseDispatcher: true, StopEvery: 1, StopFor: 6 * time.Second,
			KillMin: time.Second, KillMax: 2 * time.Second,
			Duration: dur(12*time.Second, 3*time.Minute)}, nil
	case "mix":
		return nil, fmt.Errorf("chaos profile %q is a sequence of profiles: use RunMix", name)
	}
	return nil, fmt.Errorf("unknown chaos profile %q; want one of %s", name, strings.Join(Profiles, ", "))
}
