package queue

import (
	"sync"
	"time"
)

// lineFresh is how long a producer takes a tenant's line it has just put a
// job in for one that still holds jobs: a job of that tenant arriving
// meanwhile would wait behind them anyway, so it is parked at once,
// undecided. Should the line have emptied in between, the job waits a
// pump's turn (its line begins, so its tenant is due at once) instead of
// going straight.
const lineFresh = 50 * time.Millisecond

// lineMemory remembers, per tenant and queue, when this producer last put
// a job in the tenant's line.
type lineMemory struct {
	mu     sync.Mutex
	seen   map[lineKey]time.Time
	pruned time.Time
}

type lineKey struct{ tenant, queue string }

// linePrune is how many lines the memory holds before it drops the ones
// it saw longer than lineFresh ago (at most every lineFresh).
const linePrune = 4096

func (m *lineMemory) saw(tenant, queue string) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil {
		m.seen = map[lineKey]time.Time{}
	}
	if len(m.seen) >= linePrune && now.Sub(m.pruned) >= lineFresh {
		m.pruned = now
		for k, at := range m.seen {
			if now.Sub(at) >= lineFresh {
				delete(m.seen, k)
			}
		}
	}
	m.seen[lineKey{tenant, queue}] = now
}

// waiting reports whether this producer put a job in tenant's line of
// queue within lineFresh.
func (m *lineMemory) waiting(tenant, queue string) bool {
	m.mu.Lock()
	at, ok := m.seen[lineKey{tenant, queue}]
	m.mu.Unlock()
	return ok && time.Since(at) < lineFresh
}
