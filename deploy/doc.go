// Package deploy holds no code: its tests check the files beside them — the
// container image's Containerfile, the compose file, the Kubernetes
// manifests, the Grafana dashboard, the Prometheus rules — against the
// binaries they run and the metrics a running worker exports, and check
// docs/metrics.md's table against those metrics. It is a module of its
// own, so that the PromQL parser its tests use is no dependency of
// sluice's users.
package deploy
