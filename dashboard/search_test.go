package dashboard_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSearch: an operator finds what the tables hold of one aggregate, or
// of one idempotency key, whether or not a letter is open for it.
func TestSearch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.Letters(t)
	f.Process(t, "o-5", "v", 2) // a gap with no letter: seq 1 never came
	f.Process(t, "o-6", "v", 1) // applied
	b := newBrowser(t, f.server(t, nil))

	page := b.page("/consumers/billing/search?aggregate_type=order&aggregate_id=o-1")
	require.Contains(t, page, "waits for seq 1</b>: 2 records parked from seq 2")
	require.Contains(t, page, `id="found-letters"`)
	require.Contains(t, page, "card processor down")
	require.Contains(t, page, "evt-o-1-3", "its parked records")

	page = b.page("/consumers/billing/search?aggregate_type=order&aggregate_id=o-5")
	require.Contains(t, page, "waits for seq 1</b>: 1 records parked from seq 2", "a gap found with no letter open")
	require.Contains(t, page, "<p>None open.</p>")

	page = b.page("/consumers/billing/search?aggregate_type=order&aggregate_id=o-6")
	require.Contains(t, page, "Applied up to seq 1.")

	page = b.page("/consumers/billing/search?key=evt-o-1-2")
	require.Contains(t, page, "Claimed", "a parked record's key is claimed")
	require.Contains(t, page, "evt-o-1-2</td>")
	page = b.page("/consumers/billing/search?key=evt-o-2-1")
	require.Contains(t, page, "Not claimed")
	require.Contains(t, page, "address has no postcode", "the key's letter")
	require.Equal(t, 1, strings.Count(page, `href="/consumers/billing/letters/`), "one letter")

	status, body := b.get("/consumers/billing/search?aggregate_id=o-1")
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "give the aggregate&#39;s type")
}
