package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// settleEnv is a limiter with a fake clock and the tenant's policy.
func settleEnv(t *testing.T, policy string) *env {
	t.Helper()
	e := setup(t, false, nil)
	e.policy(t, stepTenant, policy)
	return e
}

// admitOK admits job id of cost on the tenant and requires it allowed.
func (e *env) admitOK(t *testing.T, id string, cost int64) Decision {
	t.Helper()
	d, err := e.lim.Do(context.Background(), Request{Tenant: stepTenant, ID: id, Cost: cost})
	require.NoError(t, err)
	require.True(t, d.Allowed, "%s of cost %d: %s", id, cost, d)
	return d
}

// settle settles job id, admitted on cost by d, to actual.
func (e *env) settle(t *testing.T, id string, cost int64, d Decision, actual int64) {
	t.Helper()
	require.NoError(t, e.lim.Settle(context.Background(), Request{Tenant: stepTenant, ID: id, Cost: cost}, d, actual))
}

// retryOf is the retry-after of a dry run of cost now (-1: allowed).
func (e *env) retryOf(t *testing.T, cost int64) time.Duration {
	t.Helper()
	d, err := e.lim.Do(context.Background(), Request{Tenant: stepTenant, ID: "probe", Cost: cost, DryRun: true})
	require.NoError(t, err)
	return d.RetryAfter
}

func (e *env) stateHash(t *testing.T, tenant string) map[string]string {
	t.Helper()
	h, err := e.client.HGetAll(context.Background(), keysFor(e.prefix, tenant).state).Result()
	require.NoError(t, err)
	return h
}

func TestSettleRate(t *testing.T) {
	t.Parallel()
	t.Run("refund", func(t *testing.T) {
		t.Parallel()
		e := settleEnv(t, "rate=10/s burst=5")
		d := e.admitOK(t, "a", 5)
		require.Equal(t, 500*ms, e.retryOf(t, 5))
		e.settle(t, "a", 5, d, 2)
		require.Equal(t, 200*ms, e.retryOf(t, 5), "as if a had cost 2")
		require.Equal(t, "3", e.stateHash(t, stepTenant)["sr"])
	})
	t.Run("extra into debt delays the next start", func(t *testing.T) {
		t.Parallel()
		e := settleEnv(t, "rate=10/s")
		d := e.admitOK(t, "a", 1)
		e.clock.Advance(50 * ms)
		e.settle(t, "a", 1, d, 30)
		require.Equal(t, 2950*ms, e.retryOf(t, 1), "3 s of debt from the start, 50 ms of it gone")
		e.clock.Advance(2950 * ms)
		e.admitOK(t, "b", 1)
		require.Equal(t, "29", e.stateHash(t, stepTenant)["se"])
	})
	t.Run("a refund others charged after is kept", func(t *testing.T) {
		t.Parallel()
		e := settleEnv(t, "rate=10/s burst=10")
		d := e.admitOK(t, "a", 5)
		e.admitOK(t, "b", 5)
		before := e.stateHash(t, stepTenant)["p1"]
		e.settle(t, "a", 5, d, 1)
		require.Equal(t, before, e.stateHash(t, stepTenant)["p1"], "b charged after a: the refund is not given back")
		// an extra charge is added all the same
		e.settle(t, "a", 5, d, 7)
		require.Equal(t, 700*ms, e.retryOf(t, 5), "1 s of a and b, 200 ms more for a's extra, less 500 ms of burst left")
	})
	t.Run("settled to 0 on failure", func(t *testing.T) {
		t.Parallel()
		e := settleEnv(t, "rate=10/s burst=5 window=5/min quota=20/day")
		d := e.admitOK(t, "a", 4)
		e.settle(t, "a", 4, d, 0)
		require.Equal(t, time.Duration(-1), e.retryOf(t, 5), "everything a took is back")
		d, err := e.lim.Do(context.Background(), Request{Tenant: stepTenant, ID: "b", Cost: 5, DryRun: true})
		require.NoError(t, err)
		require.Equal(t, int64(5), d.Remaining)
	})
}

func TestSettleWindow(t *testing.T) {
	t.Parallel()
	t.Run("refund", func(t *testing.T) {
		t.Parallel()
		e := settleEnv(t, "window=10/min")
		d := e.admitOK(t, "a", 8)
		require.Equal(t, time.Minute, e.retryOf(t, 7))
		e.clock.Advance(10 * time.Second)
		e.settle(t, "a", 8, d, 3)
		require.Equal(t, time.Duration(-1), e.retryOf(t, 7))
		require.Equal(t, 50*time.Second, e.retryOf(t, 8), "a's 3 entries leave at its start + 1 min")
	})
	t.Run("extra", func(t *testing.T) {
		t.Parallel()
		e := settleEnv(t, "window=10/min")
		d := e.admitOK(t, "a", 2)
		e.clock.Advance(10 * time.Second)
		e.settle(t, "a", 2, d, 12)
		require.Equal(t, 50*time.Second, e.retryOf(t, 1), "the window is over-full until a's entries leave")
		e.clock.Advance(50 * time.Second)
		require.Equal(t, time.Duration(-1), e.retryOf(t, 10))
	})
}

func TestSettleQuota(t *testing.T) {
	t.Parallel()
	e := settleEnv(t, "quota=10/day")
	d := e.admitOK(t, "a", 6)
	e.settle(t, "a", 6, d, 1)
	require.Equal(t, time.Duration(-1), e.retryOf(t, 9))
	e.settle(t, "a", 1, d, 11)
	denied, err := e.lim.Do(context.Background(), Request{Tenant: stepTenant, ID: "b", DryRun: true})
	require.NoError(t, err)
	require.Equal(t, "quota", denied.Rule, "in debt: the next start waits for the next day")
}

func TestSettleNothingHeld(t *testing.T) {
	t.Parallel()
	e := settleEnv(t, "rate=10/s burst=5 window=5/s")
	d := e.admitOK(t, "a", 2)
	e.clock.Advance(time.Minute)
	before := e.stateHash(t, stepTenant)
	e.settle(t, "a", 2, d, 5)
	e.settle(t, "a", 2, d, 0)
	require.Equal(t, before, e.stateHash(t, stepTenant), "a's charges have run out: nothing to settle")
}

func TestSettleBadInput(t *testing.T) {
	t.Parallel()
	e := settleEnv(t, "rate=10/s burst=5")
	ctx := context.Background()
	d := e.admitOK(t, "a", 5)
	before := e.stateHash(t, stepTenant)
	err := e.lim.Settle(ctx, Request{Tenant: stepTenant, ID: "a", Cost: 5}, d, -3)
	require.ErrorContains(t, err, "actual cost -3: must be 0 or more")
	denied, err := e.lim.Do(ctx, Request{Tenant: stepTenant, ID: "b"})
	require.NoError(t, err)
	require.False(t, denied.Allowed)
	err = e.lim.Settle(ctx, Request{Tenant: stepTenant, ID: "b"}, denied, 3)
	require.ErrorContains(t, err, "did not admit the job")
	err = e.lim.Settle(ctx, Request{Tenant: "@x", ID: "a", Cost: 5}, d, 3)
	require.Error(t, err)
	err = e.lim.Settle(ctx, Request{Tenant: stepTenant, ID: "a", Cost: 5}, d, 1<<62)
	require.ErrorContains(t, err, "beyond what")
	require.Equal(t, before, e.stateHash(t, stepTenant))
}
