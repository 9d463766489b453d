package jobbroker_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"jobbroker.dev/client/go/jobbroker"
)

// A module zip holds only the files under the module's root, so each of the two modules
// (client/go and its nested client/go/jobbrokerotel) carries a copy of the repository's LICENSE;
// this test keeps the copies identical to it.
func TestModulesCarryTheRepositoryLicense(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(repoRoot(), "LICENSE"))
	if err != nil {
		t.Skipf("no root LICENSE: %v", err)
	}
	for _, dir := range []string{"client/go", "client/go/jobbrokerotel"} {
		got, err := os.ReadFile(filepath.Join(repoRoot(), dir, "LICENSE"))
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s/LICENSE differs from the root LICENSE: copy it again", dir)
		}
	}
}

// jobbrokerotel is released with the same version as the library and requires that version:
// a user's module ignores jobbrokerotel's replace directive, so the version it names must exist.
func TestOtelModuleRequiresThisVersion(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(), "client", "go", "jobbrokerotel", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*jobbroker\.dev/client/go (v\S+)\s*$`).FindStringSubmatch(string(data))
	if m == nil {
		t.Fatal("jobbrokerotel/go.mod does not require jobbroker.dev/client/go")
	}
	if want := "v" + strings.TrimSpace(jobbroker.Version); m[1] != want {
		t.Fatalf("jobbrokerotel/go.mod requires jobbroker.dev/client/go %s, want %s (VERSION)", m[1], want)
	}
}
