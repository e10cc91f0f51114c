// Package console is an operator's web console for a Stepwise service: an http.Handler to
// mount beside River UI that shows schedules and their slots' evidence-based status, runs
// and their event trail, operations and their audit rows, and totals against an external
// statement; and that lets a person cancel a run, resume one and resolve a MANUAL
// operation, through the service's stepwise.Client.
//
// # Mounting
//
//	auth, err := console.LoadAuth(logger) // CONSOLE_USERS, RIVERUI_USER, …: who may sign in
//	h, err := console.New(pool, &console.Config{
//		Prefix:       "/console",
//		Client:       client,       // the service's *stepwise.Client: Resume, Resolve, requests, Totals
//		Authenticate: auth.Console, // nil: read-only, loopback only
//		Guard:        auth.Guard,   // one budget of failed sign-ins with River UI
//	})
//	mux.Handle("/console/", h)
//	mux.Handle("/riverui/", console.Protect(riverUI, "River UI", auth, 4, logger))
//	srv := console.NewServer(console.Harden(mux, hosts, logger))
//
// Protect, Harden and NewServer are the rest of an operator's HTTP surface (River UI, an
// endpoint of the service's own), in the order that is safe; see surface.go.
//
// With Client, the console resolves the operations of the kinds the client has, running
// their outcome callbacks as the client does, and compares each kind that has a Statement
// (stepwise.KindConfig.Statement) with the ledger on its Totals page: it needs no adapter and
// no second map of kinds. Without it, it only reads. A console outside the service builds its client with stepwise.NewOperatorClient.
//
// Pages are server-rendered (html/template), with no script and no asset fetched from
// anywhere: the console works on an air-gapped operations network.
//
// # Security
//
//   - Without Authenticate, the console is read-only and answers only requests from a
//     loopback peer that carry no forwarding header (a reverse proxy on the same host would
//     otherwise make every visitor "local"), under a loopback Host or one in Config.Hosts
//     (DNS rebinding); anything else gets 403 or 421 with the fix.
//   - With Authenticate, every request needs credentials, reads included: ParseUsers (one
//     identity per operator, bcrypt hashes), ProxyUser (an authenticating proxy's header,
//     from the proxy's addresses only) or BasicAuth (one shared account).
//   - Failed sign-ins are limited per peer and in all, and logged (Guard); credentials are
//     checked before a request takes a slot (Config.MaxInFlight) or has its body read.
//   - Every action is a POST that needs credentials, a same-origin request (Sec-Fetch-Site
//     "same-origin", or an Origin equal to the request's own) and the CSRF token of the page
//     it was made from (bound to the user). The actor recorded is the authenticated user,
//     never a form field.
//   - Every action writes a 'console.action' event (actor, reason, peer) in the same
//     transaction as the change.
//
// # Cost on a large ledger
//
// Lists use keyset pagination (never OFFSET), and every filter is served by an index; see
// the comments on the queries and docs/console.md for the plans. Counts on the overview are
// capped (10,000+) so that the overview's cost does not grow with history.
package console
