package deploy

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/worker"
)

// sluiceImage is the compose file's image of sluice's services.
const sluiceImage = "${SLUICE_IMAGE:-sluice:latest}"

type composeService struct {
	Image           string            `yaml:"image"`
	Entrypoint      []string          `yaml:"entrypoint"`
	Command         []string          `yaml:"command"`
	Environment     map[string]string `yaml:"environment"`
	Volumes         []string          `yaml:"volumes"`
	Ports           []string          `yaml:"ports"`
	StopGracePeriod string            `yaml:"stop_grace_period"`
	DependsOn       map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck map[string]any `yaml:"healthcheck"`
}

func readCompose(t *testing.T) map[string]composeService {
	t.Helper()
	raw, err := os.ReadFile("compose.yaml")
	require.NoError(t, err)
	var doc struct {
		Services map[string]composeService `yaml:"services"`
		Volumes  map[string]any            `yaml:"volumes"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	for name, s := range doc.Services {
		for _, v := range s.Volumes {
			src, _, ok := strings.Cut(v, ":")
			require.True(t, ok, "service %s: volume %q", name, v)
			if strings.HasPrefix(src, "./") {
				_, err := os.Stat(src)
				require.NoError(t, err, "service %s mounts %s", name, src)
			} else {
				require.Contains(t, doc.Volumes, src, "service %s: named volume %s is declared", name, src)
			}
		}
		for dep := range s.DependsOn {
			require.Contains(t, doc.Services, dep, "service %s depends on %s", name, dep)
		}
	}
	return doc.Services
}

// mountedAt maps a path inside service's container to the file of
// deploy/ mounted there.
func mountedAt(t *testing.T, s composeService, inside string) string {
	t.Helper()
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if strings.HasPrefix(parts[0], "./") && (parts[1] == inside || strings.HasPrefix(inside, parts[1]+"/")) {
			return filepath.Join(parts[0], strings.TrimPrefix(inside, parts[1]))
		}
	}
	t.Fatalf("nothing of deploy/ is mounted at %s: %v", inside, s.Volumes)
	return ""
}

// binaryOf is the sluice binary a service of the image runs, from its
// entrypoint (the image's ENTRYPOINT, the worker, when it has none).
func binaryOf(t *testing.T, b binaries, img image, entrypoint []string) string {
	t.Helper()
	path := img.entrypoint
	if len(entrypoint) > 0 {
		require.Len(t, entrypoint, 1)
		path = entrypoint[0]
	}
	require.Contains(t, img.binaries, path, "the image has %s", path)
	return map[string]string{"worker": b.worker, "enqueue": b.enqueue, "sluice": b.sluice}[filepath.Base(path)]
}

// testCompose checks the compose file: its files exist, Prometheus scrapes
// every worker service at the admin port the image gives them, Grafana's
// provisioning points at the dashboard, and every sluice service's
// command runs: the workers start, answer their probes and the image's
// health check, and drain within their grace; the policies apply; the
// producers enqueue; the dashboard serves.
func testCompose(t *testing.T, b binaries) {
	services := readCompose(t)
	img := readContainerfile(t)
	_, adminPort, err := net.SplitHostPort(img.env["SLUICE_WORKER_ADMIN"])
	require.NoError(t, err)

	var workers []string
	for name, s := range services {
		if s.Image == sluiceImage && len(s.Entrypoint) == 0 {
			workers = append(workers, name)
		}
	}
	slices.Sort(workers)
	require.Len(t, workers, 3, "three workers")

	t.Run("Prometheus", func(t *testing.T) {
		p := services["prometheus"]
		raw, err := os.ReadFile(mountedAt(t, p, "/etc/prometheus/prometheus.yml"))
		require.NoError(t, err)
		var cfg struct {
			RuleFiles     []string `yaml:"rule_files"`
			ScrapeConfigs []struct {
				JobName       string `yaml:"job_name"`
				StaticConfigs []struct {
					Targets []string `yaml:"targets"`
				} `yaml:"static_configs"`
			} `yaml:"scrape_configs"`
		}
		require.NoError(t, yaml.Unmarshal(raw, &cfg))
		for _, f := range cfg.RuleFiles {
			require.Equal(t, "prometheus/rules.yml", mountedAt(t, p, f))
		}
		require.Len(t, cfg.ScrapeConfigs, 1)
		require.Equal(t, "sluice-worker", cfg.ScrapeConfigs[0].JobName, "the job the rules and the dashboard name")
		var targets []string
		for _, w := range workers {
			targets = append(targets, w+":"+adminPort)
		}
		require.ElementsMatch(t, targets, cfg.ScrapeConfigs[0].StaticConfigs[0].Targets)
	})

	t.Run("Grafana", func(t *testing.T) {
		g := services["grafana"]
		raw, err := os.ReadFile(mountedAt(t, g, "/etc/grafana/provisioning/dashboards/sluice.yaml"))
		require.NoError(t, err)
		var prov struct {
			Providers []struct {
				Options struct {
					Path string `yaml:"path"`
				} `yaml:"options"`
			} `yaml:"providers"`
		}
		require.NoError(t, yaml.Unmarshal(raw, &prov))
		require.Equal(t, "grafana/dashboards/sluice.json", mountedAt(t, g, prov.Providers[0].Options.Path+"/sluice.json"))
		require.Equal(t, "grafana/dashboards/sluice.json", mountedAt(t, g, g.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]))
		raw, err = os.ReadFile(mountedAt(t, g, "/etc/grafana/provisioning/datasources/prometheus.yaml"))
		require.NoError(t, err)
		var ds struct {
			Datasources []struct {
				Type string `yaml:"type"`
				URL  string `yaml:"url"`
			} `yaml:"datasources"`
		}
		require.NoError(t, yaml.Unmarshal(raw, &ds))
		require.Equal(t, "prometheus", ds.Datasources[0].Type)
		require.Equal(t, "http://prometheus:9090", ds.Datasources[0].URL, "the prometheus service")
	})

	for _, name := range workers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := services[name]
			require.Equal(t, b.worker, binaryOf(t, b, img, s.Entrypoint))
			grace, err := time.ParseDuration(s.StopGracePeriod)
			require.NoError(t, err)
			checkWorker(t, b, img, s.Command, map[string]string{"SLUICE_WORKER_ADMIN": "127.0.0.1:0"}, grace, "")
		})
	}

	srv := redistest.NewServer(t, nil)
	env := map[string]string{"SLUICE_REDIS_URL": srv.URL()}
	for name, s := range services {
		if s.Image != sluiceImage || len(s.Entrypoint) == 0 {
			continue
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bin := binaryOf(t, b, img, s.Entrypoint)
			args := slices.Clone(s.Command)
			switch {
			case bin == b.sluice && args[0] == "policy":
				i := slices.Index(args, "-f")
				args[i+1] = mountedAt(t, s, args[i+1])
				code, stdout, stderr := run(t, bin, env, args...)
				require.Equal(t, 0, code, stderr)
				require.Contains(t, stdout, "acme")
			case bin == b.sluice && args[0] == "dashboard":
				port := replaceFlag(t, args, "--listen", "127.0.0.1:0")
				require.Contains(t, s.Ports, "127.0.0.1:"+port+":"+port, "the dashboard's port, published on the host's loopback")
				checkDashboard(t, bin, env, args, "")
			case bin == b.enqueue:
				require.Equal(t, "service_completed_successfully", s.DependsOn["policies"].Condition, "the producer starts once the policies are in")
				tenant := args[slices.Index(args, "--tenant")+1]
				p := start(t, bin, env, args...)
				waitFor(t, name+"'s first jobs", 10*time.Second, func() bool {
					code, stdout, _ := run(t, b.sluice, env, "jobs", tenant)
					return code == 0 && strings.Count(stdout, "\n") > 1
				})
				p.stop(t)
			default:
				t.Fatalf("service %s runs %s %v: no check for it", name, bin, args)
			}
		})
	}
}

// replaceFlag sets the value of --name (given as --name V or --name=V) in
// args and returns the port of the old value.
func replaceFlag(t *testing.T, args []string, name, value string) string {
	t.Helper()
	for i, a := range args {
		old := ""
		switch {
		case a == name:
			old, args[i+1] = args[i+1], value
		case strings.HasPrefix(a, name+"="):
			old, args[i] = strings.TrimPrefix(a, name+"="), name+"="+value
		default:
			continue
		}
		_, port, err := net.SplitHostPort(old)
		require.NoError(t, err, "%s %q", name, old)
		return port
	}
	t.Fatalf("no %s in %v", name, args)
	return ""
}

// flagValue is the value of --name in args.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// checkWorker runs the worker with args against a private Redis: it
// starts, answers /healthz and /readyz, passes the image's health check,
// records advertise (when given) in the fleet's registry, and drains
// within grace on SIGTERM, which must cover its --shutdown-timeout, the
// wait for handlers that outlive it and a few seconds to leave the fleet.
func checkWorker(t *testing.T, b binaries, img image, args []string, env map[string]string, grace time.Duration, advertise string) {
	t.Helper()
	shutdown := 8 * time.Second
	if v, ok := flagValue(args, "--shutdown-timeout"); ok {
		var err error
		shutdown, err = time.ParseDuration(v)
		require.NoError(t, err)
	}
	require.GreaterOrEqual(t, grace, shutdown+worker.ShutdownWaitDefault+5*time.Second,
		"the grace before SIGKILL covers --shutdown-timeout %s + %s for handlers that outlive it + 5s", shutdown, worker.ShutdownWaitDefault)

	srv := redistest.NewServer(t, nil)
	full := map[string]string{"SLUICE_REDIS_URL": srv.URL()}
	for k, v := range env {
		full[k] = v
	}
	p := start(t, b.worker, full, args...)
	admin := adminOf(t, p)
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		waitFor(t, path+" 200", 10*time.Second, func() bool {
			code, _ := get(t, "http://"+admin+path)
			return code == http.StatusOK
		})
	}
	code, stdout, stderr := run(t, b.worker, map[string]string{"SLUICE_WORKER_ADMIN": admin}, img.healthcheck[1:]...)
	require.Equal(t, 0, code, "the image's health check: %s%s", stdout, stderr)
	if advertise != "" {
		list, err := fleet.New(srv.Client(t), "sluice").List(context.Background())
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, advertise, list[0].Admin, "the address the dashboard finds the worker at")
	}
	exit, took := p.stop(t)
	require.Equal(t, 0, exit, p.stderr.String())
	require.Less(t, took, grace)
}

// checkDashboard runs sluice dashboard with args (--listen on a free
// loopback port): it starts, and /healthz answers without a credential.
// With auth, the credential, the other pages ask for it.
func checkDashboard(t *testing.T, bin string, env map[string]string, args []string, auth string) {
	t.Helper()
	p := start(t, bin, env, args...)
	var base string
	first := regexp.MustCompile(`^sluice dashboard on (http://127\.0\.0\.1:\d+/) `)
	waitFor(t, "the dashboard to start", 20*time.Second, func() bool {
		select {
		case <-p.done:
			t.Fatalf("the dashboard ended: %v\n%s", p.err, p.stderr.String())
		default:
		}
		m := first.FindStringSubmatch(p.stdout.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	})
	code, body := get(t, base+"healthz")
	require.Equal(t, http.StatusOK, code, body)
	code, _ = get(t, base+"api/tenants")
	if auth == "" {
		require.Equal(t, http.StatusOK, code)
	} else {
		require.Equal(t, http.StatusUnauthorized, code)
		user, pass, _ := strings.Cut(auth, ":")
		req, err := http.NewRequest(http.MethodGet, base+"api/tenants", nil)
		require.NoError(t, err)
		req.SetBasicAuth(user, pass)
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	exit, _ := p.stop(t)
	require.Equal(t, 0, exit, p.stderr.String())
}

// image is what the Containerfile says.
type image struct {
	binaries    []string // paths
	entrypoint  string
	healthcheck []string // the command, binary first
	user        string
	env         map[string]string
	expose      []string
}

// readContainerfile reads the Containerfile's instructions this module
// checks the compose file and the manifests against.
func readContainerfile(t *testing.T) image {
	t.Helper()
	raw, err := os.ReadFile("Containerfile")
	require.NoError(t, err)
	text := strings.ReplaceAll(string(raw), "\\\n", " ")
	img := image{env: map[string]string{}}
	var froms []string
	jsonArgs := regexp.MustCompile(`"([^"]*)"`)
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		switch f[0] {
		case "FROM":
			froms = append(froms, f[1])
		case "COPY":
			dest := f[len(f)-1]
			if strings.HasSuffix(dest, "/") {
				for _, src := range f[1 : len(f)-1] {
					img.binaries = append(img.binaries, dest+src)
				}
			}
		case "ENTRYPOINT":
			m := jsonArgs.FindAllStringSubmatch(line, -1)
			require.Len(t, m, 1, line)
			img.entrypoint = m[0][1]
		case "HEALTHCHECK":
			_, cmd, ok := strings.Cut(line, " CMD ")
			require.True(t, ok, line)
			for _, m := range jsonArgs.FindAllStringSubmatch(cmd, -1) {
				img.healthcheck = append(img.healthcheck, m[1])
			}
		case "USER":
			img.user = f[1]
		case "ENV":
			k, v, _ := strings.Cut(f[1], "=")
			img.env[k] = v
		case "EXPOSE":
			img.expose = append(img.expose, f[1:]...)
		}
	}
	require.Equal(t, []string{"scratch"}, froms, "one stage, on an empty base")
	return img
}

// testContainerfile: the image holds every command of cmd/, static, runs
// as a user other than root, exposes the worker's admin port and checks
// its health with the worker itself.
func testContainerfile(t *testing.T, b binaries) {
	img := readContainerfile(t)
	cmds, err := os.ReadDir(filepath.Join(root, "cmd"))
	require.NoError(t, err)
	var want []string
	for _, c := range cmds {
		want = append(want, "/usr/local/bin/"+c.Name())
	}
	require.ElementsMatch(t, want, img.binaries)
	require.Contains(t, img.binaries, img.entrypoint)
	require.Equal(t, "/usr/local/bin/worker", img.entrypoint)
	require.Equal(t, []string{"/usr/local/bin/worker", "--probe", "readyz"}, img.healthcheck)
	uid, _, _ := strings.Cut(img.user, ":")
	n, err := strconv.Atoi(uid)
	require.NoError(t, err, "USER %s: a numeric id, which an empty base can use", img.user)
	require.NotZero(t, n, "not root")
	_, port, err := net.SplitHostPort(img.env["SLUICE_WORKER_ADMIN"])
	require.NoError(t, err)
	require.Equal(t, []string{port}, img.expose)
	for _, bin := range []string{b.worker, b.enqueue, b.sluice} {
		requireStatic(t, bin)
	}
}
