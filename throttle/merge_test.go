package throttle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lua"
)

// TestMergedCallsMatchSingle runs the same admissions once one call per
// decision and once merged into multi-op script runs (several tenants and
// policies, costs, reservations, @global), at the same fake times: the
// decisions must be identical, so merging never changes an answer.
func TestMergedCallsMatchSingle(t *testing.T) {
	redistest.SkipOnCluster(t, "merges different tenants' calls into one script run, which a Cluster refuses (CROSSSLOT); the limiter never merges on a Cluster")
	t.Run("with @global", func(t *testing.T) {
		testMergedCalls(t, map[string]string{
			"*":       "rate=20/s burst=3 concurrency=4 lease=2s",
			"@global": "rate=50/s burst=5",
			"b":       "rate=5/s burst=2 window=8/s quota=40/hour",
			"c":       "concurrency=2 lease=1s",
		})
	})
	t.Run("rates and concurrency", func(t *testing.T) {
		testMergedCalls(t, map[string]string{
			"*": "rate=20/s burst=3 concurrency=4 lease=2s",
			"b": "rate=5/s burst=2 rate=100/min burst=4",
			"c": "concurrency=2 lease=1s",
		})
	})
}

func testMergedCalls(t *testing.T, policies map[string]string) {
	t.Parallel()
	ctx := context.Background()
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
			d.Claim = 0 // random per admission
			want = append(want, d)
		}
		// the same requests merged: each run of consecutive requests for
		// the same script goes out as one script run
		for i := 0; i < n; {
			var calls []*call
			var scopesOf [][]opScope
			first := i
			for ; i < n; i++ {
				r := reqs[i]
				sc, err := merged.lim.scopes(ctx, r.tenant)
				require.NoError(t, err)
				if len(sc) == 0 {
					// no rule applies: the limiter answers without Redis
					if len(calls) == 0 {
						first++
						continue
					}
					break
				}
				op := &admitOp{id: r.id, cost: r.cost, flags: r.flags, claim: newClaim()}
				for _, s := range sc {
					op.scopes = append(op.scopes, opScope{scope: s})
				}
				keys, aa := merged.lim.encode(op, merged.lim.clockArg(), merged.lim.estimatedNow())
				calls = append(calls, &call{script: lua.Admit, keys: keys, payload: aa, merge: admitMerge})
				scopesOf = append(scopesOf, op.scopes)
			}
			if len(calls) == 0 {
				continue
			}
			keys, args := admitMerge.lay(calls)
			res, err := lua.Admit.Run(ctx, merged.client, keys, args...).Result()
			require.NoError(t, err)
			ops := res.([]any)
			require.Len(t, ops, len(calls)+1)
			for j := range calls {
				r, err := decodeAdmit([]any{ops[j], ops[len(calls)]})
				require.NoError(t, err)
				got := r.decision(scopesOf[j])
				if got.Allowed && reqs[first+j].flags&flagHold != 0 {
					got.Lease = want[first+j].Lease
				}
				require.Equal(t, want[first+j], got, "round %d op %d %+v", round, first+j, reqs[first+j])
			}
		}
		step := rng.IntN(200)
		single.clock.Advance(msec(step))
		merged.clock.Advance(msec(step))
		// releases go through the merged path too
		for _, r := range reqs[:n/2] {
			require.NoError(t, single.lim.Release(ctx, r.tenant, r.id, 0))
			require.NoError(t, merged.lim.Release(ctx, r.tenant, r.id, 0))
		}
	}
}

func msec(n int) time.Duration { return time.Duration(n) * time.Millisecond }
