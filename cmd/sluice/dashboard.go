package main

import (
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/hibiken/asynqmon"

	"github.com/sluicehq/sluice/internal/cmdline"
)

// Defaults of the dashboard's flags.
const (
	listenDefault     = "127.0.0.1:8080"
	historyDefault    = 5 * time.Minute
	maxTenantsDefault = 500
	// maxPoints bounds each tenant's history whatever --history and
	// --interval say.
	maxPoints = 3600
	// minInterval is the shortest --interval.
	minInterval = 100 * time.Millisecond
	// asynqRoot is where asynqmon's pages are mounted.
	asynqRoot = "/asynq"
)

//go:embed web
var webFiles embed.FS

// stringList is a flag that may be given several times.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

func dashboardFlags(fs *flag.FlagSet, o *opts) {
	o.interval = durationFlag(time.Second)
	o.history = durationFlag(historyDefault)
	fs.StringVar(&o.listen, "listen", listenDefault, "")
	fs.BoolVar(&o.public, "public", false, "")
	fs.BoolVar(&o.allowWrite, "allow-write", false, "")
	fs.Var(&o.metrics, "metrics", "")
	fs.StringVar(&o.prometheus, "prometheus", "", "")
	fs.StringVar(&o.authFile, "auth-file", "", "")
	fs.Var(&o.interval, "interval", "")
	fs.Var(&o.history, "history", "")
	fs.IntVar(&o.maxTenants, "max-tenants", maxTenantsDefault, "")
}

// dashboard serves the web dashboard until ctx ends (SIGINT or SIGTERM),
// then shuts the server down gracefully and exits 0.
func dashboard(a *app, c *command, o *opts, args []string) error {
	if err := wantArgs(c, args, 0, 0, ""); err != nil {
		return err
	}
	if err := checkListen(c, o.listen, o.public); err != nil {
		return err
	}
	scrapeURLs, err := checkMetricsURLs(c, o.metrics)
	if err != nil {
		return err
	}
	interval, history := time.Duration(o.interval), time.Duration(o.history)
	if interval < minInterval {
		return usagef(c, "--interval %s: must be at least %s (each sample reads every followed tenant's state)", interval, minInterval)
	}
	if history < interval {
		return usagef(c, "--history %s: must be at least --interval (%s)", history, interval)
	}
	if o.maxTenants < 1 {
		return usagef(c, "--max-tenants %d: must be at least 1 (default %d)", o.maxTenants, maxTenantsDefault)
	}
	var prom *promHistory
	if o.prometheus != "" {
		if prom, err = newPromHistory(o.prometheus); err != nil {
			return usagef(c, "--prometheus %q: %v", o.prometheus, err)
		}
	}
	cred, err := loadCredential(o.authFile, a.env)
	if err != nil {
		return usagef(c, "%v", err)
	}
	if o.public && o.allowWrite && cred == nil {
		return usagef(c, "--public with --allow-write: whoever reaches %s could pause queues and delete tasks; give a credential with --auth-file FILE or %s (USER:PASSWORD for basic auth, or a token), or drop --allow-write", o.listen, authEnv)
	}
	cn, err := a.connect(c)
	if err != nil {
		return err
	}
	defer cn.Close()

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("--listen %s: cannot listen: %v; choose another address with --listen HOST:PORT (port 0 picks a free one)", o.listen, cmdline.ListenCause(err))
	}
	mon := asynqmon.New(asynqmon.Options{RootPath: asynqRoot, RedisConnOpt: cn.url.AsynqOpt(), ReadOnly: !o.allowWrite})
	defer func() { _ = mon.Close() }()

	b := newBoard(cn, boardConfig{
		interval:   interval,
		points:     min(int(history/interval), maxPoints),
		maxTenants: o.maxTenants,
		scrape:     scrapeURLs,
		discover:   len(scrapeURLs) == 0,
		history:    prom,
		readOnly:   !o.allowWrite,
	})
	defer b.close()
	h := b.handler(mon, o.public)
	if cred != nil {
		h = cred.guard(h)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}

	sampleCtx, stopSampling := context.WithCancel(a.ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		b.run(sampleCtx)
	}()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	mode := "read-only"
	if o.allowWrite {
		mode = "asynq's pages may change queues and tasks (--allow-write)"
	}
	if cred != nil {
		mode += ", asks for its credential"
	}
	fmt.Fprintf(a.stdout, "sluice dashboard on http://%s/ (%s; asynq's queues and tasks at %s/)\n", ln.Addr(), mode, asynqRoot)

	var serveErr error
	select {
	case <-a.ctx.Done():
	case serveErr = <-served:
	}
	stopSampling()
	<-sampled
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("dashboard: %w", serveErr)
	}
	fmt.Fprintln(a.stdout, "sluice dashboard stopped")
	return nil
}

// checkListen accepts HOST:PORT; a host that is not loopback only with
// --public.
func checkListen(c *command, listen string, public bool) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return usagef(c, "--listen %q: want HOST:PORT such as %s (port 0 picks a free one)", listen, listenDefault)
	}
	if !public && !loopbackHost(host) {
		return usagef(c, "--listen %q: not a loopback address; the dashboard serves 127.0.0.1 or localhost only unless --public is given (and with --allow-write, a credential: --auth-file)", listen)
	}
	return nil
}

// loopbackHost reports whether host (a name or an IP, without port) is this
// machine's loopback: localhost, 127.0.0.0/8 or ::1. An empty host means
// every interface, which is not.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkMetricsURLs accepts http:// and https:// URLs; one without a path
// gets /metrics, the path of a worker's admin endpoint.
func checkMetricsURLs(c *command, raw []string) ([]string, error) {
	var out []string
	for _, r := range raw {
		u, err := url.Parse(r)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, usagef(c, "--metrics %q: want a worker's metrics URL such as http://127.0.0.1:9464/metrics (its --admin address)", r)
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/metrics"
		}
		out = append(out, u.String())
	}
	return out, nil
}

// handler serves the sluice pages, their JSON and asynqmon under /asynq/.
// Every request passes three guards: the Host check against DNS rebinding
// (unless public), the standard library's cross-origin protection, and a
// refusal of every method but GET and HEAD while the dashboard is
// read-only.
func (b *board) handler(mon http.Handler, public bool) http.Handler {
	// The embedded tree is fixed at build time: a mistake in it fails every
	// test at once.
	assets, err := fs.Sub(webFiles, "web/static")
	if err != nil {
		panic(err)
	}
	page := func(file, title, script string) http.HandlerFunc {
		tmpl := template.Must(template.ParseFS(webFiles, "web/layout.html", "web/"+file))
		data := struct{ Title, Script string }{title, script}
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Cache-Control", "no-cache")
			_ = tmpl.Execute(w, data)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", page("index.html", "tenants", "tenants.js"))
	mux.HandleFunc("GET /tenants/{name}", page("tenant.html", "tenant", "tenant.js"))
	mux.HandleFunc("GET /jobs/{id}", page("job.html", "job", "job.js"))
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(assets)))
	mux.HandleFunc("GET /api/tenants", b.serveTenants)
	mux.HandleFunc("GET /api/tenants/{name}", b.serveTenant)
	mux.HandleFunc("GET /api/jobs/{id}", b.serveJob)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.Handle(asynqRoot+"/", mon)
	mux.Handle(asynqRoot, http.RedirectHandler(asynqRoot+"/", http.StatusMovedPermanently))

	var h http.Handler = mux
	if b.cfg.readOnly {
		next := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				http.Error(w, "the dashboard is read-only: start it with --allow-write to let asynq's pages pause queues and run, archive or delete tasks", http.StatusMethodNotAllowed)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	h = http.NewCrossOriginProtection().Handler(h)
	if !public {
		next := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			host, _, err := net.SplitHostPort(r.Host)
			if err != nil {
				host = r.Host
			}
			if !loopbackHost(strings.Trim(host, "[]")) {
				http.Error(w, fmt.Sprintf("Host %q is not this machine's loopback: the dashboard answers only to localhost or 127.0.0.1 unless started with --public", r.Host), http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	return h
}
