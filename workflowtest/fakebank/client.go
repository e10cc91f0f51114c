package fakebank

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/stepwise-go/stepwise/internal/outbox"
	"github.com/stepwise-go/stepwise/outbox/httpsend"
)

// Client calls a Bank over HTTP, from the same process or another one. It is safe for
// concurrent use.
type Client struct {
	baseURL string
	hc      *http.Client
}

// NewClient returns a client for the bank at baseURL (Bank.URL). A nil hc gets a client with
// DefaultClientTimeout.
func NewClient(baseURL string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{Timeout: DefaultClientTimeout}
	}
	return &Client{baseURL: strings.TrimRight(baseURL, "/"), hc: hc}
}

// Pay asks the bank to apply req under key. The same key with the same request returns the
// payment the bank stored the first time, however many times it is sent.
//
// On error, classify before acting: IsDeclined (permanent), IsNotProcessed (safe to resend),
// IsConflict (a bug: the key was used for another payment); anything else is ambiguous and the
// payment may have been applied. The request is sent with httpsend.Do, so net/http never
// resends it by itself (a bank that does not deduplicate would pay twice) and a failure is
// not-processed only when the wire proves the request never reached the bank.
func (c *Client) Pay(ctx context.Context, key string, req PaymentRequest) (*Payment, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("fakebank: pay %q: encoding request: %w", key, err)
	}
	hdr := http.Header{"Idempotency-Key": {key}, "Content-Type": {"application/json"}}
	res, err := c.do(ctx, "pay", key, http.MethodPost, "/payments", hdr, body)
	if err != nil {
		return nil, err
	}
	if res.status != http.StatusOK && res.status != http.StatusCreated {
		return nil, res.err()
	}
	return decodeResult[Payment](res)
}

// Lookup returns the payment the bank holds under key, declined ones included (Status
// "failed"). It returns an error matching ErrNotFound when the bank has none.
func (c *Client) Lookup(ctx context.Context, key string) (*Payment, error) {
	res, err := c.do(ctx, "lookup", key, http.MethodGet, "/payments/"+url.PathEscape(key), nil, nil)
	if err != nil {
		return nil, err
	}
	switch res.status {
	case http.StatusOK:
		return decodeResult[Payment](res)
	case http.StatusNotFound:
		if e := res.err(); bankCode(e.Body) == codeNotFound {
			e.Err = ErrNotFound
			return nil, e
		}
	}
	return nil, res.err()
}

// Statement returns the succeeded payments the query selects, in the order the bank applied them.
func (c *Client) Statement(ctx context.Context, q StatementQuery) ([]Payment, error) {
	v := url.Values{}
	if q.Currency != "" {
		v.Set("currency", q.Currency)
	}
	if !q.From.IsZero() {
		v.Set("from", q.From.Format(time.RFC3339Nano))
	}
	if !q.To.IsZero() {
		v.Set("to", q.To.Format(time.RFC3339Nano))
	}
	path := "/statement"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	res, err := c.do(ctx, "statement", "", http.MethodGet, path, nil, nil)
	if err != nil {
		return nil, err
	}
	if res.status != http.StatusOK {
		return nil, res.err()
	}
	out, err := decodeResult[[]Payment](res)
	if err != nil {
		return nil, err
	}
	return *out, nil
}

// Ledger returns the bank's ledger, for checking invariants from another process.
func (c *Client) Ledger(ctx context.Context) (*Ledger, error) {
	res, err := c.do(ctx, "ledger", "", http.MethodGet, "/admin/ledger", nil, nil)
	if err != nil {
		return nil, err
	}
	if res.status != http.StatusOK {
		return nil, res.err()
	}
	return decodeResult[Ledger](res)
}

// SetFaults replaces the bank's random fault mix, as Bank.SetFaults does.
func (c *Client) SetFaults(ctx context.Context, m Mix) error {
	body, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("fakebank: set faults: encoding mix: %w", err)
	}
	hdr := http.Header{"Content-Type": {"application/json"}}
	res, err := c.do(ctx, "set faults", "", http.MethodPost, "/admin/faults", hdr, body)
	if err != nil {
		return err
	}
	if res.status != http.StatusOK {
		return res.err()
	}
	return nil
}

type result struct {
	op, key string
	status  int
	header  http.Header
	body    []byte
}

func (r *result) err() *Error {
	return &Error{
		Op:           r.op,
		Key:          r.key,
		StatusCode:   r.status,
		NotProcessed: r.status == http.StatusTooManyRequests && r.header.Get(HeaderNotProcessed) == "true",
		Declined:     r.status == http.StatusUnprocessableEntity && bankCode(string(r.body)) == codeDeclined,
		Body:         string(r.body),
	}
}

// do sends one request and reads the whole answer. A request that may change the bank (a
// POST) goes through httpsend.Do, which stops net/http from resending it by itself and says
// from the wire whether it provably never reached the bank: only then is the failure
// NotProcessed. A read (GET) goes through the http.Client as is: net/http may resend it, which
// is harmless, its answer (a whole ledger or request log) may be large, and "not processed"
// means nothing for it. A failure to read the body of an answer that did arrive is ambiguous
// like any other, so it keeps the status for the message but not for classification.
func (c *Client) do(ctx context.Context, op, key, method, path string, hdr http.Header, body []byte) (*result, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+path, rd)
	if err != nil {
		return nil, &Error{Op: op, Key: key, NotProcessed: true, Err: fmt.Errorf("building request: %w", err)}
	}
	for k, vs := range hdr {
		req.Header[http.CanonicalHeaderKey(k)] = vs
	}
	if method == http.MethodGet {
		resp, err := c.hc.Do(req)
		if err != nil {
			return nil, &Error{Op: op, Key: key, Err: err}
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, &Error{Op: op, Key: key, StatusCode: resp.StatusCode, Err: fmt.Errorf("reading answer: %w", err)}
		}
		return &result{op: op, key: key, status: resp.StatusCode, header: resp.Header, body: data}, nil
	}
	ans, err := httpsend.Do(c.hc, req)
	if err != nil {
		var he *httpsend.Error
		status := 0
		if errors.As(err, &he) {
			status = he.Status
		}
		return nil, &Error{Op: op, Key: key, StatusCode: status, NotProcessed: outbox.IsNotSent(err), Err: err}
	}
	return &result{op: op, key: key, status: ans.Status, header: ans.Header, body: ans.Body}, nil
}

func decodeResult[T any](r *result) (*T, error) {
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		return nil, &Error{Op: r.op, Key: r.key, StatusCode: r.status, Body: string(r.body),
			Err: fmt.Errorf("decoding answer: %w", err)}
	}
	return &v, nil
}

// bankCode returns the code from the bank's error body, or "" for any other body.
func bankCode(body string) string {
	var eb errorBody
	if err := json.Unmarshal([]byte(body), &eb); err != nil {
		return ""
	}
	return eb.Code
}

// Requests returns the bank's request log (Bank.Requests), for checking send discipline from
// another process.
func (c *Client) Requests(ctx context.Context) ([]Request, error) {
	res, err := c.do(ctx, "requests", "", http.MethodGet, "/admin/requests", nil, nil)
	if err != nil {
		return nil, err
	}
	if res.status != http.StatusOK {
		return nil, res.err()
	}
	out, err := decodeResult[[]Request](res)
	if err != nil {
		return nil, err
	}
	return *out, nil
}
