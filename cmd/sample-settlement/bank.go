package main

import (
	"flag"
	"net/url"
	"time"

	"github.com/stepwise-go/stepwise/cmd/sample-settlement/bankfake"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/cmdline"
	"github.com/stepwise-go/stepwise/cmd/sample-settlement/settlement"
)

// This file is where the commands get their bank: the one place that names an adapter. The
// sample's bank is Stepwise's fake one (package bankfake; "go run ./cmd/stepwise-lab bank"
// serves it, the demo starts one in its own process). To run the service against your
// provider, implement settlement.Bank for it and return yours from dialBank; nothing else in
// the service knows which bank it talks to.

// dialBank returns the bank at bankURL, each call bounded by timeout.
func dialBank(bankURL string, timeout time.Duration) settlement.Bank {
	return bankfake.Dial(bankURL, timeout)
}

// bankFlags name the bank.
type bankFlags struct {
	url string
}

func (f *bankFlags) register(fs *flag.FlagSet) {
	f.url = envOr("BANK_URL", defaultBankURL)
	fs.Var(secretURL{&f.url}, "bank-url", "base URL of the bank (\"stepwise-lab bank\" serves a fake one) ($BANK_URL)")
}

// client returns the bank --bank-url names, each call bounded by timeout.
func (f *bankFlags) client(timeout time.Duration) (settlement.Bank, error) {
	u, err := url.Parse(f.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, cmdline.UsageError("--bank-url %q: want a URL such as %s", cmdline.RedactURL(f.url), defaultBankURL)
	}
	return dialBank(f.url, timeout), nil
}
