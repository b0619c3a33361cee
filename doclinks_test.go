package outbox_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	// mdLink is an inline link or image: [text](target) or
	// [text](target "title").
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// mdFence opens or closes a fenced code block.
	mdFence = regexp.MustCompile("^\\s*(```|~~~)")
	// mdCode is an inline code span, where brackets are code, not links.
	mdCode = regexp.MustCompile("`[^`]*`")
)

// TestDocLinksResolve checks that every relative link in the repository's
// Markdown files names a file or directory that exists, so that moving or
// renaming a page or a test file breaks a test instead of a reader's
// click. Anchors (#...) are not checked; links with a scheme are skipped.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	var pages []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			pages = append(pages, path)
		}
		return nil
	})
	require.NoError(t, err)
	require.Contains(t, pages, "README.md", "the walk found no README.md: is the test running in the repository's root?")

	for _, page := range pages {
		text, err := os.ReadFile(page)
		require.NoError(t, err)
		for _, link := range relativeLinks(string(text)) {
			target, _, _ := strings.Cut(link.target, "#")
			if target == "" {
				continue // an anchor in the same page
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(page), filepath.FromSlash(target))); err != nil {
				t.Errorf("%s:%d: link %q names nothing that exists (%v)", page, link.line, link.target, err)
			}
		}
	}
}

// docLink is a link's target and the line it is on.
type docLink struct {
	target string
	line   int
}

// relativeLinks returns the targets of the inline links of a Markdown text
// that have no scheme, leaving out fenced code blocks and code spans.
func relativeLinks(text string) []docLink {
	var links []docLink
	fenced := false
	for i, line := range strings.Split(text, "\n") {
		if mdFence.MatchString(line) {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(mdCode.ReplaceAllString(line, ""), -1) {
			target := strings.Trim(m[1], "<>")
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links = append(links, docLink{target: target, line: i + 1})
		}
	}
	return links
}
