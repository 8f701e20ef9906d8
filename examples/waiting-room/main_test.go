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
	require.Greater(t, res.plain.pending, 500, "enqueued with asynq's client, the burst sits in the pending list")
	require.Less(t, res.room.pending, 100, "through queue.Client it waits in its tenant's line")
	require.True(t, res.ok(), "the waiting room at least halves tiny's median wait")
}
