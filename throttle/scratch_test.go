package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestScratch(t *testing.T) {
	ctx := context.Background()
	for _, e := range []*env{singleEnv(t, modelConfig), clusterEnv(t, modelConfig)} {
		e.policy(t, "*", "rate=3/s burst=2 concurrency=3 lease=1s")
		e.policy(t, GlobalPolicy, "rate=8/s burst=4 window=2/5s")
		d, err := e.lim.Admit(ctx, "a", "job-2")
		require.NoError(t, err)
		require.True(t, d.Allowed)
		e.clock.Advance(200 * time.Millisecond)
		d, err = e.lim.Admit(ctx, "b", "job-3")
		require.NoError(t, err)
		require.True(t, d.Allowed, d.String())
		e.clock.Advance(200 * time.Millisecond)
		d, err = e.lim.Do(ctx, Request{Tenant: "a", ID: "job-12", Reserve: true})
		require.NoError(t, err)
		st, _ := e.lim.Stats(ctx, "a")
		t.Logf("cluster=%v %v holders %+v", e.lim.cluster, d, st.Concurrency.Holders)
		all, _ := e.client.HGetAll(ctx, keysFor(e.prefix, "a").state).Result()
		t.Logf("%v", all)
	}
}
