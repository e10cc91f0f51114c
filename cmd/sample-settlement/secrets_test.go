package main

import (
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stepwise-go/stepwise/workflowtest/fakebank"
)

// The passwords of this test: none may appear in any output.
const (
	dbSecret   = "s3cret-db-pw"
	bankSecret = "s3cret-bank-pw"
)

// withPassword puts user:password into rawURL.
func withPassword(t *testing.T, rawURL, user, password string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	u.User = url.UserPassword(user, password)
	return u.String()
}

func requireNoSecret(t *testing.T, what, out string) {
	t.Helper()
	require.NotContains(t, out, dbSecret, "%s printed the database password:\n%s", what, out)
	require.NotContains(t, out, bankSecret, "%s printed the bank password:\n%s", what, out)
}

// No password in any help, log line or error. --help of every command runs
// with DATABASE_URL and BANK_URL carrying passwords (flag defaults come from them); commands
// fail against a database that does not answer and a bank URL that does not parse; and a
// real serve process runs, verbose, on a database and a bank URL with passwords, and is
// stopped. (The server trusts local connections, so the password is accepted and ignored.)
func TestNoPasswordInOutput(t *testing.T) {
	seeded := seededDBURL(t) // before DATABASE_URL points nowhere: the test kit reads it too
	t.Setenv("DATABASE_URL", "postgres://ops:"+dbSecret+"@127.0.0.1:1/none")
	t.Setenv("BANK_URL", "http://payer:"+bankSecret+"@127.0.0.1:1")

	for _, name := range prog.Names() {
		r := runCLI(t, name, "--help")
		requireNoSecret(t, name+" --help", r.stdout+r.stderr)
	}
	for _, args := range [][]string{
		{"report", "--date", testDateText},
		{"invariants", "--date", testDateText},
		{"migrate"},
		{"settle", "--date", testDateText},
		{"serve", "--addr", "127.0.0.1:0"},
		{"serve", "--bank-url", "http://payer:" + bankSecret + "@%zz"},
		{"settle", "--date", testDateText, "--database-url", "postgres://ops:" + dbSecret + "@%zz/x"},
		{"resolve", "--to", "SUCCEEDED", "--reason", "r", "00000000-0000-0000-0000-000000000000"},
	} {
		r := runCLI(t, args...)
		require.NotEqual(t, 0, r.code, "%v against nothing must fail", args)
		requireNoSecret(t, strings.Join(args, " "), r.stdout+r.stderr)
	}

	// A real serve process, verbose, with both passwords, from start to SIGTERM.
	bank := fakebank.New(nil)
	require.NoError(t, bank.Start())
	t.Cleanup(func() { _ = bank.Close() })
	dbURL := withPassword(t, seeded, "postgres", dbSecret)
	p, _ := startServe(t, "secrets", "-v", "--database-url", dbURL, "--bank-url", withPassword(t, bank.URL(), "payer", bankSecret), "--scheduler=false")
	r := runCLI(t, "settle", "--date", testDateText, "--work=false", "--database-url", dbURL)
	require.Equal(t, 0, r.code, r.stderr)
	time.Sleep(2 * time.Second) // some work logged
	require.NoError(t, p.Signal(syscall.SIGTERM))
	require.NoError(t, p.Wait())
	out := strings.Join(p.Lines(), "\n")
	require.Contains(t, out, "serving: ")
	require.Contains(t, out, "payer:xxxxx@", "the bank URL is shown, redacted")
	requireNoSecret(t, "serve -v", out)
}
