// SPDX-License-Identifier: Apache-2.0

package te

/*
#include "tego.h"
void tego_log_trampoline(int level, const char *domain, const char *msg, void *user);
*/
import "C"

import "sync"

// LogHandler receives libte's log lines at or below the current level.
// libte calls it from its own threads as well as from the caller's, so it
// must be safe for concurrent use, and it must not call back into libte.
type LogHandler func(level LogLevel, domain, msg string)

var (
	logMu      sync.RWMutex
	logHandler LogHandler
)

// SetLogHandler sends libte's log lines (process-wide) to fn; nil restores
// the default, which writes them to stderr.
func SetLogHandler(fn LogHandler) {
	logMu.Lock()
	logHandler = fn
	logMu.Unlock()
	if fn == nil {
		C.te_set_log_handler(nil, nil)
	} else {
		C.te_set_log_handler(C.te_log_fn(C.tego_log_trampoline), nil)
	}
}

//export tegoLog
func tegoLog(level C.int, domain, msg *C.char) {
	logMu.RLock()
	fn := logHandler
	logMu.RUnlock()
	if fn != nil {
		fn(LogLevel(level), C.GoString(domain), C.GoString(msg))
	}
}
