package deploy

import (
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/sluicehq/sluice/internal/redistest"
)

// requireStatic requires that bin needs no dynamic loader (CGO_ENABLED=0):
// it runs on an empty base.
func requireStatic(t *testing.T, bin string) {
	t.Helper()
	f, err := elf.Open(bin)
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "%s asks for a dynamic loader", bin)
	}
}

// k8sObject is what these tests read of a manifest.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Replicas       *int             `yaml:"replicas"`
		ClusterIP      string           `yaml:"clusterIP"`
		MaxUnavailable any              `yaml:"maxUnavailable"`
		Selector       k8sSelector      `yaml:"selector"`
		Ports          []k8sServicePort `yaml:"ports"`
		Template       k8sPodTemplate   `yaml:"template"`
	} `yaml:"spec"`
}

// k8sSelector is a Deployment's or PDB's selector, or a Service's labels.
type k8sSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
	Labels      map[string]string `yaml:",inline"`
}

type k8sServicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort string `yaml:"targetPort"`
}

type k8sPodTemplate struct {
	Metadata struct {
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
		SecurityContext               struct {
			RunAsNonRoot bool `yaml:"runAsNonRoot"`
			RunAsUser    int  `yaml:"runAsUser"`
			RunAsGroup   int  `yaml:"runAsGroup"`
		} `yaml:"securityContext"`
		Containers []k8sContainer `yaml:"containers"`
		Volumes    []struct {
			Name   string `yaml:"name"`
			Secret *struct {
				SecretName string `yaml:"secretName"`
				Items      []struct {
					Key  string `yaml:"key"`
					Path string `yaml:"path"`
				} `yaml:"items"`
			} `yaml:"secret"`
			ConfigMap *struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
		} `yaml:"volumes"`
	} `yaml:"spec"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	VolumeMounts   []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
	} `yaml:"securityContext"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

// readKustomization reads kubernetes/kustomization.yaml and every object
// of its resources, by kind and name.
func readKustomization(t *testing.T) (kust map[string]any, objects map[string]k8sObject) {
	t.Helper()
	raw, err := os.ReadFile("kubernetes/kustomization.yaml")
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(raw, &kust))
	objects = map[string]k8sObject{}
	for _, r := range kust["resources"].([]any) {
		raw, err := os.ReadFile(filepath.Join("kubernetes", r.(string)))
		require.NoError(t, err)
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, r)
			require.NotEmpty(t, o.Kind, r)
			key := o.Kind + "/" + o.Metadata.Name
			require.NotContains(t, objects, key)
			objects[key] = o
		}
	}
	return kust, objects
}

// container returns the one container of a workload and the binary of
// the image it runs.
func container(t *testing.T, b binaries, img image, o k8sObject) (k8sContainer, string) {
	t.Helper()
	require.Len(t, o.Spec.Template.Spec.Containers, 1, o.Metadata.Name)
	c := o.Spec.Template.Spec.Containers[0]
	require.Equal(t, "sluice", c.Image, "the image kustomization's images: tags")
	sc := o.Spec.Template.Spec.SecurityContext
	require.True(t, sc.RunAsNonRoot, o.Metadata.Name)
	require.Equal(t, img.user, strconv.Itoa(sc.RunAsUser)+":"+strconv.Itoa(sc.RunAsGroup), "%s runs as the image's user", o.Metadata.Name)
	require.NotNil(t, c.SecurityContext.AllowPrivilegeEscalation)
	require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	require.True(t, c.SecurityContext.ReadOnlyRootFilesystem)
	for _, e := range c.Env {
		if r := e.ValueFrom.SecretKeyRef; r != nil {
			require.Equal(t, "sluice", r.Name)
			require.Contains(t, []string{"redis-url", "dashboard-auth"}, r.Key, "the keys docs/deploy.md creates")
		}
	}
	return c, binaryOf(t, b, img, c.Command)
}

// redisURL starts a private Redis for one check.
func redisURL(t *testing.T) string { return redistest.NewServer(t, nil).URL() }

// podIP stands for the downward API's status.podIP in the tests.
const podIP = "127.0.0.1"

// testKubernetes checks the manifests: kustomize's resources parse; every
// Service, PodDisruptionBudget and probe points at what exists; each
// container runs its command for real — the worker answers its readiness
// and liveness probes, records the address the dashboard finds it at and
// drains within terminationGracePeriodSeconds; the dashboard starts
// listening beyond loopback, writable, with the Secret's credential; the
// Job applies the ConfigMap's policies.
func testKubernetes(t *testing.T, b binaries) {
	kust, objects := readKustomization(t)
	img := readContainerfile(t)
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		out, err := exec.Command(kubectl, "kustomize", "kubernetes").CombinedOutput()
		require.NoError(t, err, "kubectl kustomize: %s", out)
	} else {
		t.Log("kubectl is not installed: kustomize's own rendering is not checked, the resources are parsed")
	}
	gens := kust["configMapGenerator"].([]any)
	require.Len(t, gens, 1)
	gen := gens[0].(map[string]any)
	require.Equal(t, "sluice-policies", gen["name"])
	require.Equal(t, []any{"policies.yaml"}, gen["files"])

	w := objects["Deployment/sluice-worker"]
	pod := w.Spec.Template
	require.Equal(t, w.Spec.Selector.MatchLabels, pick(pod.Metadata.Labels, w.Spec.Selector.MatchLabels))
	pdb := objects["PodDisruptionBudget/sluice-worker"]
	require.Equal(t, w.Spec.Selector.MatchLabels, pdb.Spec.Selector.MatchLabels, "the PodDisruptionBudget covers the workers")
	require.Equal(t, 1, pdb.Spec.MaxUnavailable, "a drain takes one worker at a time")
	require.GreaterOrEqual(t, *w.Spec.Replicas, 2, "a fleet survives one worker's drain")
	svc := objects["Service/sluice-worker"]
	require.Equal(t, "None", svc.Spec.ClusterIP, "headless: Prometheus finds every pod")

	t.Run("Worker", func(t *testing.T) {
		t.Parallel()
		c, bin := container(t, b, img, w)
		require.Equal(t, b.worker, bin)
		require.Len(t, c.Ports, 1)
		port := strconv.Itoa(c.Ports[0].ContainerPort)
		require.Equal(t, c.Ports[0].Name, svc.Spec.Ports[0].TargetPort)
		require.Equal(t, port, pod.Metadata.Annotations["prometheus.io/port"])
		for _, p := range []*k8sProbe{c.ReadinessProbe, c.LivenessProbe} {
			require.NotNil(t, p)
			require.Equal(t, c.Ports[0].Name, p.HTTPGet.Port)
		}
		require.Equal(t, "/readyz", c.ReadinessProbe.HTTPGet.Path)
		require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
		var fieldRef bool
		for _, e := range c.Env {
			fieldRef = fieldRef || (e.Name == "POD_IP" && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP")
		}
		require.True(t, fieldRef, "POD_IP from the downward API")
		args := slices.Clone(c.Args)
		for i := range args {
			args[i] = strings.ReplaceAll(args[i], "$(POD_IP)", podIP)
		}
		require.Equal(t, port, replaceFlag(t, args, "--admin", "127.0.0.1:0"))
		advertise, _ := flagValue(args, "--advertise")
		require.Equal(t, podIP+":"+port, advertise)
		grace := time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
		checkWorker(t, b, img, args, nil, grace, advertise)
	})

	t.Run("Dashboard", func(t *testing.T) {
		t.Parallel()
		d := objects["Deployment/sluice-dashboard"]
		c, bin := container(t, b, img, d)
		require.Equal(t, b.sluice, bin)
		require.Equal(t, d.Spec.Selector.MatchLabels, pick(objects["Service/sluice-dashboard"].Spec.Selector.Labels, d.Spec.Selector.MatchLabels))
		require.Equal(t, "/healthz", c.ReadinessProbe.HTTPGet.Path)
		require.Equal(t, "/healthz", c.LivenessProbe.HTTPGet.Path)
		args := slices.Clone(c.Args)
		require.Equal(t, "dashboard", args[0])
		require.Contains(t, args, "--public")
		require.Contains(t, args, "--allow-write")
		require.Equal(t, strconv.Itoa(c.Ports[0].ContainerPort), replaceFlag(t, args, "--listen", "127.0.0.1:0"))
		// the credential: the Secret's dashboard-auth, mounted where
		// --auth-file reads it
		authPath, ok := flagValue(args, "--auth-file")
		require.True(t, ok)
		var mounted bool
		for _, m := range c.VolumeMounts {
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == "sluice" {
					for _, it := range v.Secret.Items {
						mounted = mounted || (it.Key == "dashboard-auth" && m.MountPath+"/"+it.Path == authPath)
					}
				}
			}
		}
		require.True(t, mounted, "--auth-file %s is the Secret's dashboard-auth", authPath)
		file := filepath.Join(t.TempDir(), "dashboard-auth")
		require.NoError(t, os.WriteFile(file, []byte("admin:0123456789abcdef\n"), 0o600))
		for i, a := range args {
			args[i] = strings.Replace(a, "--auth-file="+authPath, "--auth-file="+file, 1)
		}
		srv := redisURL(t)
		// without the credential it refuses to start
		code, _, stderr := run(t, b.sluice, map[string]string{"SLUICE_REDIS_URL": srv}, slices.DeleteFunc(slices.Clone(args), func(a string) bool { return strings.HasPrefix(a, "--auth-file") })...)
		require.Equal(t, 2, code)
		require.Contains(t, stderr, "--public with --allow-write: ")
		checkDashboard(t, b.sluice, map[string]string{"SLUICE_REDIS_URL": srv}, args, "admin:0123456789abcdef")
	})

	t.Run("PoliciesJob", func(t *testing.T) {
		t.Parallel()
		j := objects["Job/sluice-policies"]
		c, bin := container(t, b, img, j)
		require.Equal(t, b.sluice, bin)
		require.Equal(t, []string{"policy", "apply", "-f", "/etc/sluice/policies.yaml"}, c.Args)
		require.Len(t, c.VolumeMounts, 1)
		require.Equal(t, "/etc/sluice", c.VolumeMounts[0].MountPath)
		require.Equal(t, "sluice-policies", j.Spec.Template.Spec.Volumes[0].ConfigMap.Name)
		args := slices.Clone(c.Args)
		args[3] = "kubernetes/policies.yaml"
		code, stdout, stderr := run(t, b.sluice, map[string]string{"SLUICE_REDIS_URL": redisURL(t)}, args...)
		require.Equal(t, 0, code, stderr)
		require.Contains(t, stdout, "acme")
	})
}

// pick returns the entries of labels (a map) whose keys want has.
func pick(labels any, want map[string]string) map[string]string {
	out := map[string]string{}
	switch m := labels.(type) {
	case map[string]string:
		for k := range want {
			if v, ok := m[k]; ok {
				out[k] = v
			}
		}
	case map[string]any:
		for k := range want {
			if v, ok := m[k].(string); ok {
				out[k] = v
			}
		}
	}
	return out
}
