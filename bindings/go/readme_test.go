// SPDX-License-Identifier: Apache-2.0

package te_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The program in README.md builds and runs as written, in a module of its
// own that uses this one.
func TestREADMEExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	must(t, "reading README.md", err)
	text := string(readme)
	start := strings.Index(text, "```go\n")
	if start < 0 {
		t.Fatalf("README.md has no Go code block")
	}
	text = text[start+len("```go\n"):]
	end := strings.Index(text, "```")
	if end < 0 {
		t.Fatalf("README.md's Go code block does not end")
	}
	program := text[:end]
	if !strings.Contains(program, "func main()") {
		t.Fatalf("README.md's first Go block is not a program:\n%s", program)
	}
	here, err := os.Getwd()
	must(t, "Getwd", err)
	dir := t.TempDir()
	gomod := "module example\n\ngo 1.19\n\nrequire libte.org/te v0.0.0\n\nreplace libte.org/te => " + here + "\n"
	must(t, "go.mod", os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644))
	must(t, "main.go", os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644))
	cmd := exec.Command("go", "run", ".")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go run of the README example: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "hello over tcp" {
		t.Fatalf("README example printed %q", got)
	}
}
