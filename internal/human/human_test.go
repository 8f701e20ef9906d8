package human

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                          "0s",
		0:                                     "0s",
		1234 * time.Microsecond:               "1ms",
		1234 * time.Millisecond:               "1.2s",
		3*time.Minute + 1500*time.Millisecond: "3m2s",
	} {
		require.Equal(t, want, Duration(d))
	}
}

func TestText(t *testing.T) {
	for in, want := range map[string]string{
		"acme":          "acme",
		"we{ird} name":  "we{ird} name",
		"ünï 😀":         "ünï 😀",
		"a\nb":          `"a\nb"`,
		"a\tb":          `"a\tb"`,
		"a\x00b":        `"a\x00b"`,
		"\x1b[31mred":   `"\x1b[31mred"`,
		"a\u0085":       `"a\u0085"`,
		"a\xffb":        `"a\xffb"`,
		`"quoted"`:      `"\"quoted\""`,
		"right\u202eto": `"right\u202eto"`,
	} {
		require.Equal(t, want, Text(in), "%q", in)
	}
}

func TestLine(t *testing.T) {
	require.Equal(t, "status 500: upstream failed", Line("status 500:\n  upstream\tfailed\n", 0))
	require.Equal(t, `bell\a here`, Line("bell\a here", 0))
	require.Equal(t, "abcd…", Line("abcdefgh", 5))
	require.Equal(t, "ünï", Line("ünï", 3))
}

func TestFit(t *testing.T) {
	require.Equal(t, "acme    5.0", Fit("acme    5.0", 0))
	require.Equal(t, "acme    5.0", Fit("acme    5.0", 11))
	require.Equal(t, "acme    5…", Fit("acme    5.0", 10))
	require.Equal(t, "ünï…", Fit("ünïcode", 4))
}

func TestCount(t *testing.T) {
	require.Equal(t, "0 jobs", Count(0, "job", "jobs"))
	require.Equal(t, "1 job", Count(int64(1), "job", "jobs"))
	require.Equal(t, "2 jobs", Count(2, "job", "jobs"))
	require.Equal(t, "1 entry", Count(1, "entry", "entries"))
}
