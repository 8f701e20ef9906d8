package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/lua"
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
	admit  *admitArgs // admit.lua's arguments, merged their own way
	res    any
	err    error
	done   chan struct{}
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
	return b.do(ctx, script, keys, args, nil)
}

// runAdmit executes admit.lua for one op, alone or merged with others.
func (b *batcher) runAdmit(ctx context.Context, script *redis.Script, keys []string, aa *admitArgs) (any, error) {
	return b.do(ctx, script, keys, nil, aa)
}

func (b *batcher) do(ctx context.Context, script *redis.Script, keys []string, args []any, aa *admitArgs) (any, error) {
	if b.max <= 1 {
		if aa != nil {
			args = aa.flatten()
		}
		return script.Run(ctx, b.client, keys, args...).Result()
	}
	c := &call{ctx: ctx, script: script, keys: keys, args: args, admit: aa, done: make(chan struct{}, 1)}
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
		if c.admit != nil {
			c.args = c.admit.flatten()
		}
		c.res, c.err = c.script.Run(c.ctx, b.client, c.keys, c.args...).Result()
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
	ops, ok := res.([]any)
	// the admission scripts add the decisions' time after the ops
	admit := u.calls[0].admit != nil
	want := len(u.calls)
	if admit {
		want++
	}
	if err == nil && (!ok || len(ops) != want) {
		err = fmt.Errorf("merged script call: %d replies for %d ops", len(ops), len(u.calls))
	}
	for i, c := range u.calls {
		if err != nil {
			c.res, c.err = nil, err
		} else if admit {
			c.res, c.err = []any{ops[i], ops[len(ops)-1]}, nil
		} else {
			c.res, c.err = []any{ops[i]}, nil
		}
		c.done <- struct{}{}
	}
}

// mergeable scripts take ARGV = clock, number of ops, the rest of a header
// that is the same for every call a limiter makes, then each op's
// arguments; and KEYS = each op's keys in order. Calls made for one op each
// can be merged into one. The value is the header's length. On a Cluster
// the keys of different tenants live in different slots, so nothing is
// merged there.
var mergeable = map[*redis.Script]int{lua.Release: 3, lua.Renew: 2}

func (b *batcher) units(batch []*call) []*unit {
	out := make([]*unit, 0, len(batch))
	merged := map[*redis.Script]*unit{}
	admits := map[*redis.Script][]*call{}
	for _, c := range batch {
		if c.admit != nil {
			if b.cluster {
				out = append(out, &unit{script: c.script, keys: c.keys, args: c.admit.flatten(), calls: []*call{c}})
			} else {
				admits[c.script] = append(admits[c.script], c)
			}
			continue
		}
		header := mergeable[c.script]
		if b.cluster || header == 0 {
			out = append(out, &unit{script: c.script, keys: c.keys, args: c.args, calls: []*call{c}})
			continue
		}
		u := merged[c.script]
		if u == nil {
			u = &unit{script: c.script, args: append([]any(nil), c.args[:header]...)}
			merged[c.script] = u
			out = append(out, u)
		}
		u.keys = append(u.keys, c.keys...)
		u.args = append(u.args, c.args[header:]...)
		u.calls = append(u.calls, c)
	}
	for _, u := range merged {
		if len(u.calls) == 1 {
			c := u.calls[0]
			u.keys, u.args = c.keys, c.args
		} else {
			u.args[1] = len(u.calls)
		}
	}
	for _, calls := range admits {
		out = append(out, mergeAdmits(calls))
	}
	return out
}

// mergeAdmits puts admissions into one admit.lua run: each distinct policy
// is sent (and read by the script) once, and the ops refer to it.
func mergeAdmits(calls []*call) *unit {
	script := calls[0].script
	if len(calls) == 1 {
		c := calls[0]
		return &unit{script: script, keys: c.keys, args: c.admit.flatten(), calls: calls}
	}
	u := &unit{script: script, calls: calls}
	index := map[policyKey]int{}
	var policies [][]any
	var ops []any
	for _, c := range calls {
		aa := c.admit
		u.keys = append(u.keys, c.keys...)
		local := make([]int, len(aa.policies))
		for i, p := range aa.policies {
			n, ok := index[p.key]
			if !ok {
				policies = append(policies, p.args)
				n = len(policies)
				index[p.key] = n
			}
			local[i] = n
		}
		start := len(ops)
		ops = append(ops, aa.op...)
		for _, at := range aa.refs {
			// a negative reference is a remote scope's
			if ref := aa.op[at].(int); ref < 0 {
				ops[start+at] = -local[-ref-1]
			} else {
				ops[start+at] = local[ref-1]
			}
		}
	}
	header := calls[0].admit.header
	args := make([]any, 0, len(header)+1+len(ops)+8*len(policies))
	args = append(args, header...)
	args[1] = len(calls)
	args = append(args, len(policies))
	for _, p := range policies {
		args = append(args, p...)
	}
	u.args = append(args, ops...)
	return u
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
