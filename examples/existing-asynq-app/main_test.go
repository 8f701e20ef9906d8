package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestShort(t *testing.T) {
	var out bytes.Buffer
	res, err := run(context.Background(), "", true, &out)
	require.NoError(t, err, out.String())
	t.Log("\n" + out.String())
	require.True(t, res.ok(), "%+v", res)
	// none lost its way: held in the worker, 8 emails at 5/s take 1.4 s
	// (a loaded machine's late wakes lose a few slots: up to 4.4 s seen);
	// a job asynq's own forwarder brought back (every 5 s) would be later
	require.Less(t, res.emailSpan, 8*time.Second, "%+v", res)
	require.EqualValues(t, 1, res.reportsAtOnce)
	require.Zero(t, res.archived)
	require.Zero(t, res.errorsReported)
}
