// Package redisurl reads the Redis address given to sluice's binaries
// (--redis, or SLUICE_REDIS_URL) and turns it into a go-redis client and an
// asynq connection option for the same server or servers.
//
// Accepted forms (Forms lists them for help texts):
//
//	redis://[USER:PASSWORD@]HOST:PORT[/DB]
//	rediss://[USER:PASSWORD@]HOST:PORT[/DB]                         TLS
//	redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB]
//	redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]
//	unix://[USER:PASSWORD@]/PATH/redis.sock[?db=N]                  a unix socket
//	memory://HOST:PORT                                              a worker's embedded Redis
//
// rediss+sentinel:// and rediss+cluster:// are the TLS variants of the
// Sentinel and Cluster forms. asynq's own forms (asynq.ParseRedisURI) are
// read as asynq reads them, so that an application's asynq URL works as
// it is:
//
//	redis-socket://[:PASSWORD@]/PATH/redis.sock[?db=N]              a unix socket
//	redis-sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]?master=MASTER
//
// where, as in asynq, the password of redis-sentinel:// is the Sentinels'
// own (sentinel_password). The port may be left out (6379; 26379 for
// Sentinels). USER and PASSWORD are percent-encoded like any URL userinfo;
// they authenticate with the data nodes (for Sentinel: with the master and
// replicas). Query parameters tune the connection:
//
//	dial_timeout=5s read_timeout=3s write_timeout=3s pool_size=20
//	sentinel_username=U sentinel_password=P   (Sentinel forms: the Sentinels' own ACL user)
//	skip_verify=true                          (TLS forms: do not verify the certificate; for tests only)
//
// memory://HOST:PORT names the address at which `worker --redis memory://…`
// starts an embedded Redis for a single-machine trial; this package only
// parses it (Kind is KindMemory) and connects to that address like redis://.
//
// Typical use:
//
//	u, err := redisurl.Parse(redisurl.Value(flagValue, os.Getenv))
//	if err != nil { … }           // a *ParseError: name the value, list the forms
//	client := u.NewClient()
//	if err := u.Ping(ctx, client, 0); err != nil { … } // one line: cannot reach Redis at …
//	srv := asynq.NewServer(u.AsynqOpt(), cfg)
package redisurl

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// EnvVar is the environment variable that gives the Redis URL when no
// --redis flag is given.
const EnvVar = "SLUICE_REDIS_URL"

// Default is the Redis URL used when neither --redis nor SLUICE_REDIS_URL is set.
const Default = "redis://127.0.0.1:6379"

// Default ports.
const (
	PortDefault         = 6379
	SentinelPortDefault = 26379
)

// Forms is the list of accepted URL forms, one per line, for help texts and
// error messages.
const Forms = `redis://[USER:PASSWORD@]HOST:PORT[/DB]
rediss://[USER:PASSWORD@]HOST:PORT[/DB]                   TLS
redis+sentinel://[USER:PASSWORD@]HOST:PORT,.../MASTER[/DB]
redis+cluster://[USER:PASSWORD@]HOST:PORT,...
rediss+sentinel://..., rediss+cluster://...               TLS
unix:///PATH/redis.sock[?db=N]   a unix socket
memory://HOST:PORT               a worker's embedded Redis
asynq's forms: redis-socket://[:PASSWORD@]/PATH[?db=N] and
redis-sentinel://[:PASSWORD@]HOST:PORT,...?master=MASTER`

// formsInline is Forms, shorter and on one line, for error messages.
const formsInline = "redis://[USER:PASSWORD@]HOST:PORT[/DB], rediss://... (TLS), " +
	"redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB], " +
	"redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...], unix:///PATH/redis.sock[?db=N], memory://HOST:PORT, " +
	"and asynq's redis-socket:// and redis-sentinel://HOST:PORT,...?master=MASTER"

// Kind is the kind of deployment a URL points at.
type Kind string

const (
	// KindNode is a single Redis server (redis://, rediss://).
	KindNode Kind = "node"
	// KindSentinel is a master found through Redis Sentinel.
	KindSentinel Kind = "sentinel"
	// KindCluster is a Redis Cluster, reached through any of its nodes.
	KindCluster Kind = "cluster"
	// KindMemory is the embedded Redis a worker starts at an address.
	KindMemory Kind = "memory"
)

// URL is a parsed Redis URL. The zero value is not useful; use Parse.
type URL struct {
	Kind Kind
	// Addrs are HOST:PORT: the server (node, memory), the Sentinels, or the
	// Cluster's seed nodes; for a unix socket, its path.
	Addrs []string
	// Network is "unix" for a server reached through a unix socket
	// (unix://, redis-socket://), "" for TCP.
	Network string
	// MasterName is the Sentinel master's name.
	MasterName string
	// Username and Password authenticate with the data nodes.
	Username, Password string
	// SentinelUsername and SentinelPassword authenticate with the Sentinels.
	SentinelUsername, SentinelPassword string
	// DB is the database number; always 0 on a Cluster.
	DB int
	// TLS is set for the rediss forms.
	TLS bool
	// SkipVerify turns off certificate verification (skip_verify=true).
	SkipVerify bool
	// Timeouts and pool size from the query; zero means go-redis's default.
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	PoolSize                               int
}

// ParseError is a URL that cannot be used. Value is the URL as given, with
// any password replaced by "xxxxx".
type ParseError struct {
	Value  string
	Reason string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("Redis URL %q: %s; accepted forms: %s", e.Value, e.Reason, formsInline)
}

// Value picks the Redis URL a binary should use: the flag's value when set,
// else SLUICE_REDIS_URL from getenv, else Default.
func Value(flag string, getenv func(string) string) string {
	if flag != "" {
		return flag
	}
	if getenv != nil {
		if v := strings.TrimSpace(getenv(EnvVar)); v != "" {
			return v
		}
	}
	return Default
}

// schemes maps every accepted scheme to its kind and TLS.
var schemes = map[string]struct {
	kind Kind
	tls  bool
}{
	"redis":           {KindNode, false},
	"rediss":          {KindNode, true},
	"redis+sentinel":  {KindSentinel, false},
	"rediss+sentinel": {KindSentinel, true},
	"redis+cluster":   {KindCluster, false},
	"rediss+cluster":  {KindCluster, true},
	"memory":          {KindMemory, false},
	"unix":            {KindNode, false},
	"redis-socket":    {KindNode, false},
	"redis-sentinel":  {KindSentinel, false},
}

// Parse reads a Redis URL in one of the accepted forms (see the package
// documentation). Every error is a *ParseError.
func Parse(raw string) (*URL, error) {
	bad := func(format string, args ...any) error {
		return &ParseError{Value: redact(raw), Reason: fmt.Sprintf(format, args...)}
	}
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, bad("empty")
	}
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, bad("no scheme; write it as a URL, e.g. redis://%s", strings.TrimPrefix(raw, "//"))
	}
	scheme = strings.ToLower(scheme)
	sc, ok := schemes[scheme]
	if !ok {
		return nil, bad("unknown scheme %q", scheme)
	}
	u := &URL{Kind: sc.kind, TLS: sc.tls}
	if scheme == "unix" || scheme == "redis-socket" {
		if err := u.parseSocket(rest, bad); err != nil {
			return nil, err
		}
		return u, nil
	}

	// Split "userinfo@hosts/path?query" by hand: url.Parse rejects the
	// comma-separated host lists of the Sentinel and Cluster forms.
	rest, rawQuery, _ := strings.Cut(rest, "?")
	if strings.Contains(rest, "#") {
		return nil, bad("unexpected #; percent-encode it as %%23 inside a password")
	}
	authority, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		if u.Kind == KindMemory {
			return nil, bad("memory:// takes only an address, e.g. memory://127.0.0.1:6379")
		}
		if err := u.parseUserinfo(authority[:at], bad); err != nil {
			return nil, err
		}
		authority = authority[at+1:]
	}
	if authority == "" {
		return nil, bad("no host; e.g. %s://127.0.0.1:6379", scheme)
	}
	defPort := PortDefault
	if u.Kind == KindSentinel {
		defPort = SentinelPortDefault
	}
	for _, h := range strings.Split(authority, ",") {
		addr, err := hostPort(h, defPort, u.Kind == KindMemory)
		if err != nil {
			return nil, bad("%v", err)
		}
		u.Addrs = append(u.Addrs, addr)
	}
	if len(u.Addrs) > 1 && (u.Kind == KindNode || u.Kind == KindMemory) {
		return nil, bad("%s:// takes one HOST:PORT; for several use redis+sentinel:// or redis+cluster://", scheme)
	}

	segs := []string{}
	if path != "" {
		segs = strings.Split(strings.TrimSuffix(path, "/"), "/")
	}
	parseDB := func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 1_000_000 {
			return bad("database %q: must be a number such as 0 or 3", s)
		}
		u.DB = n
		return nil
	}
	switch u.Kind {
	case KindNode:
		if len(segs) > 1 {
			return nil, bad("path %q: only a database number may follow the address, e.g. /3", "/"+path)
		}
		if len(segs) == 1 {
			if err := parseDB(segs[0]); err != nil {
				return nil, err
			}
		}
	case KindSentinel:
		if scheme == "redis-sentinel" {
			// asynq's form: the master in the query, the password the
			// Sentinels'
			if len(segs) > 0 {
				return nil, bad("path %q: redis-sentinel:// names the master as ?master=MASTER (or write redis+sentinel://HOST:PORT/MASTER)", "/"+path)
			}
			u.SentinelUsername, u.SentinelPassword, u.Username, u.Password = u.Username, u.Password, "", ""
			break
		}
		if len(segs) == 0 || segs[0] == "" {
			return nil, bad("no master name; write redis+sentinel://HOST:PORT,HOST:PORT/MASTER (the name Sentinel monitors, e.g. mymaster)")
		}
		if len(segs) > 2 {
			return nil, bad("path %q: want /MASTER or /MASTER/DB", "/"+path)
		}
		name, err := url.PathUnescape(segs[0])
		if err != nil {
			return nil, bad("master name %q is not valid percent-encoding", segs[0])
		}
		u.MasterName = name
		if len(segs) == 2 {
			if err := parseDB(segs[1]); err != nil {
				return nil, err
			}
		}
	case KindCluster:
		if len(segs) > 1 || (len(segs) == 1 && segs[0] != "0") {
			return nil, bad("path %q: a Redis Cluster has only database 0; remove the path", "/"+path)
		}
	case KindMemory:
		if len(segs) > 0 {
			return nil, bad("memory:// takes only an address, e.g. memory://127.0.0.1:6379")
		}
	}

	if rawQuery != "" {
		if u.Kind == KindMemory {
			return nil, bad("memory:// takes only an address, e.g. memory://127.0.0.1:6379")
		}
		if err := u.parseQuery(rawQuery, scheme); err != nil {
			return nil, bad("%v", err)
		}
	}
	if scheme == "redis-sentinel" && u.MasterName == "" {
		return nil, bad("no master name; write redis-sentinel://HOST:PORT,HOST:PORT?master=MASTER (the name Sentinel monitors, e.g. mymaster)")
	}
	return u, nil
}

// parseUserinfo reads USER[:PASSWORD], percent-encoded.
func (u *URL) parseUserinfo(info string, bad func(string, ...any) error) error {
	user, pass, hasPass := strings.Cut(info, ":")
	var err error
	if u.Username, err = url.PathUnescape(user); err != nil {
		return bad("user name is not valid percent-encoding")
	}
	if hasPass {
		if u.Password, err = url.PathUnescape(pass); err != nil {
			return bad("password is not valid percent-encoding; encode special characters, e.g. %%40 for @")
		}
	}
	return nil
}

// parseSocket reads the rest of a unix:// or redis-socket:// URL:
// [USER:PASSWORD@]/PATH[?QUERY].
func (u *URL) parseSocket(rest string, bad func(string, ...any) error) error {
	u.Network = "unix"
	rest, rawQuery, _ := strings.Cut(rest, "?")
	if strings.Contains(rest, "#") {
		return bad("unexpected #; percent-encode it as %%23 inside a password")
	}
	if at := strings.Index(rest, "@"); at >= 0 && !strings.Contains(rest[:at], "/") {
		if err := u.parseUserinfo(rest[:at], bad); err != nil {
			return err
		}
		rest = rest[at+1:]
	}
	path, err := url.PathUnescape(rest)
	if err != nil {
		return bad("path %q is not valid percent-encoding", rest)
	}
	if !strings.HasPrefix(path, "/") || strings.HasSuffix(path, "/") {
		return bad("socket path %q: give the socket's absolute path, e.g. unix:///var/run/redis/redis.sock", path)
	}
	u.Addrs = []string{path}
	if rawQuery != "" {
		if err := u.parseQuery(rawQuery, "unix"); err != nil {
			return bad("%v", err)
		}
	}
	return nil
}

// hostPort checks one HOST[:PORT] and fills in the default port.
func hostPort(h string, defPort int, memory bool) (string, error) {
	if h == "" {
		return "", fmt.Errorf("empty address in the host list")
	}
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		// No port: "host", "[::1]" or "::1".
		if strings.Contains(err.Error(), "missing port") {
			host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), strconv.Itoa(defPort)
		} else {
			return "", fmt.Errorf("address %q: want HOST:PORT", h)
		}
	}
	if host == "" {
		if !memory {
			return "", fmt.Errorf("address %q: no host; e.g. 127.0.0.1:%s", h, port)
		}
		host = "127.0.0.1"
	}
	if strings.ContainsAny(host, " /\\@?#%") {
		return "", fmt.Errorf("host %q is not a host name or IP address", host)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("address %q: port %q must be a number from 1 to 65535", h, port)
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}

// parseQuery reads a URL's query parameters; scheme picks the ones only
// some forms take (db for a socket, master for redis-sentinel://).
func (u *URL) parseQuery(raw, scheme string) error {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return fmt.Errorf("query %q is not valid", raw)
	}
	known := "dial_timeout, read_timeout, write_timeout, pool_size"
	if u.Kind == KindSentinel {
		known += ", sentinel_username, sentinel_password"
	}
	if u.TLS {
		known += ", skip_verify"
	}
	if u.Network == "unix" {
		known += ", db"
	}
	if scheme == "redis-sentinel" {
		known += ", master"
	}
	for key, vals := range q {
		if len(vals) != 1 {
			return fmt.Errorf("query parameter %s is given %d times; give it once", key, len(vals))
		}
		val := vals[0]
		duration := func(dst *time.Duration) error {
			d, err := time.ParseDuration(val)
			if err != nil || d <= 0 {
				return fmt.Errorf("%s=%s: want a positive duration such as 3s or 500ms", key, val)
			}
			*dst = d
			return nil
		}
		switch {
		case key == "dial_timeout":
			err = duration(&u.DialTimeout)
		case key == "read_timeout":
			err = duration(&u.ReadTimeout)
		case key == "write_timeout":
			err = duration(&u.WriteTimeout)
		case key == "pool_size":
			n, perr := strconv.Atoi(val)
			if perr != nil || n < 1 || n > 100_000 {
				err = fmt.Errorf("pool_size=%s: want a whole number of at least 1", val)
			}
			u.PoolSize = n
		case key == "sentinel_username" && u.Kind == KindSentinel:
			u.SentinelUsername = val
		case key == "sentinel_password" && u.Kind == KindSentinel:
			u.SentinelPassword = val
		case key == "db" && u.Network == "unix":
			n, perr := strconv.Atoi(val)
			if perr != nil || n < 0 || n > 1_000_000 {
				err = fmt.Errorf("db=%s: must be a number such as 0 or 3", val)
			}
			u.DB = n
		case key == "master" && scheme == "redis-sentinel":
			if val == "" {
				err = errors.New("master=: give the name Sentinel monitors, e.g. master=mymaster")
			}
			u.MasterName = val
		case key == "skip_verify" && u.TLS:
			b, perr := strconv.ParseBool(val)
			if perr != nil {
				err = fmt.Errorf("skip_verify=%s: want true or false", val)
			}
			u.SkipVerify = b
		default:
			err = fmt.Errorf("unknown query parameter %q; known here: %s", key, known)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// redact hides the passwords of a URL as given, for messages.
func redact(raw string) string {
	out := raw
	if scheme, rest, ok := strings.Cut(raw, "://"); ok {
		authority, tail := rest, ""
		if i := strings.IndexAny(rest, "/?"); i >= 0 {
			authority, tail = rest[:i], rest[i:]
		}
		if at := strings.LastIndex(authority, "@"); at >= 0 {
			if user, _, hasPass := strings.Cut(authority[:at], ":"); hasPass {
				out = scheme + "://" + user + ":xxxxx@" + authority[at+1:] + tail
			}
		}
	}
	// A sentinel_password in the query is a secret too, and so is a
	// socket URL's password, which comes before its path.
	if scheme, rest, ok := strings.Cut(out, "://"); ok && (strings.EqualFold(scheme, "unix") || strings.EqualFold(scheme, "redis-socket")) {
		if at := strings.Index(rest, "@"); at >= 0 && !strings.Contains(rest[:at], "/") {
			if user, _, hasPass := strings.Cut(rest[:at], ":"); hasPass {
				out = scheme + "://" + user + ":xxxxx@" + rest[at+1:]
			}
		}
	}
	if i := strings.Index(out, "sentinel_password="); i >= 0 {
		i += len("sentinel_password=")
		end := strings.IndexByte(out[i:], '&')
		if end < 0 {
			end = len(out) - i
		}
		out = out[:i] + "xxxxx" + out[i+end:]
	}
	return out
}

// String is the URL in canonical form with the passwords replaced by xxxxx,
// safe to log.
func (u *URL) String() string {
	var b strings.Builder
	scheme := "redis"
	if u.TLS {
		scheme = "rediss"
	}
	switch u.Kind {
	case KindSentinel:
		scheme += "+sentinel"
	case KindCluster:
		scheme += "+cluster"
	case KindMemory:
		scheme = "memory"
	}
	if u.Network == "unix" {
		scheme = "unix"
	}
	b.WriteString(scheme + "://")
	if u.Username != "" || u.Password != "" {
		b.WriteString(url.PathEscape(u.Username))
		if u.Password != "" {
			b.WriteString(":xxxxx")
		}
		b.WriteString("@")
	}
	b.WriteString(strings.Join(u.Addrs, ","))
	if u.Kind == KindSentinel {
		b.WriteString("/" + url.PathEscape(u.MasterName))
	}
	var q []string
	add := func(k, v string) { q = append(q, k+"="+url.QueryEscape(v)) }
	switch {
	case u.DB != 0 && u.Network == "unix":
		add("db", strconv.Itoa(u.DB))
	case u.DB != 0:
		b.WriteString("/" + strconv.Itoa(u.DB))
	}
	if u.DialTimeout > 0 {
		add("dial_timeout", u.DialTimeout.String())
	}
	if u.ReadTimeout > 0 {
		add("read_timeout", u.ReadTimeout.String())
	}
	if u.WriteTimeout > 0 {
		add("write_timeout", u.WriteTimeout.String())
	}
	if u.PoolSize > 0 {
		add("pool_size", strconv.Itoa(u.PoolSize))
	}
	if u.SentinelUsername != "" {
		add("sentinel_username", u.SentinelUsername)
	}
	if u.SentinelPassword != "" {
		q = append(q, "sentinel_password=xxxxx")
	}
	if u.SkipVerify {
		add("skip_verify", "true")
	}
	if len(q) > 0 {
		b.WriteString("?" + strings.Join(q, "&"))
	}
	return b.String()
}

// Where names the servers for messages: "127.0.0.1:6379", "Sentinel
// 10.0.0.1:26379,10.0.0.2:26379 (master mymaster)" or "Cluster node(s) …".
func (u *URL) Where() string {
	addrs := strings.Join(u.Addrs, ",")
	switch u.Kind {
	case KindSentinel:
		return fmt.Sprintf("Sentinel %s (master %s)", addrs, u.MasterName)
	case KindCluster:
		return "Cluster " + addrs
	}
	if u.Network == "unix" {
		return "unix socket " + addrs
	}
	return addrs
}

func (u *URL) tlsConfig() *tls.Config {
	if !u.TLS {
		return nil
	}
	// ServerName stays empty: crypto/tls then checks each node's certificate
	// against that node's own host name, which is right for Sentinel and
	// Cluster, where the nodes have different names.
	return &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: u.SkipVerify} //nolint:gosec // only with skip_verify=true
}

// UniversalOptions are go-redis options for the URL; redis.NewUniversalClient
// turns them into a *redis.Client, *redis.FailoverClient or
// *redis.ClusterClient. Callers may adjust them first (pool size, hooks).
func (u *URL) UniversalOptions() *redis.UniversalOptions {
	o := &redis.UniversalOptions{
		Addrs:        append([]string(nil), u.Addrs...),
		Username:     u.Username,
		Password:     u.Password,
		DB:           u.DB,
		TLSConfig:    u.tlsConfig(),
		DialTimeout:  u.DialTimeout,
		ReadTimeout:  u.ReadTimeout,
		WriteTimeout: u.WriteTimeout,
		PoolSize:     u.PoolSize,
	}
	switch u.Kind {
	case KindSentinel:
		o.MasterName = u.MasterName
		o.SentinelUsername = u.SentinelUsername
		o.SentinelPassword = u.SentinelPassword
	case KindCluster:
		o.IsClusterMode = true
	}
	if u.Network == "unix" {
		// UniversalOptions has no network: the dialer names it.
		path, timeout := u.Addrs[0], cmp.Or(u.DialTimeout, 5*time.Second)
		o.Dialer = func(ctx context.Context, _, _ string) (net.Conn, error) {
			d := net.Dialer{Timeout: timeout}
			return d.DialContext(ctx, "unix", path)
		}
	}
	return o
}

// NewClient returns a client for the URL: a *redis.Client for a node or a
// memory address, a *redis.FailoverClient for Sentinel, a
// *redis.ClusterClient for Cluster. The caller closes it. It does not
// connect; use Ping to check that the server answers.
func (u *URL) NewClient() redis.UniversalClient {
	return redis.NewUniversalClient(u.UniversalOptions())
}

// NewInteractiveClient is NewClient for a command a person waits on: a call
// ends at its context's deadline, where go-redis would otherwise wait out
// its own read timeout, and retry.
func (u *URL) NewInteractiveClient() redis.UniversalClient {
	o := u.UniversalOptions()
	o.ContextTimeoutEnabled = true
	return redis.NewUniversalClient(o)
}

// AsynqOpt returns the asynq connection option for the same server(s) as
// NewClient: asynq.RedisClientOpt, asynq.RedisFailoverClientOpt or
// asynq.RedisClusterClientOpt.
func (u *URL) AsynqOpt() asynq.RedisConnOpt {
	switch u.Kind {
	case KindSentinel:
		return asynq.RedisFailoverClientOpt{
			MasterName:       u.MasterName,
			SentinelAddrs:    append([]string(nil), u.Addrs...),
			SentinelUsername: u.SentinelUsername,
			SentinelPassword: u.SentinelPassword,
			Username:         u.Username,
			Password:         u.Password,
			DB:               u.DB,
			DialTimeout:      u.DialTimeout,
			ReadTimeout:      u.ReadTimeout,
			WriteTimeout:     u.WriteTimeout,
			PoolSize:         u.PoolSize,
			TLSConfig:        u.tlsConfig(),
		}
	case KindCluster:
		return asynq.RedisClusterClientOpt{
			Addrs:        append([]string(nil), u.Addrs...),
			Username:     u.Username,
			Password:     u.Password,
			DialTimeout:  u.DialTimeout,
			ReadTimeout:  u.ReadTimeout,
			WriteTimeout: u.WriteTimeout,
			TLSConfig:    u.tlsConfig(),
		}
	}
	return asynq.RedisClientOpt{
		Network:      u.Network,
		Addr:         u.Addrs[0],
		Username:     u.Username,
		Password:     u.Password,
		DB:           u.DB,
		DialTimeout:  u.DialTimeout,
		ReadTimeout:  u.ReadTimeout,
		WriteTimeout: u.WriteTimeout,
		PoolSize:     u.PoolSize,
		TLSConfig:    u.tlsConfig(),
	}
}
