/*
Package httpsend is what an outbox Sender written on net/http needs: it sends an operation's
request once, without the transport resending it by itself, and classifies a failure by what
happened on the wire rather than by the error's text.

# Why a plain http.Client is not enough

net/http's Transport resends some requests by itself when a kept-alive connection dies after
it wrote them: GET, HEAD, OPTIONS and TRACE, and any request that has no body or one it can
rewind (Request.GetBody, which http.NewRequest sets for a bytes.Reader, bytes.Buffer or
strings.Reader) and carries a header named exactly "Idempotency-Key" or
"X-Idempotency-Key" (Request.isReplayable in net/http; Header.Set stores the name in that
canonical form). Such a POST, written on a kept-alive connection that dies before the first
byte of the answer, is resent on another connection, though the service may have processed
it, and Client.Do returns the error of the resend only. A resend that found the service
gone returns "connection refused" for a request the service processed. A Sender that reads
"connection refused" as "never sent" (outbox.NotSent) has the outbox send the operation once
more, and a service that does not deduplicate pays twice; one that does deduplicate was paid
twice by the transport alone if the resend reached it, unseen by the ledger.

# What Do does

Do sends one request through the Client given, and:

  - makes the request unreplayable: its GetBody is cleared, so the Transport cannot rewind
    a body it has read (HTTP/1 and HTTP/2 alike), and a bodiless request's Idempotency-Key or
    X-Idempotency-Key header is stored under a lower-case name (header names are
    case-insensitive on the wire; net/http looks only for the canonical names);
  - does not follow redirects: a 307 or 308 would resend the body elsewhere, and any
    redirect is the service's answer to the request, returned as such;
  - records what happened on the wire with net/http/httptrace (Wire): whether a connection
    was obtained and whether it was reused, whether the request's header block was written,
    whether the write finished, whether an answer began, and whether the transport began
    another attempt after one had written the request (a replay). The above prevents replays
    of every method but GET, HEAD, OPTIONS and TRACE, which net/http resends whatever Do
    does: never perform an operation with them. Should a replay of another method start
    anyway, Do cancels the request's context at once;
  - reads the whole answer (at most MaxAnswerBytes).

A failure without an answer is an *Error carrying the Wire. It is wrapped in outbox.NotSent
only when the wire proves the service never received the request: no attempt obtained a
connection (a refused or failed dial, a DNS or TLS handshake failure, a context that ended
first), or every attempt's write ended before the header block was complete, so no server
can have dispatched it. Anything else, including a reset, EOF or timeout after the headers
were written and any failure after a replay, is returned as is, and the outbox records the
operation UNKNOWN_EXTERNAL for the reconciler. Only a written request can take effect, and
the header block is counted as written as soon as net/http has buffered it, so the
classification errs only on the side of "unknown".

# Classifying an answer

What an HTTP status proves depends on the service: a 429 or 400 from a proxy in front of it
proves nothing about the service, and a 401 from an expired credential is not a refusal of
the payment. Rules says, from the service's own documentation, which answers confirm the
operation (by default any 2xx), which refuse it for good (outbox.Permanent; by default none)
and which prove it was not processed (outbox.NotSent; by default none). Every other answer is
returned as a *StatusError, UNKNOWN_EXTERNAL.

# A Sender

	func (s PayoutSender) Send(ctx context.Context, op *outbox.Operation) (outbox.Receipt, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/payouts", bytes.NewReader(op.Payload))
		if err != nil {
			return outbox.Receipt{}, outbox.NotSent(err) // nothing was sent
		}
		req.Header.Set("Idempotency-Key", op.IdempotencyKey())
		req.Header.Set("Content-Type", "application/json")
		ans, err := httpsend.Do(s.Client, req)
		if err != nil {
			return outbox.Receipt{}, err // outbox.NotSent only when the wire proves it
		}
		if err := s.Rules.Classify(ans); err != nil {
			return outbox.Receipt{}, err
		}
		return outbox.Receipt{ExternalRef: payoutID(ans.Body)}, nil
	}

with, for a service documenting 422 as a final decline and 429 with its own marker header as
"not processed, resend":

	Rules: httpsend.Rules{
		Refused:      func(a *httpsend.Answer) bool { return a.Status == http.StatusUnprocessableEntity },
		NotProcessed: func(a *httpsend.Answer) bool { return a.Status == http.StatusTooManyRequests && a.Header.Get("X-Not-Processed") == "true" },
	}

workflowtest/fakebank's Client and Sender are built this way.

# Kept-alive connections

A request written on a kept-alive connection that the service closed as idle at the same
moment looks, on the wire, exactly like one the service processed before dying: both are
UNKNOWN_EXTERNAL, and the reconciler asks. To keep that race rare, set the Transport's
IdleConnTimeout below the service's keep-alive timeout.
*/
package httpsend
