// SPDX-License-Identifier: Apache-2.0

package te

/*
#include "tego.h"
*/
import "C"

import (
	"fmt"
	"syscall"
)

// Code is a libte error code: a negative errno value or one of libte's own
// codes. It is an error itself, so every *Error returned by this package
// matches its code with errors.Is, and errno codes also match the
// corresponding syscall.Errno (errors.Is(err, syscall.ECONNREFUSED)).
type Code int

// Error names the code the way te_strerror() does.
func (c Code) Error() string { return C.GoString(C.te_strerror(C.int(c))) }

// Is lets an errno code match the positive syscall.Errno of the same number.
func (c Code) Is(target error) bool {
	if errno, ok := target.(syscall.Errno); ok {
		return int(c) == -int(errno)
	}
	return false
}

// libte's own codes.
const (
	ErrPlugin      Code = C.TE_ERR_PLUGIN       // a plugin could not be loaded or failed
	ErrNoTransport Code = C.TE_ERR_NO_TRANSPORT // no installed transport reaches the segment
	ErrMetadata    Code = C.TE_ERR_METADATA     // the metadata store failed or holds bad data
	ErrProtocol    Code = C.TE_ERR_PROTOCOL     // a peer broke the wire protocol
	ErrRejected    Code = C.TE_ERR_REJECTED     // a peer refused the request
	ErrBatchFull   Code = C.TE_ERR_BATCH_FULL   // more requests than the batch's capacity
	ErrAddress     Code = C.TE_ERR_ADDRESS      // memory not registered, or range outside a buffer
	ErrOverlap     Code = C.TE_ERR_OVERLAP      // registration overlaps an existing one
	ErrSegment     Code = C.TE_ERR_SEGMENT      // unknown or closed segment
	ErrBatch       Code = C.TE_ERR_BATCH        // unknown or freed batch
	ErrAuth        Code = C.TE_ERR_AUTH         // peer authentication failed, or the keys differ
)

// errno codes libte returns.
const (
	ErrInvalid      = Code(-int(syscall.EINVAL))
	ErrNoMemory     = Code(-int(syscall.ENOMEM))
	ErrNotFound     = Code(-int(syscall.ENOENT))
	ErrBusy         = Code(-int(syscall.EBUSY))
	ErrTimeout      = Code(-int(syscall.ETIMEDOUT))
	ErrExists       = Code(-int(syscall.EEXIST))
	ErrNotSupported = Code(-int(syscall.ENOTSUP))
	ErrConnRefused  = Code(-int(syscall.ECONNREFUSED))
	ErrCanceled     = Code(-int(syscall.ECANCELED))
	ErrAccess       = Code(-int(syscall.EACCES))
	ErrIO           = Code(-int(syscall.EIO))
	// ErrClosed: the engine was closed, its handle is gone (EBADF).
	ErrClosed = Code(-int(syscall.EBADF))
)

// Error is what this package returns when libte (or the binding's own
// checks) refuse a call.
type Error struct {
	Op     string // the method that failed, e.g. "OpenSegment"
	Code   Code   // libte's code
	Detail string // libte's explanation (te_last_error), or the binding's
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("te: %s: %s", e.Op, e.Code.Error())
	}
	return fmt.Sprintf("te: %s: %s (%s)", e.Op, e.Detail, e.Code.Error())
}

// Unwrap returns the Code, which is what errors.Is compares.
func (e *Error) Unwrap() error { return e.Code }

func newError(op string, code Code, detail string) error {
	return &Error{Op: op, Code: code, Detail: detail}
}

// cerr runs a libte call through ccall and returns its error, if any.
func cerr(op string, fn func() C.int) error {
	_, err := cint(op, fn)
	return err
}

// cint runs a libte call through ccall and returns its non-negative result
// or its error.
func cint(op string, fn func() C.int) (int, error) {
	rc, detail := ccall(fn)
	if rc < 0 {
		return rc, newError(op, Code(rc), detail)
	}
	return rc, nil
}
