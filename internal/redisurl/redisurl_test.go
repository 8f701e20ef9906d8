package redisurl

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestParseForms(t *testing.T) {
	t.Parallel()
	tests := []struct {
		raw  string
		want URL
		str  string // String(); raw when empty
	}{
		{raw: "redis://127.0.0.1:6379", want: URL{Kind: KindNode, Addrs: []string{"127.0.0.1:6379"}}},
		{raw: "redis://localhost", want: URL{Kind: KindNode, Addrs: []string{"localhost:6379"}}, str: "redis://localhost:6379"},
		{raw: "REDIS://h:1/0", want: URL{Kind: KindNode, Addrs: []string{"h:1"}}, str: "redis://h:1"},
		{raw: "redis://h:7000/3", want: URL{Kind: KindNode, Addrs: []string{"h:7000"}, DB: 3}},
		{raw: "redis://h:7000/3/", want: URL{Kind: KindNode, Addrs: []string{"h:7000"}, DB: 3}, str: "redis://h:7000/3"},
		{raw: "redis://[::1]:6380", want: URL{Kind: KindNode, Addrs: []string{"[::1]:6380"}}},
		{raw: "redis://[::1]", want: URL{Kind: KindNode, Addrs: []string{"[::1]:6379"}}, str: "redis://[::1]:6379"},
		{
			raw:  "redis://alice:s%40cr%3At@h:6379/2",
			want: URL{Kind: KindNode, Addrs: []string{"h:6379"}, Username: "alice", Password: "s@cr:t", DB: 2},
			str:  "redis://alice:xxxxx@h:6379/2",
		},
		{
			raw:  "redis://:onlypass@h:6379",
			want: URL{Kind: KindNode, Addrs: []string{"h:6379"}, Password: "onlypass"},
			str:  "redis://:xxxxx@h:6379",
		},
		{raw: "redis://bob@h:6379", want: URL{Kind: KindNode, Addrs: []string{"h:6379"}, Username: "bob"}},
		{
			raw:  "redis://h:6379?dial_timeout=1s&read_timeout=500ms&write_timeout=2s&pool_size=7",
			want: URL{Kind: KindNode, Addrs: []string{"h:6379"}, DialTimeout: time.Second, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 2 * time.Second, PoolSize: 7},
		},
		{raw: "rediss://u:p@cache.example.com:6380", want: URL{Kind: KindNode, TLS: true, Addrs: []string{"cache.example.com:6380"}, Username: "u", Password: "p"}, str: "rediss://u:xxxxx@cache.example.com:6380"},
		{raw: "rediss://h:6380?skip_verify=true", want: URL{Kind: KindNode, TLS: true, SkipVerify: true, Addrs: []string{"h:6380"}}},
		{
			raw:  "redis+sentinel://s1:26379,s2:26380,s3/mymaster",
			want: URL{Kind: KindSentinel, Addrs: []string{"s1:26379", "s2:26380", "s3:26379"}, MasterName: "mymaster"},
			str:  "redis+sentinel://s1:26379,s2:26380,s3:26379/mymaster",
		},
		{
			raw:  "redis+sentinel://u:p@s1:26379/mymaster/4?sentinel_username=su&sentinel_password=sp",
			want: URL{Kind: KindSentinel, Addrs: []string{"s1:26379"}, MasterName: "mymaster", Username: "u", Password: "p", DB: 4, SentinelUsername: "su", SentinelPassword: "sp"},
			str:  "redis+sentinel://u:xxxxx@s1:26379/mymaster/4?sentinel_username=su&sentinel_password=xxxxx",
		},
		{raw: "rediss+sentinel://s1:26379/m", want: URL{Kind: KindSentinel, TLS: true, Addrs: []string{"s1:26379"}, MasterName: "m"}},
		{
			raw:  "redis+cluster://n1:7000,n2:7001,n3:7002",
			want: URL{Kind: KindCluster, Addrs: []string{"n1:7000", "n2:7001", "n3:7002"}},
		},
		{raw: "redis+cluster://n1:7000/0", want: URL{Kind: KindCluster, Addrs: []string{"n1:7000"}}, str: "redis+cluster://n1:7000"},
		{raw: "rediss+cluster://u:p@n1:7000", want: URL{Kind: KindCluster, TLS: true, Addrs: []string{"n1:7000"}, Username: "u", Password: "p"}, str: "rediss+cluster://u:xxxxx@n1:7000"},
		{raw: "memory://127.0.0.1:6390", want: URL{Kind: KindMemory, Addrs: []string{"127.0.0.1:6390"}}},
		{raw: "memory://:6390", want: URL{Kind: KindMemory, Addrs: []string{"127.0.0.1:6390"}}, str: "memory://127.0.0.1:6390"},
		{raw: "  redis://h:1  ", want: URL{Kind: KindNode, Addrs: []string{"h:1"}}, str: "redis://h:1"},
		// unix sockets: go-redis's form and asynq's
		{raw: "unix:///var/run/redis.sock", want: URL{Kind: KindNode, Network: "unix", Addrs: []string{"/var/run/redis.sock"}}},
		{
			raw:  "unix://bob:s%40cret@/var/run/redis.sock?db=3&dial_timeout=1s",
			want: URL{Kind: KindNode, Network: "unix", Addrs: []string{"/var/run/redis.sock"}, Username: "bob", Password: "s@cret", DB: 3, DialTimeout: time.Second},
			str:  "unix://bob:xxxxx@/var/run/redis.sock?db=3&dial_timeout=1s",
		},
		{raw: "redis-socket:///tmp/redis.sock", want: URL{Kind: KindNode, Network: "unix", Addrs: []string{"/tmp/redis.sock"}}, str: "unix:///tmp/redis.sock"},
		{
			raw:  "redis-socket://:pw@/tmp/redis.sock?db=2",
			want: URL{Kind: KindNode, Network: "unix", Addrs: []string{"/tmp/redis.sock"}, Password: "pw", DB: 2},
			str:  "unix://:xxxxx@/tmp/redis.sock?db=2",
		},
		// asynq's Sentinel form: the master in the query, the password the Sentinels'
		{
			raw:  "redis-sentinel://:sp@s1:26379,s2:26380?master=mymaster",
			want: URL{Kind: KindSentinel, Addrs: []string{"s1:26379", "s2:26380"}, MasterName: "mymaster", SentinelPassword: "sp"},
			str:  "redis+sentinel://s1:26379,s2:26380/mymaster?sentinel_password=xxxxx",
		},
		{raw: "redis-sentinel://s1?master=m", want: URL{Kind: KindSentinel, Addrs: []string{"s1:26379"}, MasterName: "m"}, str: "redis+sentinel://s1:26379/m"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			got, err := Parse(tt.raw)
			require.NoError(t, err)
			require.Equal(t, tt.want, *got)
			want := tt.str
			if want == "" {
				want = tt.raw
			}
			require.Equal(t, want, got.String())
			again, err := Parse(got.String())
			require.NoError(t, err, "String() must parse back")
			require.Equal(t, got.Kind, again.Kind)
			require.Equal(t, got.Addrs, again.Addrs)
		})
	}
}

func TestParseBadInput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		raw     string
		wantMsg string
	}{
		{"", "empty"},
		{"127.0.0.1:6379", "no scheme; write it as a URL, e.g. redis://127.0.0.1:6379"},
		{"http://h:6379", `unknown scheme "http"`},
		{"redis-sentinel://h:26379", "no master name; write redis-sentinel://HOST:PORT,HOST:PORT?master=MASTER"},
		{"redis-sentinel://h:26379?master=", "master=: give the name Sentinel monitors"},
		{"redis-sentinel://h:26379/m", "redis-sentinel:// names the master as ?master=MASTER"},
		{"redis+sentinel://h:26379/m?master=m", `unknown query parameter "master"`},
		{"unix://", "give the socket's absolute path"},
		{"unix://redis.sock", `socket path "redis.sock": give the socket's absolute path`},
		{"unix:///tmp/", "give the socket's absolute path"},
		{"unix:///tmp/r.sock?db=x", "db=x: must be a number"},
		{"redis-socket:///tmp/r.sock?db=-1", "db=-1: must be a number"},
		{"redis://h:1?db=1", `unknown query parameter "db"`},
		{"unix://u:p%zz@/tmp/r.sock", "password is not valid percent-encoding"},
		{"unix:///tmp/r.sock#x", "unexpected #"},
		{"redis://", "no host"},
		{"redis:///3", "no host"},
		{"redis://:6379", `address ":6379": no host`},
		{"redis://h:abc", `port "abc" must be a number from 1 to 65535`},
		{"redis://h:0", `port "0" must be a number`},
		{"redis://h:70000", `port "70000" must be a number`},
		{"redis://h:1:2", `address "h:1:2": want HOST:PORT`},
		{"redis://h1:1,h2:2", "redis:// takes one HOST:PORT; for several use redis+sentinel:// or redis+cluster://"},
		{"redis://h:1,", "empty address in the host list"},
		{"redis://h:1/x", `database "x": must be a number`},
		{"redis://h:1/-1", `database "-1": must be a number`},
		{"redis://h:1/1/2", `path "/1/2": only a database number may follow`},
		{"redis://h:1#frag", "unexpected #"},
		{"redis://u:p%zz@h:1", "password is not valid percent-encoding"},
		{"redis://u%zz:p@h:1", "user name is not valid percent-encoding"},
		{"redis://h:1?timeout=1s", `unknown query parameter "timeout"; known here: dial_timeout, read_timeout, write_timeout, pool_size`},
		{"redis://h:1?dial_timeout=soon", "dial_timeout=soon: want a positive duration"},
		{"redis://h:1?read_timeout=-1s", "read_timeout=-1s: want a positive duration"},
		{"redis://h:1?pool_size=0", "pool_size=0: want a whole number of at least 1"},
		{"redis://h:1?pool_size=1&pool_size=2", "pool_size is given 2 times"},
		{"redis://h:1?skip_verify=true", `unknown query parameter "skip_verify"`},
		{"rediss://h:1?skip_verify=maybe", "skip_verify=maybe: want true or false"},
		{"redis://h:1?a=%zz", "is not valid"},
		{"redis://h:1?sentinel_password=x", `unknown query parameter "sentinel_password"`},
		{"redis+sentinel://s1:26379", "no master name"},
		{"redis+sentinel://s1:26379/", "no master name"},
		{"redis+sentinel://s1:26379/m/1/2", "want /MASTER or /MASTER/DB"},
		{"redis+sentinel://s1:26379/m/x", `database "x"`},
		{"redis+cluster://n1:7000/1", "a Redis Cluster has only database 0"},
		{"redis+cluster://n1:7000,,n2:7001", "empty address in the host list"},
		{"memory://", "no host"},
		{"memory://u:p@127.0.0.1:1", "memory:// takes only an address"},
		{"memory://127.0.0.1:1/2", "memory:// takes only an address"},
		{"memory://127.0.0.1:1?pool_size=2", "memory:// takes only an address"},
		{"memory://a:1,b:2", "memory:// takes one HOST:PORT"},
		{"redis://h st:1", `host "h st" is not a host name`},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			u, err := Parse(tt.raw)
			require.Nil(t, u)
			var pe *ParseError
			require.ErrorAs(t, err, &pe)
			require.Contains(t, pe.Reason, tt.wantMsg)
			msg := err.Error()
			require.True(t, strings.HasPrefix(msg, `Redis URL "`+redact(strings.TrimSpace(tt.raw))+`": `), msg)
			require.Contains(t, msg, "; accepted forms: redis://[USER:PASSWORD@]HOST:PORT[/DB], rediss://... (TLS), redis+sentinel://")
			require.NotContains(t, msg, "\n")
		})
	}
}

func TestParseErrorHidesPasswords(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"redis://alice:hunter2@h:1/x",
		"redis+sentinel://alice:hunter2@s:1/m?sentinel_password=hunter2&bad=1",
		"redis+sentinel://s:1/m?sentinel_password=hunter2&bad=1",
		"unix://alice:hunter2@/tmp/r.sock?bad=1",
		"redis-socket://:hunter2@/tmp/r.sock?bad=1",
		"redis-sentinel://:hunter2@s:1?bad=1",
	} {
		_, err := Parse(raw)
		require.Error(t, err)
		require.NotContains(t, err.Error(), "hunter2")
		require.Contains(t, err.Error(), "xxxxx")
	}
}

func TestValue(t *testing.T) {
	t.Parallel()
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == EnvVar {
				return v
			}
			return ""
		}
	}
	require.Equal(t, "redis://flag:1", Value("redis://flag:1", env("redis://env:1")))
	require.Equal(t, "redis://env:1", Value("", env("redis://env:1")))
	require.Equal(t, Default, Value("", env("  ")))
	require.Equal(t, Default, Value("", nil))
}

func TestClientOptions(t *testing.T) {
	t.Parallel()
	parse := func(raw string) *URL {
		u, err := Parse(raw)
		require.NoError(t, err)
		return u
	}

	node := parse("rediss://u:p@h:6380/2?pool_size=5&dial_timeout=1s&skip_verify=true")
	o := node.UniversalOptions()
	require.Equal(t, []string{"h:6380"}, o.Addrs)
	require.Equal(t, "u", o.Username)
	require.Equal(t, "p", o.Password)
	require.Equal(t, 2, o.DB)
	require.Equal(t, 5, o.PoolSize)
	require.Equal(t, time.Second, o.DialTimeout)
	require.NotNil(t, o.TLSConfig)
	require.Equal(t, uint16(tls.VersionTLS12), o.TLSConfig.MinVersion)
	require.True(t, o.TLSConfig.InsecureSkipVerify)
	require.Empty(t, o.TLSConfig.ServerName, "each node's certificate is checked against its own name")
	c := node.NewClient()
	_, isNode := c.(*redis.Client)
	require.True(t, isNode)
	require.NoError(t, c.Close())
	require.Equal(t, asynq.RedisClientOpt{
		Addr: "h:6380", Username: "u", Password: "p", DB: 2, PoolSize: 5, DialTimeout: time.Second, TLSConfig: o.TLSConfig,
	}, withTLS(node.AsynqOpt(), o.TLSConfig))

	plain := parse("redis://h:1")
	require.Nil(t, plain.UniversalOptions().TLSConfig)
	require.Equal(t, asynq.RedisClientOpt{Addr: "h:1"}, plain.AsynqOpt())

	mem := parse("memory://127.0.0.1:6390")
	require.Equal(t, asynq.RedisClientOpt{Addr: "127.0.0.1:6390"}, mem.AsynqOpt())
	c = mem.NewClient()
	_, isNode = c.(*redis.Client)
	require.True(t, isNode)
	require.NoError(t, c.Close())

	sen := parse("redis+sentinel://u:p@s1:1,s2:2/mymaster/3?sentinel_username=su&sentinel_password=sp")
	o = sen.UniversalOptions()
	require.Equal(t, "mymaster", o.MasterName)
	require.Equal(t, []string{"s1:1", "s2:2"}, o.Addrs)
	require.Equal(t, "su", o.SentinelUsername)
	require.Equal(t, "sp", o.SentinelPassword)
	require.Equal(t, 3, o.DB)
	require.Equal(t, asynq.RedisFailoverClientOpt{
		MasterName: "mymaster", SentinelAddrs: []string{"s1:1", "s2:2"}, SentinelUsername: "su", SentinelPassword: "sp",
		Username: "u", Password: "p", DB: 3,
	}, sen.AsynqOpt())
	c = sen.NewClient()
	_, isFailover := c.(*redis.Client) // NewUniversalClient returns a failover *redis.Client
	require.True(t, isFailover)
	require.NoError(t, c.Close())

	cl := parse("redis+cluster://u:p@n1:7000")
	o = cl.UniversalOptions()
	require.True(t, o.IsClusterMode, "one seed node is still a Cluster")
	require.Equal(t, asynq.RedisClusterClientOpt{Addrs: []string{"n1:7000"}, Username: "u", Password: "p"}, cl.AsynqOpt())
	c = cl.NewClient()
	_, isCluster := c.(*redis.ClusterClient)
	require.True(t, isCluster)
	require.NoError(t, c.Close())
}

// withTLS lets a test compare an option whose TLS config is a fresh pointer.
func withTLS(opt asynq.RedisConnOpt, cfg *tls.Config) asynq.RedisConnOpt {
	if o, ok := opt.(asynq.RedisClientOpt); ok {
		if o.TLSConfig != nil && o.TLSConfig.MinVersion == cfg.MinVersion && o.TLSConfig.InsecureSkipVerify == cfg.InsecureSkipVerify {
			o.TLSConfig = cfg
		}
		return o
	}
	return opt
}

func TestWhere(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"redis://h:1":                        "h:1",
		"memory://:2":                        "127.0.0.1:2",
		"redis+sentinel://a:1,b:2/m":         "Sentinel a:1,b:2 (master m)",
		"redis+cluster://n1:7000,n2:7001":    "Cluster n1:7000,n2:7001",
		"rediss://user:secret@host:6380/1":   "host:6380",
		"rediss+cluster://user:secret@n1:70": "Cluster n1:70",
	} {
		u, err := Parse(raw)
		require.NoError(t, err)
		require.Equal(t, want, u.Where())
	}
}

func TestParseErrorType(t *testing.T) {
	t.Parallel()
	_, err := Parse("nope")
	var pe *ParseError
	require.True(t, errors.As(err, &pe))
	require.Equal(t, "nope", pe.Value)
}

// TestAsynqFormsAsAsynqReadsThem: asynq's own URL forms give the
// connection options asynq.ParseRedisURI gives, so that an application's
// asynq URL reaches the same server, with the same credentials.
func TestAsynqFormsAsAsynqReadsThem(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"redis-socket:///var/run/redis.sock",
		"redis-socket://:pw@/var/run/redis.sock?db=4",
		"redis-sentinel://s1:26379,s2:26380?master=mymaster",
		"redis-sentinel://:sp@s1:26379?master=mymaster",
		"redis://h:6379/2",
		"redis://:pw@h:6379",
	} {
		want, err := asynq.ParseRedisURI(raw)
		require.NoError(t, err, raw)
		u, err := Parse(raw)
		require.NoError(t, err, raw)
		require.Equal(t, want, u.AsynqOpt(), raw)
	}
}
