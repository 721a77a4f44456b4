// SPDX-License-Identifier: Apache-2.0

// Package te is the Go interface to libte, a zero-copy, batched,
// asynchronous transfer engine that moves bytes between the registered
// memory of processes on many hosts.
//
// An Engine joins a cluster through a metadata connection string
// ("P2PHANDSHAKE", "etcd://h:p", "redis://h:p", "http://h:p/path") under a
// segment name, registers local memory, opens other engines' segments by
// name and moves data in batches of READ and WRITE requests.
//
// Memory rule: libte reads and writes registered memory from its own
// threads, long after the call that registered it has returned, while cgo
// forbids C to keep Go pointers beyond a call (Go's collector may free or,
// in future versions, move what they point to). Registered memory therefore
// comes from outside the Go heap: Alloc maps it, Free unmaps it, and
// RegisterMemory refuses any slice that does not lie inside an Alloc
// allocation. Free refuses while any engine still has part of the
// allocation registered, and UnregisterMemory refuses while a batch of the
// engine still has tasks reading or writing the region, so memory is never
// unmapped under a transfer.
//
// Errors returned by this package are *Error values that wrap a Code, so
// errors.Is(err, te.ErrNoTransport) (or any other code) works; the message
// carries libte's own explanation of what went wrong.
package te

/*
#cgo pkg-config: libte
#include "tego.h"
*/
import "C"

import (
	"runtime"
	"strings"
)

// Version returns libte's version ("1.2.0").
func Version() string { return C.GoString(C.te_version()) }

// LogLevel is the level of libte's log lines.
type LogLevel int

// Log levels, from the quietest.
const (
	LogError LogLevel = C.TE_LOG_ERROR
	LogWarn  LogLevel = C.TE_LOG_WARN
	LogInfo  LogLevel = C.TE_LOG_INFO
	LogDebug LogLevel = C.TE_LOG_DEBUG
	LogTrace LogLevel = C.TE_LOG_TRACE
)

// SetLogLevel sets libte's process-wide log level (the initial one comes
// from TE_LOG_LEVEL; the default is warn).
func SetLogLevel(l LogLevel) { C.te_set_log_level(C.int(l)) }

// GetLogLevel returns libte's current log level.
func GetLogLevel() LogLevel { return LogLevel(C.te_get_log_level()) }

// ccall runs one libte call and returns its result with the text of the
// error libte logged during it. The goroutine stays on one OS thread for the
// clear, the call and the read, because te_last_error() is thread-local and
// Go may otherwise move the goroutine between cgo calls.
func ccall(fn func() C.int) (int, string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	C.te_last_error_clear()
	rc := fn()
	if rc < 0 {
		return int(rc), C.GoString(C.te_last_error())
	}
	return int(rc), ""
}

// cstring converts s for C, refusing embedded NUL bytes (C would silently
// cut the string there). The caller frees the result with C.free.
func cstring(op, what, s string) (*C.char, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return nil, newError(op, ErrInvalid, what+" contains a NUL byte")
	}
	return C.CString(s), nil
}
