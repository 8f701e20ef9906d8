package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// expr is a PromQL expression of a file of deploy/ and where it is.
type expr struct {
	where, expr string
	record      string // the series a recording rule writes
}

// ruleExprs reads every rule of prometheus/rules.yml.
func ruleExprs(t *testing.T) []expr {
	t.Helper()
	raw, err := os.ReadFile("prometheus/rules.yml")
	require.NoError(t, err)
	var doc struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Record string `yaml:"record"`
				Alert  string `yaml:"alert"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	var out []expr
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			out = append(out, expr{where: "rules.yml " + g.Name + " " + r.Record + r.Alert, expr: r.Expr, record: r.Record})
		}
	}
	require.NotEmpty(t, out)
	return out
}

// grafanaVars stand for the dashboard's variables, as Grafana fills them.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "15s", "$tenant", ".*", "$job", "sluice-worker")

// dashboardExprs reads every query of the Grafana dashboard, its
// variables' queries included (label_values(METRIC, LABEL) is written as
// the selector METRIC{LABEL!=""}).
func dashboardExprs(t *testing.T) []expr {
	t.Helper()
	raw, err := os.ReadFile("grafana/dashboards/sluice.json")
	require.NoError(t, err)
	var dash struct {
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr  string `json:"expr"`
				RefID string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	require.Equal(t, "sluice", dash.UID)
	var out []expr
	ids := map[int]bool{}
	for _, p := range dash.Panels {
		require.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, q := range p.Targets {
			out = append(out, expr{where: "sluice.json panel " + p.Title + " " + q.RefID, expr: grafanaVars.Replace(q.Expr)})
		}
	}
	labelValues := regexp.MustCompile(`^label_values\(([a-z_:]+), ([a-z_]+)\)$`)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		require.NotNil(t, m, "variable %s: %q", v.Name, v.Definition)
		out = append(out, expr{where: "sluice.json variable " + v.Name, expr: m[1] + `{` + m[2] + `!=""}`})
	}
	return out
}

var promql = parser.NewParser(parser.Options{})

// selector is a series selector of an expression and the labels the
// aggregations above it group by.
type selector struct {
	name     string
	matchers []*labels.Matcher
	grouping []string
}

func selectors(t *testing.T, e expr) []selector {
	t.Helper()
	node, err := promql.ParseExpr(e.expr)
	require.NoError(t, err, "%s", e)
	var out []selector
	parser.Inspect(node, func(n parser.Node, path []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := selector{name: vs.Name, matchers: vs.LabelMatchers}
		for _, p := range path {
			if a, ok := p.(*parser.AggregateExpr); ok && !a.Without {
				s.grouping = append(s.grouping, a.Grouping...)
			}
		}
		out = append(out, s)
		return nil
	})
	return out
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = map[string]bool{"instance": true, "job": true}

// plainAlternation is a regular expression that only lists values.
var plainAlternation = regexp.MustCompile(`^[a-z_]+(\|[a-z_]+)*$`)

// checkExpr requires that e parses and that each of its selectors names a
// family the worker exports (or Prometheus's up, or a recording rule), with
// labels it has and label values it exports, and that it groups by labels
// its series have.
func checkExpr(t *testing.T, e, where string, fams exported, rules []expr) {
	t.Helper()
	for _, s := range selectors(t, expr{where: where, expr: e}) {
		if s.name == "up" || recorded(rules, s.name) {
			continue
		}
		f, ok := fams.lookup(s.name)
		if !ok {
			t.Errorf("%s: %s: no worker exports %s", where, e, s.name)
			continue
		}
		has := func(label string) bool {
			_, ok := f.labels[label]
			return ok || targetLabels[label] || (label == "le" && f.typ.String() == "HISTOGRAM")
		}
		for _, m := range s.matchers {
			if m.Name == labels.MetricName || targetLabels[m.Name] {
				continue
			}
			if !has(m.Name) {
				t.Errorf("%s: %s: %s has no label %s", where, e, s.name, m.Name)
				continue
			}
			var values []string
			switch {
			case m.Type == labels.MatchEqual:
				values = []string{m.Value}
			case m.Type == labels.MatchRegexp && plainAlternation.MatchString(m.Value):
				values = strings.Split(m.Value, "|")
			}
			for _, v := range values {
				if !f.labels[m.Name][v] {
					t.Errorf("%s: %s: no series of %s has %s=%q", where, e, s.name, m.Name, v)
				}
			}
		}
		for _, g := range s.grouping {
			if !has(g) {
				t.Errorf("%s: %s: groups %s by %s, a label it does not have", where, e, s.name, g)
			}
		}
	}
}
