package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestMergedCallsMatchSingle runs the same admissions once one call per
// decision and once merged into multi-op script runs (several tenants and
// policies, costs, reservations, @global), at the same fake times: the
// decisions must be identical, so merging never changes an answer.
func TestMergedCallsMatchSingle(t *testing.T) {
	redistest.SkipOnCluster(t, "merges different tenants' calls into one script run, which a Cluster refuses (CROSSSLOT); the limiter never merges on a Cluster")
	t.Parallel()
	ctx := context.Background()
	policies := map[string]string{
		"*":       "rate=20/s burst=3 concurrency=4 lease=2s",
		"@global": "rate=50/s burst=5",
		"b":       "rate=5/s burst=2 window=8/s quota=40/hour",
		"c":       "concurrency=2 lease=1s",
	}
	single := setup(t, false, &Config{MaxBatch: 1})
	merged := setup(t, false, nil)
	for _, e := range []*env{single, merged} {
		for name, text := range policies {
			e.policy(t, name, text)
		}
	}
	rng := rand.New(rand.NewPCG(7, 7))
	tenants := []string{"a", "b", "c", "d", ""}
	for round := 0; round < 150; round++ {
		n := 1 + rng.IntN(12)
		type req struct {
			tenant, id string
			cost       int64
			flags      int
		}
		reqs := make([]req, n)
		for i := range reqs {
			r := req{tenant: tenants[rng.IntN(len(tenants))], id: fmt.Sprintf("j%d", rng.IntN(30)), cost: 1, flags: flagHold}
			if r.tenant != "c" && r.tenant != "" && rng.IntN(4) == 0 {
				r.cost = 2
			}
			if rng.IntN(2) == 0 {
				r.flags |= flagReserve
			}
			reqs[i] = r
		}
		var want []Decision
		for _, r := range reqs {
			d, err := single.lim.do(ctx, Request{Tenant: r.tenant, ID: r.id, Cost: r.cost}, r.flags)
			require.NoError(t, err)
			want = append(want, d)
		}
		// the same requests as one merged script run
		var calls []*call
		var scopesOf [][]scope
		for _, r := range reqs {
			sc, err := merged.lim.scopes(ctx, r.tenant)
			require.NoError(t, err)
			keys, aa := merged.lim.encodeAdmit(r.id, r.cost, r.flags, sc, 0)
			calls = append(calls, &call{script: nil, keys: keys, admit: aa, done: make(chan struct{}, 1)})
			scopesOf = append(scopesOf, sc)
		}
		u := mergeAdmits(calls)
		res, err := u.script.Run(ctx, merged.client, u.keys, u.args...).Result()
		require.NoError(t, err)
		ops := res.([]any)
		require.Len(t, ops, n+1)
		for i := range reqs {
			got, err := merged.lim.decode([]any{ops[i], ops[n]}, scopesOf[i])
			require.NoError(t, err)
			if got.Allowed && reqs[i].flags&flagHold != 0 {
				got.Lease = want[i].Lease
			}
			require.Equal(t, want[i], got, "round %d op %d %+v", round, i, reqs[i])
		}
		step := rng.IntN(200)
		single.clock.Advance(msec(step))
		merged.clock.Advance(msec(step))
		// releases go through the merged path too
		for _, r := range reqs[:n/2] {
			require.NoError(t, single.lim.Release(ctx, r.tenant, r.id))
			require.NoError(t, merged.lim.Release(ctx, r.tenant, r.id))
		}
	}
}

func msec(n int) time.Duration { return time.Duration(n) * time.Millisecond }
