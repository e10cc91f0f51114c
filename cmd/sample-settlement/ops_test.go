package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
	"github.com/stepwise-go/stepwise/internal/testkit/fakebank"
	"github.com/stepwise-go/stepwise/workflowtest"
)

// startServe starts "sample-settlement serve" in a real child process and returns it with
// the address it serves HTTP on.
func startServe(t *testing.T, id string, args ...string) (*workflowtest.Process, string) {
	t.Helper()
	all := append([]string{"serve", "--addr", "127.0.0.1:0", "--id", id}, args...)
	p := workflowtest.Start(t, "cli", "SS_ARGS="+strings.Join(all, argsSep))
	waitCtx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	line, err := p.WaitForLine(waitCtx, "serving: ")
	require.NoError(t, err)
	m := servingRE.FindStringSubmatch(line)
	require.NotNil(t, m, line)
	return p, m[1]
}

// leaseTrouble counts the audit events that mean a run lost its lease while this test ran:
// takeovers by maintenance, fenced commits, runs claimed more than once, and failed steps.
type leaseTrouble struct {
	takeovers, fenced, stepErrors, maxClaims int
}

func readLeaseTrouble(t *testing.T, pool *pgxpool.Pool) leaseTrouble {
	t.Helper()
	var lt leaseTrouble
	err := pool.QueryRow(context.Background(), `SELECT
		count(*) FILTER (WHERE kind = 'run.takeover'),
		count(*) FILTER (WHERE kind = 'lease.fenced'),
		count(*) FILTER (WHERE kind = 'run.step_error'),
		coalesce((SELECT max(n) FROM (SELECT count(*) AS n FROM stepwise_event WHERE kind = 'lease.claim' GROUP BY subject) c), 0)
		FROM stepwise_event`).Scan(&lt.takeovers, &lt.fenced, &lt.stepErrors, &lt.maxClaims)
	require.NoError(t, err)
	return lt
}

// Issue 15 item 1: an anonymous flood of /metrics must not starve the service's pool. One
// serve process settles a date while 500 concurrent clients scrape /metrics (and /healthz)
// without pause; no run may lose its lease (each run claimed once, no takeover, no fenced
// commit, no failed step) and health must keep answering. FLOOD_SCRAPERS=0 measures the
// unflooded baseline of the same settle; FLOOD_INTERVAL changes each scraper's poll.
func TestMetricsFloodCostsNoLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := seededDBURL(t)
	bank := fakebank.New(&fakebank.Config{Seed: 7, Latency: 2 * time.Millisecond})
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	common := []string{"--database-url", dbURL, "--bank-url", bank.URL(), "--shards", "4"}

	// The serve process reaches its database through 5ms of latency, so that a query costs
	// what it costs in production, not what it costs over loopback.
	slowDB := latencyProxy(t, dbURL, 5*time.Millisecond)
	_, addr := startServe(t, "flood-1", "--database-url", slowDB, "--bank-url", bank.URL(), "--shards", "4",
		"--batch-size", "10", "--lease", "3s", "--scheduler=false")

	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	// The flood: 500 clients, each on its own connection, scraping without pause.
	scrapers := 500
	if v := os.Getenv("FLOOD_SCRAPERS"); v != "" {
		scrapers, _ = strconv.Atoi(v)
	}
	pollEvery := time.Second
	if v := os.Getenv("FLOOD_INTERVAL"); v != "" {
		pollEvery, _ = time.ParseDuration(v)
	}
	floodCtx, stopFlood := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	var transportErrs atomic.Int64
	var worst atomic.Int64 // slowest scrape, in ms
	for i := 0; i < scrapers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 30 * time.Second}
			defer client.CloseIdleConnections()
			path := "/metrics"
			if i%10 == 0 {
				path = "/healthz"
			}
			for floodCtx.Err() == nil {
				req, _ := http.NewRequestWithContext(floodCtx, http.MethodGet, "http://"+addr+path, nil)
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					if floodCtx.Err() == nil {
						transportErrs.Add(1)
						time.Sleep(10 * time.Millisecond)
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				// A scraper polls every second: 500 scrapes a second offered in all, where
				// Prometheus scrapes once every 15s. (A test process on a 2-core machine
				// cannot offer much more without starving the bank it also runs.)
				time.Sleep(pollEvery)
				if ms := time.Since(start).Milliseconds(); ms > worst.Load() {
					worst.Store(ms)
				}
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			}
		}(i)
	}
	time.Sleep(time.Second) // the flood is on before the settle starts

	start := time.Now()
	r := runCLI(t, append([]string{"settle", "--date", testDateText, "--work=false"}, common...)...)
	require.Equal(t, 0, r.code, r.stderr)
	plan, err := settlement.Plan{Shards: 4}.Compile()
	require.NoError(t, err)
	// Unflooded, the date settles in about 3s here; a minute is ample slack for a loaded machine.
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	p, restErr := settlement.WaitAtRest(waitCtx, pool, plan, testDate, 200*time.Millisecond, nil)
	settleTook := time.Since(start)
	stopFlood()
	wg.Wait()

	lt := readLeaseTrouble(t, pool)
	var summary []string
	for code, n := range codes {
		summary = append(summary, http.StatusText(code)+"="+itoa(int64(n)))
	}
	sort.Strings(summary)
	t.Logf("flood of %d scrapers during a settle of %s: responses %v, transport errors %d, slowest response %dms; takeovers %d, fenced %d, step errors %d, max claims per run %d",
		scrapers, settleTook.Round(time.Millisecond), summary, transportErrs.Load(), worst.Load(), lt.takeovers, lt.fenced, lt.stepErrors, lt.maxClaims)

	require.NoError(t, restErr, "the date did not settle during the flood: runs %v payouts %v", p.Runs, p.Operations)
	require.Zero(t, lt.takeovers, "a run was taken over: its worker lost the lease during the flood")
	require.Zero(t, lt.fenced, "a commit was fenced: a worker lost its lease during the flood")
	require.Zero(t, lt.stepErrors, "a step failed during the flood")
	require.Equal(t, 1, lt.maxClaims, "every run is claimed once: its token never changes")
	require.Zero(t, codes[http.StatusInternalServerError], "no scrape may fail with a 500")

	// Health still answers at once after the flood.
	resp, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

func init() {
	// "latency-proxy" forwards LATENCY_TARGET (host:port) with LATENCY_DELAY added to every
	// chunk the database receives, in a process of its own so that the load of the test
	// process (a flood of scrapes) does not slow the proxy too.
	workflowtest.RegisterRole("latency-proxy", func(ctx context.Context, env map[string]string) error {
		delay, err := time.ParseDuration(env["LATENCY_DELAY"])
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		fmt.Printf("proxy listening on %s\n", ln.Addr())
		go func() { <-ctx.Done(); ln.Close() }()
		for {
			c, err := ln.Accept()
			if err != nil {
				return nil
			}
			up, err := net.Dial("tcp", env["LATENCY_TARGET"])
			if err != nil {
				c.Close()
				continue
			}
			go func() { // to the database: each chunk (a query, a sync) arrives late
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						time.Sleep(delay)
						if _, werr := up.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				up.Close()
				c.Close()
			}()
			go func() {
				_, _ = io.Copy(c, up)
				c.Close()
				up.Close()
			}()
		}
	})
}

// latencyProxy puts delay in front of every request the database receives through it, as a
// database a few milliseconds away (another zone, a busy server) would. It returns the URL to
// connect through; the proxy process ends with the test.
func latencyProxy(t *testing.T, dbURL string, delay time.Duration) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	p := workflowtest.Start(t, "latency-proxy", "LATENCY_TARGET="+u.Host, "LATENCY_DELAY="+delay.String())
	waitCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	line, err := p.WaitForLine(waitCtx, "proxy listening on ")
	require.NoError(t, err)
	proxied := *u
	proxied.Host = strings.TrimSpace(strings.TrimPrefix(line[strings.Index(line, "proxy listening on "):], "proxy listening on "))
	return proxied.String()
}
