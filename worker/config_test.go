package worker_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/worker"
)

// TestConfigAdminNeedsAnAddressOthersReach: the admin address recorded in
// the fleet's registry is one another machine can dial.
func TestConfigAdminNeedsAnAddressOthersReach(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	for _, bad := range []string{"9464", "0.0.0.0:9464", ":9464", "[::]:9464"} {
		_, err := worker.New(e.client, &worker.Config{Prefix: e.prefix, Admin: bad})
		require.ErrorContains(t, err, `worker config: Admin "`+bad+`": want the HOST:PORT at which other machines reach this worker's metrics`)
	}
}
