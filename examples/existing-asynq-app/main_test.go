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
	require.True(t, res.ok(), "%+v", res)
	require.EqualValues(t, 1, res.reportsAtOnce)
	require.Zero(t, res.archived)
	require.Zero(t, res.errorsReported)
}
