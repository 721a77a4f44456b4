// SPDX-License-Identifier: Apache-2.0

package p2pstore

import "errors"

// ErrTransferEngine matches (errors.Is) every error the TransferEngine
// methods return; errors.Is and errors.As also reach libte's own error
// (*te.Error, te.ErrNoTransport, ...) inside it. Mooncake's p2pstore
// package declares this variable in its error.go; in that package this file
// is not needed.
var ErrTransferEngine = errors.New("error: transfer engine core")
