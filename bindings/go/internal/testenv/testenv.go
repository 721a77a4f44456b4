// SPDX-License-Identifier: Apache-2.0

// Package testenv is shared by the module's tests: a private redis-server,
// the hold test transport's controls, free ports and byte patterns.
package testenv

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>

typedef size_t (*hold_count_fn)(void);
typedef size_t (*hold_release_fn)(int);

static void *hold_handle(const char *path)
{
	return dlopen(path, RTLD_NOW | RTLD_NOLOAD);
}
static long call_count(void *h)
{
	hold_count_fn f = (hold_count_fn)dlsym(h, "te_test_hold_count");
	return f ? (long)f() : -1;
}
static long call_release(void *h, int err)
{
	hold_release_fn f = (hold_release_fn)dlsym(h, "te_test_hold_release");
	return f ? (long)f(err) : -1;
}
*/
import "C"

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
	"unsafe"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("no free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Redis starts a redis-server of its own (no persistence, data in a
// temporary directory) and returns its "redis://127.0.0.1:port" connection
// string; it is stopped when the test ends. A missing redis-server fails the
// test: the tests are meant to run against a real store.
func Redis(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server not found (tools/install-deps.sh installs it): %v", err)
	}
	dir := t.TempDir()
	for attempt := 0; attempt < 3; attempt++ {
		port := FreePort(t)
		logf := filepath.Join(dir, "redis-"+strconv.Itoa(port)+".log")
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--dir", dir, "--save", "", "--appendonly", "no", "--protected-mode", "no",
			"--daemonize", "no", "--logfile", logf)
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting redis-server: %v", err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		if redisUp(port, exited) {
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
			})
			return "redis://127.0.0.1:" + strconv.Itoa(port)
		}
		_ = cmd.Process.Kill()
		<-exited
		out, _ := os.ReadFile(logf)
		t.Logf("redis-server on port %d did not come up:\n%s", port, out)
	}
	t.Fatalf("redis-server did not start")
	return ""
}

// redisUp waits up to 10 s for redis to answer PING.
func redisUp(port int, exited <-chan struct{}) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte("PING\r\n"))
			buf := make([]byte, 16)
			n, _ := c.Read(buf)
			c.Close()
			if bytes.HasPrefix(buf[:n], []byte("+PONG")) {
				return true
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// Hold controls the "hold" test transport, which keeps every transfer in
// flight until released. Its file is $TE_TEST_HOLD_PLUGIN, in a directory
// on TE_PLUGIN_PATH.
type Hold struct{ h unsafe.Pointer }

// HoldPlugin returns the hold transport's controls; call it after an
// engine loaded the plugin (an engine with the "hold" transport).
func HoldPlugin(t testing.TB) Hold {
	t.Helper()
	return holdPlugin(t, "TE_TEST_HOLD_PLUGIN", "libte-transport-hold.so")
}

// HoldDLPlugin returns the controls of "holddl", the hold transport that
// honours deadlines: libte ends its held transfers at their deadline or a
// cancel, and their bytes never move afterwards. Its file is
// $TE_TEST_HOLDDL_PLUGIN.
func HoldDLPlugin(t testing.TB) Hold {
	t.Helper()
	return holdPlugin(t, "TE_TEST_HOLDDL_PLUGIN", "libte-transport-holddl.so")
}

func holdPlugin(t testing.TB, env, file string) Hold {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		t.Fatalf("%s is not set: run the tests through meson (test 'go'), "+
			"or point it at %s and put its directory on TE_PLUGIN_PATH", env, file)
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	h := C.hold_handle(cpath)
	if h == nil {
		t.Fatalf("hold transport %s is not loaded", path)
	}
	return Hold{h: h}
}

// Count is the number of transfers held.
func (h Hold) Count() int { return int(C.call_count(h.h)) }

// Release completes every held transfer: moved when err is 0 (canceled if
// the batch was), else failed with err. It returns how many it released.
func (h Hold) Release(err int) int { return int(C.call_release(h.h, C.int(err))) }

// Fill writes a pattern derived from seed into b.
func Fill(b []byte, seed uint32) {
	x := seed*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
}

// Pattern returns the pattern Fill writes for n bytes.
func Pattern(n int, seed uint32) []byte {
	b := make([]byte, n)
	Fill(b, seed)
	return b
}

// Diff describes the first difference between got and want, or "".
func Diff(got, want []byte) string {
	if len(got) != len(want) {
		return fmt.Sprintf("length %d, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Sprintf("byte %d is %#02x, want %#02x (%d bytes compared)", i, got[i], want[i], len(got))
		}
	}
	return ""
}
