package dashboard_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/dashboard"
	"github.com/d419a114/outbox/operator"
)

func TestCancelRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	b := newBrowser(t, f.server(t, &dashboard.Config{Authorize: alice, Prefix: "/ops"}))
	ops := operator.New(&operator.Config{Schema: f.db.Schema})
	id, err := ops.Submit(ctx, f.db.Pool, &operator.Request{Consumer: "billing", Action: operator.Replay, All: true})
	require.NoError(t, err)
	path := "/ops/requests/" + strconv.FormatInt(id, 10)
	require.Contains(t, b.page(path), `id="cancel"`)

	status, _ := b.post(path+"/cancel", nil, nil)
	require.Equal(t, http.StatusForbidden, status, "no CSRF token")
	status, loc := b.post(path+"/cancel", b.form(path), nil)
	require.Equal(t, http.StatusSeeOther, status)
	page := b.page(loc)
	require.Contains(t, page, `id="status" class="cancelled"`)
	require.NotContains(t, page, `id="cancel"`)
	es, err := ops.Audit(ctx, f.db.Pool, &operator.AuditOpts{RequestID: id})
	require.NoError(t, err)
	require.Equal(t, "alice", es[0].Actor)
	require.Equal(t, operator.OutcomeCancelled, es[0].Outcome)
}
