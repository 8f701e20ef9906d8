package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// batcher lets concurrent script calls share round trips: calls queue up
// while a pipeline is in flight and go out together in the next one. No
// call waits for company: a lone call is sent at once.
type batcher struct {
	client  redis.UniversalClient
	cluster bool
	max     int
	queue   chan *call
	wg      sync.WaitGroup
	mu      sync.RWMutex // held for reading while a call is handed over
	shut    bool
	closed  chan struct{}
}

type call struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	// payload and merge: a call whose script decides several ops in one
	// run carries its own arguments in payload and the merger that lays
	// them out, alone or with others (nil: args as they are)
	payload any
	merge   merger
	res     any
	err     error
	done    chan struct{}
}

// A merger runs the calls of one script in one run of it, the script taking
// their ops one after the other and answering one reply per op. Calls that
// share a merger may share a run; batch.go knows nothing else of them (each
// script's wire does).
type merger interface {
	// lay lays out the arguments of one run for the calls (one call: its
	// own).
	lay(calls []*call) (keys []string, args []any)
	// reply is the part of a run's reply that belongs to call i of n.
	reply(res any, i, n int) (any, error)
}

var errClosed = errors.New("throttle: limiter is closed")

func newBatcher(client redis.UniversalClient, max, pipelines int) *batcher {
	b := &batcher{client: client, max: max, queue: make(chan *call, max*pipelines), closed: make(chan struct{})}
	_, b.cluster = client.(*redis.ClusterClient)
	if max > 1 {
		for i := 0; i < pipelines; i++ {
			b.wg.Add(1)
			go b.loop()
		}
	}
	return b
}

// run executes script with keys and args, alone or in a shared pipeline.
func (b *batcher) run(ctx context.Context, script *redis.Script, keys []string, args []any) (any, error) {
	return b.do(&call{ctx: ctx, script: script, keys: keys, args: args})
}

// runMerged executes a call of a multi-op script for one op whose arguments
// m lays out, alone or in one run with others.
func (b *batcher) runMerged(ctx context.Context, script *redis.Script, keys []string, payload any, m merger) (any, error) {
	return b.do(&call{ctx: ctx, script: script, keys: keys, payload: payload, merge: m})
}

func (b *batcher) do(c *call) (any, error) {
	ctx := c.ctx
	if b.max <= 1 {
		keys, args := c.keys, c.args
		if c.merge != nil {
			keys, args = c.merge.lay([]*call{c})
		}
		return c.script.Run(ctx, b.client, keys, args...).Result()
	}
	c.done = make(chan struct{}, 1)
	b.mu.RLock()
	if b.shut {
		b.mu.RUnlock()
		return nil, errClosed
	}
	select {
	case b.queue <- c:
		b.mu.RUnlock()
	case <-ctx.Done():
		b.mu.RUnlock()
		return nil, ctx.Err()
	}
	// The call now shares a pipeline with others and runs to its end; a
	// caller whose context ends first stops waiting (the outcome is then
	// unknown to it: the decision may have been applied).
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// runAll executes calls together, in one pipeline (and, where they share a
// merger, in one script run), whoever else is calling: for work that
// comes in groups, such as a process's lease renewals.
func (b *batcher) runAll(calls []*call) {
	if len(calls) == 0 {
		return
	}
	for _, c := range calls {
		c.done = make(chan struct{}, 1)
	}
	b.send(calls)
	for _, c := range calls {
		<-c.done
	}
}

func (b *batcher) loop() {
	defer b.wg.Done()
	batch := make([]*call, 0, b.max)
	for {
		select {
		case c := <-b.queue:
			batch = append(batch[:0], c)
		case <-b.closed:
			b.drain()
			return
		}
	fill:
		for len(batch) < b.max {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		b.send(batch)
	}
}

// drain fails the calls still queued at close.
func (b *batcher) drain() {
	for {
		select {
		case c := <-b.queue:
			c.err = errClosed
			c.done <- struct{}{}
		default:
			return
		}
	}
}

func (b *batcher) send(batch []*call) {
	if len(batch) == 1 {
		c := batch[0]
		keys, args := c.keys, c.args
		if c.merge != nil {
			keys, args = c.merge.lay(batch)
		}
		c.res, c.err = c.script.Run(c.ctx, b.client, keys, args...).Result()
		c.done <- struct{}{}
		return
	}
	// The pipeline runs under the first caller's context's values but must
	// not be cut short by one caller giving up.
	ctx := context.WithoutCancel(batch[0].ctx)
	units := b.units(batch)
	cmds := b.exec(ctx, units, false)
	var retry []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && isNoScript(err) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		// A restarted or flushed server lost the scripts: EVAL loads them again.
		again := make([]*unit, len(retry))
		for j, i := range retry {
			again[j] = units[i]
		}
		for j, cmd := range b.exec(ctx, again, true) {
			cmds[retry[j]] = cmd
		}
	}
	for i, u := range units {
		u.deliver(cmds[i])
	}
}

// unit is one script call in a pipeline: a single call, or several calls of
// a multi-op script merged into one (their ops run one after the other in
// one script run, sharing its fixed cost).
type unit struct {
	script *redis.Script
	keys   []string
	args   []any
	calls  []*call
}

func (u *unit) deliver(cmd *redis.Cmd) {
	res, err := cmd.Result()
	if len(u.calls) == 1 {
		c := u.calls[0]
		c.res, c.err = res, err
		c.done <- struct{}{}
		return
	}
	for i, c := range u.calls {
		if err != nil {
			c.res, c.err = nil, err
		} else {
			c.res, c.err = c.merge.reply(res, i, len(u.calls))
		}
		c.done <- struct{}{}
	}
}

// units groups a pipeline's calls: calls that share a merger go in one
// run (on a Cluster, where different tenants live in different slots, none
// do), any other call runs on its own.
func (b *batcher) units(batch []*call) []*unit {
	out := make([]*unit, 0, len(batch))
	merged := map[merger]*unit{}
	for _, c := range batch {
		if c.merge == nil || b.cluster {
			keys, args := c.keys, c.args
			if c.merge != nil {
				keys, args = c.merge.lay([]*call{c})
			}
			out = append(out, &unit{script: c.script, keys: keys, args: args, calls: []*call{c}})
			continue
		}
		u := merged[c.merge]
		if u == nil {
			u = &unit{script: c.script}
			merged[c.merge] = u
			out = append(out, u)
		}
		u.calls = append(u.calls, c)
	}
	for m, u := range merged {
		u.keys, u.args = m.lay(u.calls)
	}
	return out
}

// headerMerger merges the calls of a script whose ARGV is a header the
// same for every call a limiter makes (its second item the number of ops),
// then each op's arguments, and whose KEYS are each op's keys in order; its
// reply has one item per op.
type headerMerger struct{ header int }

func (m headerMerger) lay(calls []*call) ([]string, []any) {
	if len(calls) == 1 {
		return calls[0].keys, calls[0].payload.([]any)
	}
	var keys []string
	args := append([]any(nil), calls[0].payload.([]any)[:m.header]...)
	args[1] = len(calls)
	for _, c := range calls {
		keys = append(keys, c.keys...)
		args = append(args, c.payload.([]any)[m.header:]...)
	}
	return keys, args
}

func (m headerMerger) reply(res any, i, n int) (any, error) {
	ops, ok := res.([]any)
	if !ok || len(ops) != n {
		return nil, fmt.Errorf("merged script call: %v replies for %d ops", res, n)
	}
	return []any{ops[i]}, nil
}

func (b *batcher) exec(ctx context.Context, units []*unit, eval bool) []*redis.Cmd {
	pipe := b.client.Pipeline()
	cmds := make([]*redis.Cmd, len(units))
	for i, u := range units {
		if eval {
			cmds[i] = u.script.Eval(ctx, pipe, u.keys, u.args...)
		} else {
			cmds[i] = u.script.EvalSha(ctx, pipe, u.keys, u.args...)
		}
	}
	_, _ = pipe.Exec(ctx)
	return cmds
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

func (b *batcher) close() {
	b.mu.Lock()
	if b.shut {
		b.mu.Unlock()
		return
	}
	b.shut = true
	close(b.closed)
	b.mu.Unlock()
	b.wg.Wait()
}
