package testkit

import (
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on loopback in front of a Postgres server, for drill 4 (a worker's
// database connection is cut): point a worker's URL at the proxy, then Cut it.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	delay time.Duration // before each new connection reaches the server
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// NewProxy starts a proxy to the host:port of dbURL and returns it with the URL to use
// instead. It is closed at t's cleanup.
func NewProxy(t testing.TB, dbURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("testkit.NewProxy: parsing %q: %v", dbURL, err)
	}
	if u.Port() == "" {
		t.Fatalf("testkit.NewProxy: %q has no TCP port (a socket URL cannot be proxied)", u.Redacted())
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testkit.NewProxy: %v", err)
	}
	p := &Proxy{ln: ln, target: u.Host, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	proxied := *u
	proxied.Host = ln.Addr().String()
	return p, proxied.String()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c] = true
		p.mu.Unlock()
		p.wg.Add(1)
		go p.pipe(c)
	}
}

func (p *Proxy) pipe(c net.Conn) {
	defer p.wg.Done()
	p.mu.Lock()
	target, delay := p.target, p.delay
	p.mu.Unlock()
	time.Sleep(delay)
	up, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns[up] = true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// Retarget sends new connections to hostPort from now on, as a failover moves the primary to
// another address behind a stable name; connections already open stay where they are.
func (p *Proxy) Retarget(hostPort string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = hostPort
}

// DelayConnects makes every new connection wait d before it reaches the server, as a server
// starved of CPU forks its backends slowly; connections already open are not slowed.
func (p *Proxy) DelayConnects(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Cut closes every proxied connection and refuses new ones, as a network partition between
// the worker and its database would.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Close stops the proxy.
func (p *Proxy) Close() {
	p.Cut()
	if err := p.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return
	}
	p.wg.Wait()
}
