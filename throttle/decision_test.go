package throttle

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDecisionErr(t *testing.T) {
	t.Parallel()
	allowed := Decision{Allowed: true, RetryAfter: -1, Remaining: 4}
	require.NoError(t, allowed.Err("acme"))
	require.Equal(t, "allowed (remaining 4)", allowed.String())

	slot := time.Date(2026, 5, 1, 10, 0, 1, 500_000_000, time.UTC)
	denied := Decision{RetryAfter: 1500 * time.Millisecond, Rule: "rate[1]", Policy: "*", Reserved: true, Slot: slot}
	require.Equal(t, "denied by * rate[1], retry after 1.5s, slot reserved at 2026-05-01T10:00:01.5Z", denied.String())
	err := denied.Err("acme")
	var te *ThrottledError
	require.ErrorAs(t, err, &te)
	require.Equal(t, ThrottledError{Tenant: "acme", Rule: "rate[1]", Policy: "*", RetryAfter: 1500 * time.Millisecond, Reserved: true}, *te)
	require.Equal(t, `tenant "acme" throttled by * rate[1]: retry after 1.5s`, err.Error())
}

func TestBacklogError(t *testing.T) {
	t.Parallel()
	var err error = &BacklogError{Tenant: "acme", Backlog: 10, Limit: 10}
	require.ErrorIs(t, err, ErrBacklogFull)
	require.False(t, errors.Is(err, ErrNoPolicy))
	require.ErrorContains(t, err, `tenant "acme"`)
	require.ErrorContains(t, err, "cap 10")
}

func TestPolicyErrorText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "rate=0/s: the limit must be at least 1", (&PolicyError{Field: "rate", Value: "0/s", Msg: "the limit must be at least 1"}).Error())
	require.Equal(t, "something", (&PolicyError{Msg: "something"}).Error())
	_, err := ParsePolicy("rate=0/s")
	require.EqualError(t, err, "rate=0/s: the limit must be at least 1")
	_, err = ParsePolicy("window=x/s")
	require.EqualError(t, err, `window=x/s: the limit "x" is not a whole number`)
}
