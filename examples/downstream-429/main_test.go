package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestShort(t *testing.T) {
	var out bytes.Buffer
	res, err := run(context.Background(), "", true, &out)
	require.NoError(t, err, out.String())
	t.Log("\n" + out.String())
	require.Equal(t, res.acme, res.acmeDone)
	require.Equal(t, res.other, res.oDone)
	require.Positive(t, res.rejected, "the API said 429")
	require.Zero(t, res.duringPause, "no acme request while acme was paused")
	require.Zero(t, res.archived)
	require.True(t, res.ok())
}
