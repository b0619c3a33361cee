package outboxprom_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/outboxprom"
)

// exported returns the name of every metric the package can report, from
// the descriptors of its collectors.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	_, err := outboxprom.NewRelayMetrics(reg)
	require.NoError(t, err)
	_, err = outboxprom.NewConsumerMetrics(reg, "svc")
	require.NoError(t, err)
	h, err := outboxprom.NewHealthCollector(pgtest.New(t, nil).Pool, nil)
	require.NoError(t, err)
	descs := make(chan *prometheus.Desc, 100)
	go func() {
		defer close(descs)
		h.Describe(descs)
		for _, c := range []prometheus.Collector{reg} {
			c.Describe(descs)
		}
	}()
	fqName := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	names := map[string]bool{}
	for d := range descs {
		m := fqName.FindStringSubmatch(d.String())
		require.NotNil(t, m, d.String())
		names[m[1]] = true
	}
	return names
}

// Every metric the dashboard and the alert rules query is one the package
// reports (a histogram's _bucket, _sum and _count series included), so a
// renamed metric cannot leave a panel empty or an alert silent. promtool
// checks the rules' syntax and behaviour in .ci/run.
func TestMonitoringQueriesKnownMetrics(t *testing.T) {
	t.Parallel()
	names := exported(t)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	raw, err := os.ReadFile("monitoring/dashboard.json")
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &dash))
	var queries []string
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			queries = append(queries, q.Expr)
		}
	}
	rules, err := os.ReadFile("monitoring/alerts.yml")
	require.NoError(t, err)
	for _, line := range strings.Split(string(rules), "\n") {
		if e, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:"); ok {
			queries = append(queries, e)
		}
	}
	require.Greater(t, len(queries), 20)
	metric := regexp.MustCompile(`outbox_[a-z_]+`)
	seen := map[string]bool{}
	for _, q := range queries {
		for _, m := range metric.FindAllString(q, -1) {
			base := m
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(m, suffix); ok && names[b] {
					base = b
				}
			}
			require.True(t, names[base], "%q queries %s, which the package does not report", q, m)
			seen[base] = true
		}
	}
	for n := range names {
		require.True(t, seen[n], "the dashboard and the alerts never show %s", n)
	}
}

// TestDashboardFiltersByShard: every series the Grafana dashboard queries
// is filtered by its shard variable, which matches the series of a
// single database (no shard label) too.
func TestDashboardFiltersByShard(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("monitoring/dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Templating struct {
			List []struct {
				Name     string `json:"name"`
				AllValue string `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	var vars []string
	for _, v := range dash.Templating.List {
		vars = append(vars, v.Name)
		if v.Name == "shard" {
			require.Equal(t, ".*", v.AllValue, "All must match series without a shard label")
		}
	}
	require.Contains(t, vars, "shard")
	selector := regexp.MustCompile(`outbox_[a-z_]+(\{[^}]*\})?`)
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			for _, m := range selector.FindAllString(q.Expr, -1) {
				require.Contains(t, m, `shard=~"$shard"`, "%q does not filter by shard", q.Expr)
			}
		}
	}
}
