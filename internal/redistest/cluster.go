package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterEnv is the environment variable that switches the shared test
// client to a Redis Cluster: with SLUICE_TEST_CLUSTER=1, UniversalClient
// and ExampleClient return a client of the shared Cluster instead of the
// shared single server, so a package's whole suite runs against a Cluster.
const ClusterEnv = "SLUICE_TEST_CLUSTER"

// ClusterURLEnv points the shared Cluster at an existing one, in the form
// redis+cluster://HOST:PORT[,HOST:PORT...], like REDIS_URL for the shared
// server. Tests that need to stop a node start a private Cluster anyway.
const ClusterURLEnv = "REDIS_CLUSTER_URL"

// Defaults of ClusterOptions.
const (
	ClusterMastersDefault     = 3
	ClusterNodeTimeoutDefault = 5 * time.Second
)

// ClusterSlots is the number of hash slots of a Redis Cluster.
const ClusterSlots = 16384

// ClusterMode reports whether SLUICE_TEST_CLUSTER asks for the Cluster pass
// ("1", "true", "yes" or "on").
func ClusterMode() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(ClusterEnv))) {
	case "1", "t", "true", "yes", "on":
		return true
	}
	return false
}

// SkipOnCluster skips the test in the Cluster pass. why names the
// single-node behaviour the test is about, e.g. "measures one server's
// commandstats"; use it only for tests that cannot mean anything on a
// Cluster, and make the others cluster-aware (ForEachMaster).
func SkipOnCluster(tb testing.TB, why string) {
	tb.Helper()
	if ClusterMode() {
		tb.Skipf("single-node test skipped in the Cluster pass (%s=1): %s", ClusterEnv, why)
	}
}

// UniversalClient returns a client of the shared Cluster in the Cluster
// pass and of the shared single server otherwise, closed when the test ends.
// Tests that should run on both take it instead of Client.
func UniversalClient(tb testing.TB) redis.UniversalClient {
	tb.Helper()
	if ClusterMode() {
		return ClusterClient(tb)
	}
	return Client(tb)
}

// ForEachMaster calls fn once for every master of c when c is a Cluster
// client (concurrently, as go-redis does) and once with c itself otherwise:
// what SCAN, KEYS, INFO or DBSIZE need to see the whole data set.
func ForEachMaster(ctx context.Context, c redis.UniversalClient, fn func(ctx context.Context, node redis.Cmdable) error) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return fn(ctx, node) })
	}
	return fn(ctx, c)
}

var (
	sharedCluster     *Cluster
	sharedClusterAddr []string
	sharedClusterOnce sync.Once
	sharedClusterErr  error
)

func sharedClusterAddrs() ([]string, error) {
	sharedClusterOnce.Do(func() {
		if u := os.Getenv(ClusterURLEnv); u != "" {
			sharedClusterAddr, sharedClusterErr = parseClusterURL(u)
			return
		}
		sharedCluster, sharedClusterErr = startCluster(ClusterOptions{})
		if sharedClusterErr == nil {
			sharedClusterAddr = sharedCluster.Addrs()
		}
	})
	return sharedClusterAddr, sharedClusterErr
}

func parseClusterURL(u string) ([]string, error) {
	rest, ok := strings.CutPrefix(u, "redis+cluster://")
	if !ok || rest == "" || strings.ContainsAny(rest, "@/?") {
		return nil, fmt.Errorf("%s=%q: want redis+cluster://HOST:PORT[,HOST:PORT...]", ClusterURLEnv, u)
	}
	return strings.Split(rest, ","), nil
}

// ClusterURL returns the redis+cluster:// URL of the shared Cluster,
// starting it on first use (about 3 s); Main stops it.
func ClusterURL(tb testing.TB) string {
	tb.Helper()
	addrs, err := sharedClusterAddrs()
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

// ClusterClient returns a client of the shared Cluster, closed when the
// test ends. Tests share the Cluster through Prefix, like the shared server.
func ClusterClient(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	addrs, err := sharedClusterAddrs()
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// ClusterOptions configure a private Cluster. The zero value is three
// masters without replicas.
type ClusterOptions struct {
	// Masters is the number of masters; the slots are split evenly among
	// them. ClusterMastersDefault (3) when 0.
	Masters int
	// Replicas is the number of replicas of each master.
	Replicas int
	// NodeTimeout is cluster-node-timeout: how long a node may be unreachable
	// before the others consider it failed and a replica takes over.
	// ClusterNodeTimeoutDefault when 0; failover tests want it short (1 s).
	NodeTimeout time.Duration
	// AppendOnly turns on AOF on every node, as Options.AppendOnly.
	AppendOnly bool
	// Args are extra redis-server arguments for every node.
	Args []string
}

func (o ClusterOptions) withDefaults() ClusterOptions {
	if o.Masters == 0 {
		o.Masters = ClusterMastersDefault
	}
	if o.NodeTimeout == 0 {
		o.NodeTimeout = ClusterNodeTimeoutDefault
	}
	return o
}

// Cluster is a Redis Cluster of redis-server processes owned by a test.
//
// Nodes are numbered from 0: the masters first (0 … Masters-1, master i
// serving the i-th part of the slots), then the replicas of master 0, of
// master 1, and so on. The numbering is the initial layout; after a
// failover Masters tells which nodes serve slots now.
type Cluster struct {
	opts  ClusterOptions
	nodes []*Server
	ids   []string // node id of each node
}

// NewCluster starts a private Cluster and waits until every node reports
// cluster_state:ok and all agree on the slot map; it is stopped and its
// directories removed when the test ends.
func NewCluster(tb testing.TB, opts *ClusterOptions) *Cluster {
	tb.Helper()
	var o ClusterOptions
	if opts != nil {
		o = *opts
	}
	c, err := startCluster(o)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	tb.Cleanup(c.stop)
	return c
}

// StartCluster starts a private Cluster, formed and ready, for a program
// that is not a test (a benchmark's own process); the caller stops it with
// Stop.
func StartCluster(opts *ClusterOptions) (*Cluster, error) {
	var o ClusterOptions
	if opts != nil {
		o = *opts
	}
	return startCluster(o)
}

// Stop stops every node of a Cluster StartCluster started.
func (c *Cluster) Stop() { c.stop() }

func startCluster(opts ClusterOptions) (*Cluster, error) {
	o := opts.withDefaults()
	if o.Masters < 1 || o.Masters > ClusterSlots || o.Replicas < 0 {
		return nil, fmt.Errorf("cluster of %d masters with %d replicas each: want at least 1 master and no negative replicas", o.Masters, o.Replicas)
	}
	if o.NodeTimeout < time.Millisecond {
		return nil, fmt.Errorf("cluster NodeTimeout %s: want at least 1ms", o.NodeTimeout)
	}
	c := &Cluster{opts: o}
	ok := false
	defer func() {
		if !ok {
			c.stop()
		}
	}()
	n := o.Masters * (1 + o.Replicas)
	for i := 0; i < n; i++ {
		s, err := c.startNode()
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, s)
	}
	if err := c.form(); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

func (c *Cluster) nodeArgs() []string {
	args := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(c.opts.NodeTimeout.Milliseconds(), 10),
		// A replica's first sync starts at once instead of after 5 s.
		"--repl-diskless-sync-delay", "0",
	}
	return append(args, c.opts.Args...)
}

// startNode starts one node on a port whose bus port (port+10000) is free too.
func (c *Cluster) startNode() (*Server, error) {
	var lastErr error
	for attempt := 0; attempt < 10; attempt++ {
		port, err := clusterPort()
		if err != nil {
			return nil, err
		}
		s, err := start(Options{Port: port, AppendOnly: c.opts.AppendOnly, Args: c.nodeArgs()})
		if err == nil {
			return s, nil
		}
		lastErr = err // most likely a port taken in the meantime
	}
	return nil, fmt.Errorf("start cluster node: %w", lastErr)
}

// clusterPort returns a free port whose cluster bus port is free as well.
func clusterPort() (int, error) {
	for {
		port, err := FreePort()
		if err != nil {
			return 0, err
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port, nil
	}
}

// form assigns the slots, joins the nodes, attaches the replicas and waits
// until the Cluster is ready.
func (c *Cluster) form() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	clients := make([]*redis.Client, len(c.nodes))
	for i, s := range c.nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
		defer clients[i].Close()
	}
	c.ids = make([]string, len(c.nodes))
	for i, cl := range clients {
		id, err := cl.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return fmt.Errorf("cluster node %s: CLUSTER MYID: %w", c.nodes[i].Addr(), err)
		}
		c.ids[i] = id
	}
	m := c.opts.Masters
	for i := 0; i < m; i++ {
		lo, hi := i*ClusterSlots/m, (i+1)*ClusterSlots/m-1
		if err := clients[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("cluster node %s: CLUSTER ADDSLOTSRANGE %d %d: %w", c.nodes[i].Addr(), lo, hi, err)
		}
		// Distinct config epochs spare the nodes a round of collision
		// resolution (redis-cli --cluster create does the same).
		if err := clients[i].Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("cluster node %s: CLUSTER SET-CONFIG-EPOCH: %w", c.nodes[i].Addr(), err)
		}
	}
	for i := 1; i < len(c.nodes); i++ {
		if err := clients[0].ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(c.nodes[i].Port())).Err(); err != nil {
			return fmt.Errorf("cluster node %s: CLUSTER MEET %s: %w", c.nodes[0].Addr(), c.nodes[i].Addr(), err)
		}
	}
	// A replica can follow its master only once it knows it.
	if err := waitUntil(ctx, "every node knows every other", func() error {
		for i, cl := range clients {
			nodes, err := cl.ClusterNodes(ctx).Result()
			if err != nil {
				return err
			}
			for _, id := range c.ids {
				if !knows(nodes, id) {
					return fmt.Errorf("node %s does not know node %s yet", c.nodes[i].Addr(), id)
				}
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for i := m; i < len(c.nodes); i++ {
		master := (i - m) / c.opts.Replicas
		if err := clients[i].ClusterReplicate(ctx, c.ids[master]).Err(); err != nil {
			return fmt.Errorf("cluster node %s: CLUSTER REPLICATE %s: %w", c.nodes[i].Addr(), c.nodes[master].Addr(), err)
		}
	}
	return c.wait(ctx)
}

// knows reports whether CLUSTER NODES output lists id as a node past the
// handshake.
func knows(nodes, id string) bool {
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id && !strings.Contains(f[2], "handshake") && !strings.Contains(f[2], "noaddr") {
			return true
		}
	}
	return false
}

// Wait waits until every running node (not killed, not frozen) reports
// cluster_state:ok, they all agree on the slot map, every slot is served by
// a running master and every running replica's link to its master is up.
// Use it after stopping, restarting or thawing a node; it fails the test
// after timeout.
func (c *Cluster) Wait(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := c.wait(ctx); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
}

func (c *Cluster) wait(ctx context.Context) error {
	return waitUntil(ctx, "the cluster is ready", func() error {
		live := map[string]bool{}
		for i, s := range c.nodes {
			if s.running() {
				live[c.ids[i]] = true
			}
		}
		if len(live) == 0 {
			return errors.New("no node is running")
		}
		var want string
		for i, s := range c.nodes {
			if !live[c.ids[i]] {
				continue
			}
			got, err := nodeReady(ctx, s, live)
			if err != nil {
				return fmt.Errorf("node %s: %w", s.Addr(), err)
			}
			if want == "" {
				want = got
			} else if got != want {
				return fmt.Errorf("node %s sees slot map %s, another node %s", s.Addr(), got, want)
			}
		}
		return nil
	})
}

// nodeReady checks one node and returns the slot map it sees.
func nodeReady(ctx context.Context, s *Server, live map[string]bool) (string, error) {
	cl := s.probe()
	defer cl.Close()
	info, err := cl.ClusterInfo(ctx).Result()
	if err != nil {
		return "", err
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return "", errors.New("not cluster_state:ok")
	}
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return "", err
	}
	got, covered := slotMap(slots)
	if covered != ClusterSlots {
		return "", fmt.Errorf("%d slots covered", covered)
	}
	for _, sl := range slots {
		if len(sl.Nodes) == 0 || !live[sl.Nodes[0].ID] {
			return "", fmt.Errorf("slots %d-%d are served by a stopped node", sl.Start, sl.End)
		}
	}
	repl, err := cl.Info(ctx, "replication").Result()
	if err != nil {
		return "", err
	}
	if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
		return "", errors.New("replica not in sync with its master")
	}
	return got, nil
}

// slotMap is a canonical text of the slot ranges and the ids serving them.
func slotMap(slots []redis.ClusterSlot) (string, int) {
	parts := make([]string, 0, len(slots))
	covered := 0
	for _, s := range slots {
		covered += s.End - s.Start + 1
		ids := make([]string, 0, len(s.Nodes))
		for j, n := range s.Nodes {
			if j > 0 {
				ids = append(ids, n.ID)
			}
		}
		sort.Strings(ids)
		master := ""
		if len(s.Nodes) > 0 {
			master = s.Nodes[0].ID
		}
		parts = append(parts, fmt.Sprintf("%d-%d=%s/%s", s.Start, s.End, master, strings.Join(ids, ",")))
	}
	sort.Strings(parts)
	return strings.Join(parts, " "), covered
}

// waitUntil polls check until it returns nil or ctx ends.
func waitUntil(ctx context.Context, what string, check func() error) error {
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting until %s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Addrs are HOST:PORT of every node, in node order.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.Addr()
	}
	return out
}

// URL is the redis+cluster:// URL naming every node, the form --redis and
// internal/redisurl accept.
func (c *Cluster) URL() string { return "redis+cluster://" + strings.Join(c.Addrs(), ",") }

// Client returns a new Cluster client seeded with every node, closed when
// the test ends.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), PoolSize: 64})
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Len is the number of nodes.
func (c *Cluster) Len() int { return len(c.nodes) }

// Node is node i (see Cluster for the numbering), to kill, freeze, thaw or
// restart it. A restarted node keeps its identity (nodes.conf is in its
// directory) and rejoins the Cluster by itself.
func (c *Cluster) Node(i int) *Server { return c.nodes[i] }

// NodeID is the Cluster node id of node i.
func (c *Cluster) NodeID(i int) string { return c.ids[i] }

// Masters are the nodes serving slots now, in slot order, as the first
// running node that answers sees them; nil when none answers. Before any
// failover these are nodes 0 … Masters-1.
func (c *Cluster) Masters() []*Server {
	var out []*Server
	seen := map[*Server]bool{}
	for _, sl := range c.slots() {
		if m := c.byID(sl.Nodes[0].ID); m != nil && !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	return out
}

// MasterOf is the node serving slot now (see Masters); nil when unknown.
func (c *Cluster) MasterOf(slot int) *Server {
	for _, sl := range c.slots() {
		if sl.Start <= slot && slot <= sl.End {
			return c.byID(sl.Nodes[0].ID)
		}
	}
	return nil
}

func (c *Cluster) byID(id string) *Server {
	for i, s := range c.nodes {
		if c.ids[i] == id {
			return s
		}
	}
	return nil
}

// slots is CLUSTER SLOTS, sorted, from the first running node that answers.
func (c *Cluster) slots() []redis.ClusterSlot {
	for _, s := range c.nodes {
		if !s.running() {
			continue
		}
		cl := s.probe()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		slots, err := cl.ClusterSlots(ctx).Result()
		cancel()
		_ = cl.Close()
		if err != nil {
			continue
		}
		out := slots[:0]
		for _, sl := range slots {
			if len(sl.Nodes) > 0 {
				out = append(out, sl)
			}
		}
		sort.Slice(out, func(a, b int) bool { return out[a].Start < out[b].Start })
		return out
	}
	return nil
}

func (c *Cluster) stop() {
	for _, s := range c.nodes {
		s.stop()
	}
}
