package throttle

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// batcher lets concurrent script calls share round trips: calls queue up
// while a pipeline is in flight and go out together in the next one. No
// call waits for company: a lone call is sent at once.
type batcher struct {
	client redis.UniversalClient
	max    int
	queue  chan *call
	wg     sync.WaitGroup
	mu     sync.RWMutex // held for reading while a call is handed over
	shut   bool
	closed chan struct{}
}

type call struct {
	ctx    context.Context
	script *redis.Script
	keys   []string
	args   []any
	res    any
	err    error
	done   chan struct{}
}

var errClosed = errors.New("throttle: limiter is closed")

func newBatcher(client redis.UniversalClient, max, pipelines int) *batcher {
	b := &batcher{client: client, max: max, queue: make(chan *call, max*pipelines), closed: make(chan struct{})}
	if max > 1 {
		for i := 0; i < pipelines; i++ {
			b.wg.Add(1)
			go b.loop()
		}
	}
	return b
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// run executes script with keys and args, alone or in a shared pipeline.
func (b *batcher) run(ctx context.Context, script *redis.Script, keys []string, args []any) (any, error) {
	if b.max <= 1 {
		return script.Run(ctx, b.client, keys, args...).Result()
	}
	c := callPool.Get().(*call)
	c.ctx, c.script, c.keys, c.args = ctx, script, keys, args
	b.mu.RLock()
	if b.shut {
		b.mu.RUnlock()
		callPool.Put(c)
		return nil, errClosed
	}
	select {
	case b.queue <- c:
		b.mu.RUnlock()
	case <-ctx.Done():
		b.mu.RUnlock()
		callPool.Put(c)
		return nil, ctx.Err()
	}
	// The call has been handed over and may run even if ctx ends now; wait
	// for it so the result (and the call's memory) is never left behind.
	<-c.done
	res, err := c.res, c.err
	c.ctx, c.script, c.keys, c.args, c.res, c.err = nil, nil, nil, nil, nil, nil
	callPool.Put(c)
	return res, err
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
		c.res, c.err = c.script.Run(c.ctx, b.client, c.keys, c.args...).Result()
		c.done <- struct{}{}
		return
	}
	// The pipeline runs under the first caller's context's values but must
	// not be cut short by one caller giving up.
	ctx := context.WithoutCancel(batch[0].ctx)
	cmds := b.exec(ctx, batch, false)
	var retry []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && isNoScript(err) {
			retry = append(retry, i)
		}
	}
	if len(retry) > 0 {
		// A restarted or flushed server lost the scripts: EVAL loads them again.
		again := make([]*call, len(retry))
		for j, i := range retry {
			again[j] = batch[i]
		}
		for j, cmd := range b.exec(ctx, again, true) {
			cmds[retry[j]] = cmd
		}
	}
	for i, c := range batch {
		c.res, c.err = cmds[i].Result()
		c.done <- struct{}{}
	}
}

func (b *batcher) exec(ctx context.Context, batch []*call, eval bool) []*redis.Cmd {
	pipe := b.client.Pipeline()
	cmds := make([]*redis.Cmd, len(batch))
	for i, c := range batch {
		if eval {
			cmds[i] = c.script.Eval(ctx, pipe, c.keys, c.args...)
		} else {
			cmds[i] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
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
