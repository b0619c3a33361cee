package main

import (
	"bytes"
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgtest"
	"github.com/d419a114/outbox/operator"
)

func TestRequestsCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	exec := func(args ...string) (string, error) {
		var out bytes.Buffer
		full := append([]string{"requests", "cancel", "-database", db.Server.URL, "-schema", db.Schema, "-by", "alice"}, args...)
		err := run(ctx, full, &out)
		return out.String(), err
	}
	ops := operator.New(&operator.Config{Schema: db.Schema})
	id, err := ops.Submit(ctx, db.Pool, &operator.Request{Consumer: "billing", Action: operator.Replay, All: true})
	require.NoError(t, err)

	out, err := exec(strconv.FormatInt(id, 10))
	require.NoError(t, err)
	require.Equal(t, "request "+strconv.FormatInt(id, 10)+" cancelled; applied 0, discarded 0 before the cancel\n", out)
	r, err := ops.Get(ctx, db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, operator.Cancelled, r.Status)
	es, err := ops.Audit(ctx, db.Pool, &operator.AuditOpts{RequestID: id})
	require.NoError(t, err)
	require.Equal(t, "alice", es[0].Actor)
	require.Equal(t, operator.OutcomeCancelled, es[0].Outcome)

	_, err = exec(strconv.FormatInt(id, 10))
	require.Equal(t, exitFailed, exitCode(err), "cancelled already")
	_, err = exec(strconv.FormatInt(id+100, 10))
	require.Equal(t, exitNotFound, exitCode(err))
	_, err = exec("x")
	require.Equal(t, exitUsage, exitCode(err))
}
