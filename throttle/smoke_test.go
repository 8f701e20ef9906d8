package throttle

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSmoke(t *testing.T) {
	e := setup(t, false, nil)
	ctx := context.Background()
	e.policy(t, "acme", "rate=10/s burst=2 concurrency=2")
	for i := 0; i < 4; i++ {
		d, err := e.lim.Do(ctx, Request{Tenant: "acme", ID: string(rune('a' + i)), Reserve: true})
		require.NoError(t, err)
		t.Logf("%d: %+v", i, d)
	}
}
