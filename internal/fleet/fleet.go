// Package fleet is the registry of a fleet's worker processes
// (lua/fleet.lua): each process holds a lease it renews by beating, and
// records the jobs it runs (their asynq task ids and queues), so that when
// a process dies its jobs can be given back to the queue as soon as its
// lease runs out. One process at a time, the holder of the recoverer's
// lock, looks for lapsed processes. It is the worker package's plumbing
// (its recoverer), reached through throttle.Limiter.Fleet; no application
// calls it.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lua"
)

// Registry is the fleet's registry under one key prefix. Every time is
// Redis's. A Registry is safe for concurrent use.
type Registry struct {
	client redis.UniversalClient
	pfx    string
}

// New returns the registry of the fleet whose keys start with prefix.
func New(client redis.UniversalClient, prefix string) *Registry {
	return &Registry{client: client, pfx: prefix}
}

// The registry's keys, in the {r} slot of sluice's keys (throttle/keys.go
// names the rest).
// Of returns the registry under the prefix of a *throttle.Limiter. Package
// throttle, which imports this one, sets it; the worker package's
// recoverer reaches the registry through it, so that it is no part of
// throttle's public API.
var Of func(limiter any) *Registry

func fleetKey(prefix string) string           { return prefix + ":{r}:fleet" }
func recoverLockKey(prefix string) string     { return prefix + ":{r}:recover" }
func fleetQueuesKey(prefix string) string     { return prefix + ":{r}:queues" }
func fleetJobsKey(prefix, proc string) string { return prefix + ":{r}:w:" + proc }
func fleetAdminKey(prefix string) string      { return prefix + ":{r}:admin" }

func (f *Registry) prefix() string { return f.pfx }

func (f *Registry) keys(proc string) []string {
	p := f.prefix()
	return []string{fleetKey(p), recoverLockKey(p), fleetJobsKey(p, proc), fleetQueuesKey(p), fleetAdminKey(p)}
}

// jobsTTL is how long a process's job record outlives its last beat: only
// to reclaim memory when no process of the fleet ever looks again.
const jobsTTL = 24 * time.Hour

// Beat renews proc's lease (now + lease) and records the queues it
// serves and the HOST:PORT of its admin endpoints (admin, "" for none); it
// takes the recoverer's lock, for lock, when nobody holds it.
// rejoined reports that proc was not registered: its first beat, or it
// had been taken for dead (its jobs may have been given back). leader
// reports that proc holds the lock.
func (f *Registry) Beat(ctx context.Context, proc, admin string, lease, lock time.Duration, queues []string) (rejoined, leader bool, err error) {
	args := []any{"beat", proc, lease.Milliseconds(), lock.Milliseconds(), jobsTTL.Milliseconds(), admin}
	for _, q := range queues {
		args = append(args, q)
	}
	res, err := lua.Fleet.Run(ctx, f.client, f.keys(proc), args...).Result()
	if err != nil {
		return false, false, fmt.Errorf("fleet beat: %w", err)
	}
	arr, ok := res.([]any)
	if !ok || len(arr) != 2 {
		return false, false, fmt.Errorf("fleet beat: unexpected reply %v", res)
	}
	a, okA := arr[0].(int64)
	b, okB := arr[1].(int64)
	if !okA || !okB {
		return false, false, fmt.Errorf("fleet beat: unexpected reply %v", res)
	}
	return a == 1, b == 1, nil
}

// Check extends proc's hold of the recoverer's lock (for lock) and
// returns up to limit processes whose lease ran out, earliest first;
// leader is false, and nothing is returned, when proc does not hold the
// lock.
func (f *Registry) Check(ctx context.Context, proc string, lock time.Duration, limit int) (leader bool, lapsed []string, err error) {
	res, err := lua.Fleet.Run(ctx, f.client, f.keys(proc)[:2], "check", proc, lock.Milliseconds(), limit).Result()
	if err != nil {
		return false, nil, fmt.Errorf("fleet check: %w", err)
	}
	arr, ok := res.([]any)
	if !ok {
		return false, nil, fmt.Errorf("fleet check: unexpected reply %T", res)
	}
	if len(arr) == 0 {
		return false, nil, nil
	}
	for _, v := range arr[1:] {
		s, ok := v.(string)
		if !ok {
			return false, nil, fmt.Errorf("fleet check: unexpected process %T", v)
		}
		lapsed = append(lapsed, s)
	}
	return true, lapsed, nil
}

// Drop forgets the lapsed process dead, its record included, once its
// jobs were given back; proc must hold the lock. It reports false, and
// changes nothing, when proc lost the lock or dead beat again meanwhile.
func (f *Registry) Drop(ctx context.Context, proc, dead string) (bool, error) {
	n, err := lua.Fleet.Run(ctx, f.client, f.keys(dead), "drop", proc, dead).Int64()
	if err != nil {
		return false, fmt.Errorf("fleet drop %s: %w", dead, err)
	}
	return n == 1, nil
}

// Leave forgets proc (a graceful shutdown) and gives back the lock if it
// holds it.
func (f *Registry) Leave(ctx context.Context, proc string) error {
	if err := lua.Fleet.Run(ctx, f.client, f.keys(proc), "leave", proc).Err(); err != nil {
		return fmt.Errorf("fleet leave: %w", err)
	}
	return nil
}

// Record records that proc runs the jobs of run (asynq task id -> queue)
// and no longer runs those of done, in one round trip.
func (f *Registry) Record(ctx context.Context, proc string, run map[string]string, done []string) error {
	key := fleetJobsKey(f.prefix(), proc)
	pipe := f.client.Pipeline()
	if len(run) > 0 {
		args := make([]any, 0, 2*len(run))
		for id, q := range run {
			args = append(args, id, q)
		}
		pipe.HSet(ctx, key, args...)
	}
	if len(done) > 0 {
		pipe.HDel(ctx, key, done...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("fleet record: %w", err)
	}
	return nil
}

// Jobs returns the jobs proc recorded: asynq task id -> queue.
func (f *Registry) Jobs(ctx context.Context, proc string) (map[string]string, error) {
	m, err := f.client.HGetAll(ctx, fleetJobsKey(f.prefix(), proc)).Result()
	if err != nil {
		return nil, fmt.Errorf("fleet jobs of %s: %w", proc, err)
	}
	return m, nil
}

// Members returns every registered process, lapsed or not.
func (f *Registry) Members(ctx context.Context) ([]string, error) {
	m, err := f.client.ZRange(ctx, fleetKey(f.prefix()), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("fleet members: %w", err)
	}
	return m, nil
}

// Member is a registered process as sluice dashboard shows it.
type Member struct {
	ID string
	// Admin is the HOST:PORT of its admin endpoints; "" when it serves
	// none.
	Admin string
	// LeaseLeft is how long its lease runs on; zero or less once it ran
	// out without a beat (the process is down, or cut off from Redis).
	LeaseLeft time.Duration
}

// Up reports whether the process beat within its lease.
func (m Member) Up() bool { return m.LeaseLeft > 0 }

// List returns every registered process, lapsed or not, by id, in one
// round trip; lease times are measured against Redis's clock.
func (f *Registry) List(ctx context.Context) ([]Member, error) {
	pipe := f.client.Pipeline()
	now := pipe.Time(ctx)
	leases := pipe.ZRangeWithScores(ctx, fleetKey(f.prefix()), 0, -1)
	admins := pipe.HGetAll(ctx, fleetAdminKey(f.prefix()))
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("fleet list: %w", err)
	}
	nowMS := now.Val().UnixMilli()
	out := make([]Member, 0, len(leases.Val()))
	for _, z := range leases.Val() {
		id, ok := z.Member.(string)
		if !ok {
			return nil, fmt.Errorf("fleet list: unexpected member %T", z.Member)
		}
		out = append(out, Member{ID: id, Admin: admins.Val()[id], LeaseLeft: time.Duration(int64(z.Score)-nowMS) * time.Millisecond})
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Queues returns the queues the fleet's processes said they serve.
func (f *Registry) Queues(ctx context.Context) ([]string, error) {
	q, err := f.client.SMembers(ctx, fleetQueuesKey(f.prefix())).Result()
	if err != nil {
		return nil, fmt.Errorf("fleet queues: %w", err)
	}
	return q, nil
}

// Held returns which of ids any of procs has recorded as running: one
// HMGET per process, in one round trip.
func (f *Registry) Held(ctx context.Context, procs, ids []string) (map[string]bool, error) {
	held := map[string]bool{}
	if len(procs) == 0 || len(ids) == 0 {
		return held, nil
	}
	pipe := f.client.Pipeline()
	cmds := make([]*redis.SliceCmd, len(procs))
	for i, p := range procs {
		cmds[i] = pipe.HMGet(ctx, fleetJobsKey(f.prefix(), p), ids...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("fleet held: %w", err)
	}
	for _, c := range cmds {
		for i, v := range c.Val() {
			if v != nil {
				held[ids[i]] = true
			}
		}
	}
	return held, nil
}
