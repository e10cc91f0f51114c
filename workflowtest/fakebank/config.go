package fakebank

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// DefaultClientTimeout is the timeout of the http.Client that NewClient builds when given nil,
// and the default Config.Delay, so that a delayed answer arrives only after that client gave up.
const DefaultClientTimeout = 5 * time.Second

// Config configures a Bank. The zero value is a well-behaved bank on a free loopback port.
type Config struct {
	// Addr is the address Start listens on. Its host must be a loopback address or "localhost":
	// the bank has no authentication and its admin endpoints change how it behaves, so it must
	// not be reachable from another machine.
	//
	// Defaults to "127.0.0.1:0" (a free port; read it back with Bank.URL).
	Addr string

	// Delay is how long DelayAfterApply holds an applied payment's answer. It exists to outlast
	// the caller's timeout, so set it above that timeout; tests use a short client timeout and a
	// short Delay to stay fast.
	//
	// Defaults to 5s (DefaultClientTimeout).
	Delay time.Duration

	// Faults is the probability of each fault per POST /payments request. Change it at run time
	// with Bank.SetFaults.
	//
	// Defaults to no faults.
	Faults Mix

	// Latency is added before the bank handles each payment, lookup or statement request
	// (admin requests are exempt so that checking the ledger stays quick).
	//
	// Defaults to 0 (none).
	Latency time.Duration

	// Now is the bank's clock, stamped on each payment as CreatedAt. Tests of statement windows
	// set it to a controlled clock.
	//
	// Defaults to time.Now.
	Now func() time.Time

	// Strict makes the bank forget idempotency keys: every POST /payments that gets as far as
	// being applied is a new payment, even under a key it has seen, as at a bank that does not
	// deduplicate (refusals, validation errors and rate limits are often not remembered per key,
	// and two concurrent requests with one key can both pass). A second send then shows up as
	// a second effect in Applied, Effects and the request log instead of being absorbed.
	// Lookups find the first payment under a key. The chaos suite runs strict.
	//
	// Defaults to false: each key is applied at most once and replays get the stored answer.
	Strict bool

	// Profile draws a processing latency or an answer stall per POST /payments request, on
	// top of Latency. See LatencyProfile.
	//
	// Defaults to the zero profile: no latency.
	Profile LatencyProfile

	// Seed seeds the random source that draws faults from Faults, so that a run reproduces: the
	// same seed and the same sequence of requests draw the same faults.
	//
	// Defaults to 1.
	Seed uint64
}

// WithDefaults returns a copy of the config with every unset field at its default. A nil
// receiver gives the default config.
func (c *Config) WithDefaults() *Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Addr == "" {
		out.Addr = "127.0.0.1:0"
	}
	if out.Delay == 0 {
		out.Delay = DefaultClientTimeout
	}
	if out.Now == nil {
		out.Now = time.Now
	}
	if out.Seed == 0 {
		out.Seed = 1
	}
	return &out
}

func (c *Config) validate() error {
	if c.Delay < 0 {
		return fmt.Errorf("fakebank: config: Delay %s is negative", c.Delay)
	}
	if c.Latency < 0 {
		return fmt.Errorf("fakebank: config: Latency %s is negative", c.Latency)
	}
	if err := c.Profile.Validate(); err != nil {
		return fmt.Errorf("fakebank: config: %w", err)
	}
	if err := c.Faults.Validate(); err != nil {
		return fmt.Errorf("fakebank: config: %w", err)
	}
	return nil
}

// Fault is one way the bank misbehaves on a POST /payments request. See the package
// documentation for what each one means to a caller.
type Fault int

const (
	// NoFault handles the request normally. FailNext(n, NoFault) shields the next n requests from
	// the random mix.
	NoFault Fault = iota

	// RefuseBeforeApply answers 429 with "X-Not-Processed: true" and applies nothing: the one
	// refusal a caller may treat as definitely not executed.
	RefuseBeforeApply

	// Error5xxBeforeApply answers 500 or 503 and applies nothing. The caller cannot tell it from
	// Error5xxAfterApply, which is the point.
	Error5xxBeforeApply

	// Error5xxAfterApply applies the payment, then answers 500 or 503, exactly as
	// Error5xxBeforeApply does.
	Error5xxAfterApply

	// DropAfterApply applies the payment, then closes the connection without an answer.
	DropAfterApply

	// DelayAfterApply applies the payment, then holds the answer for Config.Delay.
	DelayAfterApply

	// CrashAfterApply applies the payment, then takes the bank off the network as
	// SetDown(true) does, as a bank process dying right after its commit: the port closes
	// first, then every open connection, this one without an answer. A resend on a new
	// connection is refused until SetDown(false). It is only ever programmed (FailNext,
	// FailKey), never drawn from a Mix, since the bank stays down until the test brings it
	// back.
	CrashAfterApply

	faultCount // keep last: the number of Fault values
)

var faultNames = [faultCount]string{
	NoFault:             "none",
	RefuseBeforeApply:   "refuse_before_apply",
	Error5xxBeforeApply: "error_5xx_before_apply",
	Error5xxAfterApply:  "error_5xx_after_apply",
	DropAfterApply:      "drop_after_apply",
	DelayAfterApply:     "delay_after_apply",
	CrashAfterApply:     "crash_after_apply",
}

func (f Fault) valid() bool { return f >= NoFault && f < faultCount }

// String returns the fault's snake_case name, the same one used in JSON.
func (f Fault) String() string {
	if !f.valid() {
		return fmt.Sprintf("Fault(%d)", int(f))
	}
	return faultNames[f]
}

// MarshalText makes a Fault a readable JSON map key in Stats.Faults.
func (f Fault) MarshalText() ([]byte, error) {
	if !f.valid() {
		return nil, fmt.Errorf("fakebank: unknown fault %d", int(f))
	}
	return []byte(faultNames[f]), nil
}

// UnmarshalText parses a name written by MarshalText.
func (f *Fault) UnmarshalText(text []byte) error {
	for i, name := range faultNames {
		if string(text) == name {
			*f = Fault(i)
			return nil
		}
	}
	return fmt.Errorf("fakebank: unknown fault %q", text)
}

// Mix is the probability, each in [0, 1] and summing to at most 1, that a POST /payments request
// meets each fault. One draw per request picks at most one fault.
type Mix struct {
	RefuseBeforeApply   float64 `json:"refuse_before_apply,omitempty"`
	Error5xxBeforeApply float64 `json:"error_5xx_before_apply,omitempty"`
	Error5xxAfterApply  float64 `json:"error_5xx_after_apply,omitempty"`
	DropAfterApply      float64 `json:"drop_after_apply,omitempty"`
	DelayAfterApply     float64 `json:"delay_after_apply,omitempty"`
}

func (m Mix) probabilities() [faultCount]float64 {
	return [faultCount]float64{
		RefuseBeforeApply:   m.RefuseBeforeApply,
		Error5xxBeforeApply: m.Error5xxBeforeApply,
		Error5xxAfterApply:  m.Error5xxAfterApply,
		DropAfterApply:      m.DropAfterApply,
		DelayAfterApply:     m.DelayAfterApply,
	}
}

// Validate reports the first probability outside [0, 1], or a total above 1. Check a Mix that
// comes from user input (flags, an admin request) before handing it to New.
func (m Mix) Validate() error {
	var sum float64
	for f, p := range m.probabilities() {
		if Fault(f) == NoFault {
			continue
		}
		if math.IsNaN(p) || p < 0 || p > 1 {
			return fmt.Errorf("fault mix: %s probability %v must be between 0 and 1", Fault(f), p)
		}
		sum += p
	}
	// Allow rounding: 0.1+0.2+0.7 is a little above 1 in floating point.
	if sum > 1+1e-9 {
		return fmt.Errorf("fault mix: probabilities sum to %v, more than 1", sum)
	}
	return nil
}

// draw picks at most one fault with a single uniform draw, so each fault gets exactly its share.
func (m Mix) draw(rng *rand.Rand) Fault {
	u := rng.Float64()
	var acc float64
	for f, p := range m.probabilities() {
		if p == 0 {
			continue
		}
		acc += p
		if u < acc {
			return Fault(f)
		}
	}
	return NoFault
}
