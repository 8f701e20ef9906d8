package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func (a *admin) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "sluice worker\n/metrics  Prometheus metrics\n/healthz  200 while the process is alive\n/readyz   200 when Redis answers and the worker takes jobs\n")
	})
	return mux
}

func pidOf() int { return os.Getpid() }

// advertise is the address recorded in the fleet's registry, for sluice
// dashboard to find this worker's metrics: flag when given, else the
// address listened on, with a host that is not one (0.0.0.0, ::) replaced
// by this machine's first address beyond loopback; "" when it has none.
func advertise(flag string, ln *net.TCPAddr) string {
	if flag != "" {
		return flag
	}
	port := strconv.Itoa(ln.Port)
	if !ln.IP.IsUnspecified() {
		return net.JoinHostPort(ln.IP.String(), port)
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.IsGlobalUnicast() {
			return net.JoinHostPort(n.IP.String(), port)
		}
	}
	return ""
}

// probe asks the running worker's admin endpoint (o.probe: healthz or
// readyz) at its --admin address and exits 0 on 200, 1 otherwise: the
// container image's health check, which has no shell or curl.
func probe(ctx context.Context, o *options, stdout, stderr io.Writer) int {
	host, port, _ := net.SplitHostPort(o.admin)
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	u := "http://" + net.JoinHostPort(host, port) + "/" + o.probe
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		fmt.Fprintf(stderr, "worker: --probe %s: %v\n", o.probe, err)
		return exitFailure
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "worker: --probe %s: %v (is the worker running with --admin %s?)\n", o.probe, err, o.admin)
		return exitFailure
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "worker: --probe %s: %s: %s", o.probe, resp.Status, body)
		return exitFailure
	}
	fmt.Fprintf(stdout, "%s: %s", u, body)
	return exitOK
}

// probeTimeout bounds --probe's request.
const probeTimeout = 3 * time.Second
