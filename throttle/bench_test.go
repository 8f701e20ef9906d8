package throttle

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/asynqroom"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/waitroom"
)

// The engine's comparison with redis_rate (BenchmarkDecisions) lives in the
// bench module (bench/engine), so that the library does not depend on it.

func benchLimiter(b *testing.B, defaultPolicy string) (*Limiter, string) {
	b.Helper()
	client := redistest.Client(b)
	prefix := redistest.Prefix(b)
	lim, err := NewLimiter(client, &Config{Prefix: prefix})
	require.NoError(b, err)
	b.Cleanup(func() { _ = lim.Close() })
	p, err := ParsePolicy(defaultPolicy)
	require.NoError(b, err)
	require.NoError(b, lim.Policies().Set(context.Background(), DefaultPolicy, p))
	return lim, prefix
}

// BenchmarkTenantMemory reports the Redis memory one active tenant with one
// rate rule takes, and what an idle one leaves behind.
func BenchmarkTenantMemory(b *testing.B) {
	ctx := context.Background()
	lim, prefix := benchLimiter(b, "rate=10/s")
	client := redistest.Client(b)
	var total int64
	for i := 0; i < b.N; i++ {
		t := fmt.Sprintf("mem-%d", i)
		if _, err := lim.Admit(ctx, t, ""); err != nil {
			b.Fatal(err)
		}
		for _, k := range keysFor(prefix, t).all() {
			n, err := client.MemoryUsage(ctx, k).Result()
			if err == nil {
				total += n
			}
		}
	}
	b.ReportMetric(float64(total)/float64(b.N), "B/active-tenant")
}

// memKeys is how many keys of one tenant BenchmarkKeyMemory admits.
const memKeys = 100_000

// BenchmarkKeyMemory reports the Redis memory one active key below a
// tenant takes: 100,000 keys of one tenant, each admitted once under the
// tenant's key policy (TENANT/*), on a private server. B/key is the growth
// of the server's used_memory over the keys: what Redis pays, the
// keyspace's and the expiries' entries included. usage-B/key is MEMORY
// USAGE of each key's keys, as BenchmarkTenantMemory measures a tenant.
// "rate" has one rate rule, slow enough (1/min) that no key expires while
// the others are admitted (under 10/s a key lives 6 s); its hash holds the
// fields a faster rate's does. "concurrency" has a concurrency rule and
// each key's job still running (its slot held, under a 15-byte job id).
// The tenant itself has no policy, so its keys are all the growth.
func BenchmarkKeyMemory(b *testing.B) {
	for _, c := range []struct {
		name, policy string
		hold         bool
	}{
		{"rate", "rate=1/min", false},
		{"concurrency", "concurrency=10 lease=10m", true},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			client := redistest.NewServer(b, nil).Client(b)
			const prefix = "sluice"
			lim, err := NewLimiter(client, &Config{Prefix: prefix})
			require.NoError(b, err)
			b.Cleanup(func() { _ = lim.Close() })
			p, err := ParsePolicy(c.policy)
			require.NoError(b, err)
			var used, usage int64
			for i := 0; i < b.N; i++ {
				tenant := fmt.Sprintf("acme-%d", i)
				require.NoError(b, lim.Policies().Set(ctx, keyPolicyName(tenant, DefaultPolicy), p))
				admit := func(key string) {
					req := Request{Tenant: tenant, Key: key}
					if c.hold {
						req.ID = "job-" + key
					}
					d, err := lim.Do(ctx, req)
					if err == nil && !d.Allowed {
						err = fmt.Errorf("key %s denied: %s", key, d)
					}
					if err != nil {
						b.Error(err)
					}
				}
				// the scripts and the policies are loaded before the count
				admit("warm")
				keys0, mem0 := dbSize(b, client), usedMemory(b, client)
				var wg sync.WaitGroup
				for g := range 64 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for k := g; k < memKeys; k += 64 {
							admit(fmt.Sprintf("user-%06d", k))
						}
					}()
				}
				wg.Wait()
				if b.Failed() {
					return
				}
				keys1, mem1 := dbSize(b, client), usedMemory(b, client)
				require.Equal(b, int64(memKeys), keys1-keys0, "one hash per key, none expired")
				used += mem1 - mem0
				pipe := client.Pipeline()
				var cmds []*redis.IntCmd
				for k := range memKeys {
					cmds = append(cmds, pipe.MemoryUsage(ctx, keysFor(prefix, keyPolicyName(tenant, fmt.Sprintf("user-%06d", k))).state))
					if len(cmds) == 1000 || k == memKeys-1 {
						_, err := pipe.Exec(ctx)
						require.NoError(b, err)
						for _, cmd := range cmds {
							usage += cmd.Val()
						}
						cmds = cmds[:0]
					}
				}
			}
			n := float64(b.N * memKeys)
			b.ReportMetric(float64(used)/n, "B/key")
			b.ReportMetric(float64(usage)/n, "usage-B/key")
		})
	}
}

func dbSize(b *testing.B, c redis.UniversalClient) int64 {
	n, err := c.DBSize(context.Background()).Result()
	require.NoError(b, err)
	return n
}

// usedMemory is the server's used_memory (INFO memory).
func usedMemory(b *testing.B, c redis.UniversalClient) int64 {
	return infoInt(b, c, "memory", "used_memory")
}

// infoInt is the number field of INFO section.
func infoInt(tb testing.TB, c redis.UniversalClient, section, field string) int64 {
	tb.Helper()
	info, err := c.Info(context.Background(), section).Result()
	require.NoError(tb, err)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(tb, err)
			return n
		}
	}
	tb.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// BenchmarkTurn reports what a promotion turn costs Redis: a tenant
// whose rules never bind (the end-to-end round's policy: a rate, a burst
// and a concurrency rule far above its pace) has its line promoted in
// turns of 1, 4 and 16 jobs, each turn one script run, as the pump makes
// them. redis-µs/job is the server's own time for the runs (INFO
// commandstats), per job promoted; redis-µs/turn per run. The jobs are
// handed over to a stand-in engine outside the count.
func BenchmarkTurn(b *testing.B) {
	for _, k := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("jobs=%d", k), func(b *testing.B) { benchTurns(b, k, "") })
	}
}

// BenchmarkTurnHandOver reports what a promotion turn and the hand-over
// of its jobs to asynq cost Redis together, both ways: the turn's run,
// then handover.lua's (hand=script, as on a Cluster or with asynq on
// another server), and the turn handing its jobs over in its own run
// (hand=run, PumpConfig.Engine, one server). Each job's task is parked in
// asynq's schedule as the producer parks it (asynq v0.26's layout).
// redis-µs/job is the server's time in script runs per job handed over.
func BenchmarkTurnHandOver(b *testing.B) {
	for _, k := range []int{1, 4, 16} {
		for _, hand := range []string{"script", "run"} {
			b.Run(fmt.Sprintf("jobs=%d/hand=%s", k, hand), func(b *testing.B) { benchTurns(b, k, hand) })
		}
	}
}

// benchTurns runs turns of k jobs of a tenant whose rules never bind,
// each job's hand-over counted with its turn (hand "script" or "run") or
// not (hand "": a stand-in engine takes the jobs outside the count).
func benchTurns(b *testing.B, k int, hand string) {
	ctx := context.Background()
	client, room := turnBench(b)
	q := waitroom.DefaultQueue
	var layout *waitroom.EngineLayout
	if hand == "run" {
		layout = asynqroom.Engine()
	}
	handover := (&engine{}).handover
	if hand != "" {
		handover = asynqroom.Handover(client, true)
	}
	msg := strings.Repeat("m", 160)
	next, waiting := 0, 0
	var usec, jobs int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if waiting < k {
			b.StopTimer()
			ws := make([]waitroom.Waiter, 1000)
			pipe := client.Pipeline()
			for j := range ws {
				id := fmt.Sprintf("job-%d", next)
				ws[j] = waitroom.Waiter{ID: id}
				if hand != "" {
					pipe.HSet(ctx, asynqroom.TaskKey(q, id), "state", "scheduled", "msg", msg)
					pipe.ZAdd(ctx, "asynq:{"+q+"}:scheduled", redis.Z{Score: 1, Member: id})
				}
				next++
			}
			_, err := pipe.Exec(ctx)
			require.NoError(b, err)
			_, _, err = room.Join(ctx, "acme", 0, ws...)
			require.NoError(b, err)
			waiting += len(ws)
			b.StartTimer()
		}
		before := evalUsec(b, client)
		turns, errs := room.promoteAll(ctx, q, []string{"acme"}, []int{k}, []int64{int64(k)}, layout)
		require.NoError(b, errs[0])
		require.Len(b, turns[0].Promoted, k)
		if hand == "" {
			usec += evalUsec(b, client) - before
		}
		_, _, err := room.handOver(ctx, turns[0].Promoted, handover)
		require.NoError(b, err)
		if hand != "" {
			usec += evalUsec(b, client) - before
		}
		jobs += int64(k)
		waiting -= k
	}
	b.StopTimer()
	if hand != "" {
		n, err := client.LLen(ctx, asynqroom.PendingKey(q)).Result()
		require.NoError(b, err)
		require.Equal(b, jobs, n, "every job handed over")
	}
	b.ReportMetric(float64(usec)/float64(jobs), "redis-µs/job")
	if hand == "" {
		b.ReportMetric(float64(usec)/float64(b.N), "redis-µs/turn")
	}
}

// turnBench is a private server and the room of a limiter on it, whose
// tenant acme has the end-to-end round's policy (rules that never bind).
func turnBench(b *testing.B) (*redis.Client, *room) {
	client := redistest.NewServer(b, nil).Client(b)
	lim, err := NewLimiter(client, &Config{Prefix: "sluice"})
	require.NoError(b, err)
	b.Cleanup(func() { _ = lim.Close() })
	p, err := ParsePolicy("rate=1000000/s burst=100000 concurrency=100000")
	require.NoError(b, err)
	require.NoError(b, lim.Policies().Set(context.Background(), "acme", p))
	return client, lim.room()
}

// evalUsec is the time Redis has spent in script runs (µs).
func evalUsec(b testing.TB, client *redis.Client) int64 {
	info, err := client.Info(context.Background(), "commandstats").Result()
	require.NoError(b, err)
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				u, err := strconv.ParseInt(v, 10, 64)
				require.NoError(b, err)
				n += u
			}
		}
	}
	return n
}
