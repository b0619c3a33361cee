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
	r := relayOverOneEvent(t, db)
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

// A Fleet's shard claims on a connection of its pool (claimBeside), with
// the claim's settings for the claim's transaction only: the connection
// goes back to the pool with the server's settings, so the marks that
// follow on it wait for the WAL flush and plan with sorts.
func TestClaimBesideLeavesThePoolConnectionAsItWas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t, &pgtest.Opts{MaxConns: 1})
	show := func() (settings [3]string) {
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('enable_sort'), current_setting('jit')`).
			Scan(&settings[0], &settings[1], &settings[2]))
		return settings
	}
	before := show()
	r := relayOverOneEvent(t, db)
	sess := newLockSession(r.cfg.SessionConfig, r.checkSession, "", true)
	defer sess.close()
	o := newBucketOwner(r, sess)
	defer o.close()
	require.NoError(t, o.rebalance(ctx, false))
	batch, err := o.claim(ctx, nil)
	require.NoError(t, err)
	require.Len(t, batch, 1)

	require.Equal(t, before, show(), "the pool's one connection, after the claim on it")
	var leased bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT leased_until > now() FROM `+db.Table("events")+` WHERE id = $1`, batch[0].id).Scan(&leased))
	require.True(t, leased, "the claim committed")
}

// relayOverOneEvent writes one event to db's schema and returns a Relay
// over it whose client reaches no broker: for tests of the claim alone.
func relayOverOneEvent(t *testing.T, db *pgtest.DB) *Relay {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = NewWriter(&WriterConfig{Schema: db.Schema}).Write(ctx, tx, Event{AggregateType: "account", AggregateID: "a", EventType: "e", Payload: []byte("x")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	client, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	require.NoError(t, err)
	t.Cleanup(client.Close)
	r, err := NewRelay(db.Pool, client, &RelayConfig{Schema: db.Schema, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return r
}
