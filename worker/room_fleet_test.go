package worker_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
)

// TestRoomSaturation: one tenant without limits enqueues a huge burst at
// once, more than the worker fleet can run for many seconds, while 50 small
// tenants trickle jobs in. The waiting room keeps asynq's pending list
// short and serves the due tenants in turn, so a small tenant's job waits
// for a moment, not behind the burst.
func TestRoomSaturation(t *testing.T) {
	bin := buildTestWorker(t)
	// 15,000 jobs outlast the small tenants' two seconds of trickle several
	// times over (the test fails when the fleet caught up with the burst);
	// -sluice.full runs 50,000
	big := 15_000
	if *full {
		big = 50_000
	}
	f := newFleet(t, bin)
	// two workers of 8: a few thousand 2 ms jobs a second at best
	f.args = []string{"-concurrency", "8"}
	for range 2 {
		f.start(t)
	}
	ctx := context.Background()
	burstDone := make(chan struct{})
	go func() {
		defer close(burstDone)
		f.enqueueBatch(t, "big", big, `{"ms":2}`)
	}()
	// the small tenants start once the burst is well under way
	waitForLine(t, f, "big", 2000)

	const small, each = 50, 10
	var mu sync.Mutex
	enqueued := map[string]time.Time{}
	var wg sync.WaitGroup
	for s := range small {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := fmt.Sprintf("small-%02d", s)
			for range each {
				at := time.Now()
				info, err := f.env.q.Enqueue(ctx, tenant, asynq.NewTask("rec", []byte(`{"ms":2}`)), asynq.Queue(f.env.queue))
				require.NoError(t, err)
				mu.Lock()
				enqueued[info.ID] = at
				mu.Unlock()
				time.Sleep(200 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	var waits []time.Duration
	poll(t, 60*time.Second, 100*time.Millisecond, func() bool {
		waits = waits[:0]
		for _, e := range f.records(t) {
			if at, ok := enqueued[e.id]; ok && e.start {
				waits = append(waits, e.at.Sub(at))
			}
		}
		return len(waits) == len(enqueued)
	}, "the small tenants' %d jobs started", small*each)
	st, err := f.env.lim.Stats(ctx, "big")
	require.NoError(t, err)
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	p := func(q float64) time.Duration { return waits[int(q*float64(len(waits)-1))].Round(time.Millisecond) }
	t.Logf("%d jobs of one tenant at once, 2 workers of 8; %d small tenants' %d jobs waited p50 %s p99 %s max %s; the big tenant still had %d jobs waiting",
		big, small, len(waits), p(0.5), p(0.99), p(1), st.Waiting)
	require.Positive(t, st.Waiting, "the fleet could not keep up with the burst")
	require.LessOrEqual(t, p(0.99), time.Second, "small tenants' p99 wait")
	<-burstDone
	f.waitFinished(t, big+small*each, 5*time.Minute)
}

// waitForLine waits until at least n of tenant's jobs wait in its line.
func waitForLine(t *testing.T, f *fleet, tenant string, n int64) {
	t.Helper()
	poll(t, 60*time.Second, 20*time.Millisecond, func() bool {
		st, err := f.env.lim.Stats(context.Background(), tenant)
		require.NoError(t, err)
		return st.Waiting >= n
	}, "%d jobs of %s waiting", n, tenant)
}
