package main

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/sluicehq/sluice/internal/cmdline"
)

// ttlTick is how often the embedded Redis's key TTLs are counted down.
const ttlTick = time.Second

// embedded is the in-memory Redis a worker started with --redis
// memory://ADDR runs for a single-machine trial: miniredis, listening on
// ADDR so that enqueue and sluice in other terminals reach it.
type embedded struct {
	*miniredis.Miniredis
	stop chan struct{}
	wg   sync.WaitGroup
}

// startEmbedded starts the embedded Redis on addr.
func startEmbedded(addr string) (*embedded, error) {
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr(addr); err != nil {
		hint := ""
		if errors.Is(err, syscall.EADDRINUSE) {
			host, _, _ := net.SplitHostPort(addr)
			hint = fmt.Sprintf("; another Redis or worker may be listening there: pick another port, e.g. --redis memory://%s", net.JoinHostPort(host, "6380"))
		}
		return nil, fmt.Errorf("cannot start the embedded Redis on %s: %v%s", addr, cmdline.ListenCause(err), hint)
	}
	e := &embedded{Miniredis: m, stop: make(chan struct{})}
	// miniredis counts TTLs down only when told to; sluice does not need
	// keys to expire, but memory is reclaimed as on a real Redis this way.
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		t := time.NewTicker(ttlTick)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-e.stop:
				return
			case now := <-t.C:
				m.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	return e, nil
}

// Close stops the embedded Redis; its data is gone.
func (e *embedded) Close() {
	close(e.stop)
	e.wg.Wait()
	e.Miniredis.Close()
}
