package outbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeQuickstartCompiles builds the README's quickstart program as
// it is written, in a module of its own that uses this checkout.
func TestReadmeQuickstartCompiles(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(readme), "## Quickstart")
	require.True(t, ok, "README.md has no Quickstart section")
	block := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(after)
	require.NotNil(t, block, "the Quickstart section has no Go code block")

	root, err := os.Getwd()
	require.NoError(t, err)
	mod, err := os.ReadFile("go.mod")
	require.NoError(t, err)
	sum, err := os.ReadFile("go.sum")
	require.NoError(t, err)
	dir := t.TempDir()
	gomod := strings.Replace(string(mod), "module github.com/d419a114/outbox", "module readme", 1) +
		"\nrequire github.com/d419a114/outbox v0.0.0\n\nreplace github.com/d419a114/outbox => " + root + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(block[1]), 0o600))

	cmd := exec.Command("go", "build", "-o", os.DevNull, ".")
	cmd.Dir = dir
	// Outside the workspace the core's go.mod picks the versions, which
	// may be older than those the workspace's build downloaded (an
	// adapter's go.mod can raise them): the build downloads those from
	// the module proxy, as a user's would.
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the README's quickstart does not compile:\n%s", out)
}
