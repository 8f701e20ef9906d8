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
	require.Greater(t, res.plain.pending, 500, "without shaping the burst sits in the pending list")
	require.Less(t, res.shaped.pending, 100, "with shaping it waits in the schedule")
	require.True(t, res.ok(), "shaping at least halves tiny's median wait")
}
