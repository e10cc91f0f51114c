package console

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
)

// minPasswordLen is the shortest CONSOLE_PASSWORD / RIVERUI_PASSWORD serve accepts. Guards
// against a one-character shared password guarded by nothing but the failure limit.
const minPasswordLen = 12

// Auth is who may sign in to the operator surface (console and River UI), as the
// environment configures it, and the limits every surface of the process shares.
type Auth struct {
	// Console authenticates the console's operators; nil: the console is read-only and
	// answers loopback only.
	Console func(*http.Request) (string, bool)
	// ConsoleFrom says where the console's operators come from, for the start-up line.
	ConsoleFrom string
	// RiverUser, RiverPassword: River UI's one account; empty: read-only, loopback.
	RiverUser, RiverPassword string
	// Guard limits and logs failed sign-ins on every surface together: pass it as
	// Config.Guard too. LoadAuth makes it, trusting CONSOLE_TRUSTED_PROXIES' X-Forwarded-For.
	Guard *Guard
}

// LoadAuth reads the operators' credentials:
//
//   - CONSOLE_USERS: the path of a file of "name:bcrypt-hash" lines, one per operator (what
//     "htpasswd -nBC 12 NAME" prints); every console action is audited under the name;
//   - or CONSOLE_USER and CONSOLE_PASSWORD: one shared console account (the audit names
//     only that account);
//   - or CONSOLE_PROXY_USER_HEADER: an authenticating reverse proxy names the operator in
//     that header, believed only from CONSOLE_TRUSTED_PROXIES (see ProxyUser);
//   - CONSOLE_TRUSTED_PROXIES: the addresses of the proxies in front (addresses or CIDR
//     prefixes, comma-separated); failed sign-ins relayed by them count against the client
//     they name in X-Forwarded-For, not against the proxy;
//   - RIVERUI_USER and RIVERUI_PASSWORD: River UI's account.
//
// A pair set by half is refused (it used to leave that surface anonymous without a word),
// as are both console forms at once and a password shorter than 12 characters. The Guard
// logs to logger (nil: slog.Default()).
func LoadAuth(logger *slog.Logger) (*Auth, error) {
	a := &Auth{Guard: NewGuard(logger)}
	usersFile := os.Getenv("CONSOLE_USERS")
	user, password := os.Getenv("CONSOLE_USER"), os.Getenv("CONSOLE_PASSWORD")
	proxyHeader, proxies := os.Getenv("CONSOLE_PROXY_USER_HEADER"), os.Getenv("CONSOLE_TRUSTED_PROXIES")
	var list []string // CONSOLE_TRUSTED_PROXIES
	for _, p := range strings.Split(proxies, ",") {
		if p = strings.TrimSpace(p); p != "" {
			list = append(list, p)
		}
	}
	// The proxies' X-Forwarded-For is believed for the sign-in limits: behind a proxy every
	// visitor shares its address, and one guesser would lock every operator out.
	if err := a.Guard.TrustProxies(list); err != nil {
		return nil, fmt.Errorf("CONSOLE_TRUSTED_PROXIES: %v", err)
	}
	forms := 0
	for _, set := range []bool{usersFile != "", user != "" || password != "", proxyHeader != ""} {
		if set {
			forms++
		}
	}
	switch {
	case forms > 1:
		return nil, fmt.Errorf("more than one of CONSOLE_USERS, CONSOLE_USER/CONSOLE_PASSWORD and CONSOLE_PROXY_USER_HEADER are set: use one (CONSOLE_USERS names each operator in the audit trail)")
	case proxyHeader != "":
		if len(list) == 0 {
			return nil, fmt.Errorf("CONSOLE_PROXY_USER_HEADER needs CONSOLE_TRUSTED_PROXIES: the header names the operator, and is believed only from the proxy's addresses")
		}
		auth, err := ProxyUser(proxyHeader, list)
		if err != nil {
			return nil, fmt.Errorf("CONSOLE_PROXY_USER_HEADER/CONSOLE_TRUSTED_PROXIES: %v", err)
		}
		a.Console = auth
		a.ConsoleFrom = proxyHeader + " from " + strings.Join(list, ", ")
	case usersFile != "":
		users, err := loadUsers(usersFile)
		if err != nil {
			return nil, fmt.Errorf("CONSOLE_USERS: %v", err)
		}
		a.Console = users.authenticate
		a.ConsoleFrom = "CONSOLE_USERS (" + strings.Join(users.names(), ", ") + ")"
	case user != "" || password != "":
		if err := checkPair("CONSOLE_USER", user, "CONSOLE_PASSWORD", password, "the console"); err != nil {
			return nil, err
		}
		a.Console = BasicAuth(user, password)
		a.ConsoleFrom = "CONSOLE_USER (one shared account)"
	}
	a.RiverUser, a.RiverPassword = os.Getenv("RIVERUI_USER"), os.Getenv("RIVERUI_PASSWORD")
	if a.RiverUser != "" || a.RiverPassword != "" {
		if err := checkPair("RIVERUI_USER", a.RiverUser, "RIVERUI_PASSWORD", a.RiverPassword, "River UI"); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// checkPair refuses a user and password set by half, or a short password.
func checkPair(userVar, user, passwordVar, password, surface string) error {
	switch {
	case user == "":
		return fmt.Errorf("%s is set but %s is empty: %s would be anonymous (read-only) without a word; set both or neither", passwordVar, userVar, surface)
	case password == "":
		return fmt.Errorf("%s is set but %s is empty: %s would be anonymous (read-only) without a word; set both or neither", userVar, passwordVar, surface)
	case len(password) < minPasswordLen:
		return fmt.Errorf("%s has %d characters: want at least %d (a random one: openssl rand -base64 18)", passwordVar, len(password), minPasswordLen)
	}
	return nil
}
