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
	// held in the worker, not handed back to asynq for seconds: 8 emails
	// at 5/s take 1.4 s, and a job deferred even once would add a second
	// or more each time
	require.Less(t, res.emailSpan, 5*time.Second, "%+v", res)
	require.EqualValues(t, 1, res.reportsAtOnce)
	require.Zero(t, res.archived)
	require.Zero(t, res.errorsReported)
}
