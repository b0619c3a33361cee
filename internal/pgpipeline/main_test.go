package pgpipeline_test

import (
	"testing"

	"github.com/d419a114/outbox/internal/pgtest"
)

// TestMain runs the tests beside a throwaway PostgreSQL server.
func TestMain(m *testing.M) { pgtest.Main(m) }
