package producer

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/d419a114/outbox/internal/pgtest"
)

// The claim commits without waiting for the WAL flush
// (tables.Relay.ClaimNoFlush), and that reaches nothing but the claim: it
// is committed and visible to other sessions when the claim returns, and
// the lock session, where later claims, heartbeats and lookups run, keeps
// synchronous commit.
func TestClaimNoFlushStaysInTheClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, nil)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = NewWriter(&WriterConfig{Schema: db.Schema}).Write(ctx, tx, Event{AggregateType: "account", AggregateID: "a", EventType: "e", Payload: []byte("x")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	client, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	require.NoError(t, err)
	defer client.Close()
	r, err := NewRelay(db.Pool, client, &RelayConfig{Schema: db.Schema, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	o := newBucketOwner(r, r.newSession())
	defer o.close()
	require.NoError(t, o.rebalance(ctx, false))
	batch, err := o.claim(ctx, nil)
	require.NoError(t, err)
	require.Len(t, batch, 1)

	require.Equal(t, byte('I'), o.sess.conn.PgConn().TxStatus(), "the claim's transaction ended")
	var setting string
	require.NoError(t, o.sess.conn.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&setting))
	require.Equal(t, "on", setting, "the lock session keeps synchronous commit")
	var leased bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT leased_until > now() FROM `+db.Table("events")+` WHERE id = $1`, batch[0].id).Scan(&leased))
	require.True(t, leased, "another session sees the lease")
}
