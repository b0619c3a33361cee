package pgtest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/d419a114/outbox/internal/pgserver"
)

// A server that lacks what a package's MainConfig asks for is passed over
// for a throwaway cluster; lacks tells.
func TestLacks(t *testing.T) {
	t.Parallel()
	plain := Own(t, pgserver.Config{})
	logical := Own(t, pgserver.Config{LogicalReplication: true})
	for _, tt := range []struct {
		name string
		srv  *Server
		cfg  pgserver.Config
		want string
	}{
		{"PlainForPlain", plain, pgserver.Config{}, ""},
		{"PlainForLogical", plain, pgserver.Config{LogicalReplication: true}, "wal_level=replica, not logical"},
		{"LogicalForLogical", logical, pgserver.Config{LogicalReplication: true}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := lacks(tt.srv.URL, tt.cfg)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// Own's cluster is the test's, whatever TEST_DATABASE_URL says: it can be
// restarted.
func TestOwnRestarts(t *testing.T) {
	t.Setenv("TEST_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
	srv := Own(t, pgserver.Config{})
	require.NoError(t, srv.Restart())
	db := New(t, &Opts{Server: srv})
	require.Equal(t, srv, db.Server)
}

func TestMain(m *testing.M) { Main(m) }
