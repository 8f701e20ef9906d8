package worker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/throttle"
)

// TestOverflow: a job's overflow mode and in-process budget come from its
// tenant's policy (or @global's, for a job without a tenant), with the
// defaults filled in: no policy or no overflow defers, overflow=wait
// without max_wait waits MaxWaitDefault.
func TestOverflow(t *testing.T) {
	t.Parallel()
	g := &Gate{cfg: GateConfig{InProcessWait: 200 * time.Millisecond}}
	wait := &throttle.Policy{Overflow: throttle.OverflowWait}
	for _, c := range []struct {
		name       string
		tenant     string
		own, glob  *throttle.Policy
		wantMode   throttle.Overflow
		wantBudget time.Duration
	}{
		{"no policy", "acme", nil, nil, throttle.OverflowDefer, 200 * time.Millisecond},
		{"no overflow", "acme", &throttle.Policy{}, nil, throttle.OverflowDefer, 200 * time.Millisecond},
		{"wait, default max_wait", "acme", wait, nil, throttle.OverflowWait, throttle.MaxWaitDefault},
		{"wait, short max_wait", "acme", &throttle.Policy{Overflow: throttle.OverflowWait, MaxWait: 50 * time.Millisecond}, nil, throttle.OverflowWait, 200 * time.Millisecond},
		{"drop", "acme", &throttle.Policy{Overflow: throttle.OverflowDrop}, wait, throttle.OverflowDrop, 200 * time.Millisecond},
		{"no tenant: @global's", "", nil, wait, throttle.OverflowWait, throttle.MaxWaitDefault},
	} {
		j := &job{tenant: c.tenant, policies: &policies{Policy: c.own, Global: c.glob}}
		mode, budget := g.overflow(j)
		require.Equal(t, c.wantMode, mode, c.name)
		require.Equal(t, c.wantBudget, budget, c.name)
	}
}
