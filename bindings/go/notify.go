// SPDX-License-Identifier: Apache-2.0

package te

/*
#include "tego.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// NotifyMax is the longest notification text, in bytes.
const NotifyMax = C.TE_NOTIFY_MAX

// Notification is a short text received from another engine.
type Notification struct {
	Name string // the sender's segment name, or the name it chose
	Msg  string
}

// Notify sends msg to the owner of seg and waits until it acknowledged it.
func (e *Engine) Notify(seg SegmentID, msg string) error {
	return e.notify("Notify", seg, nil, msg)
}

// NotifyAs is Notify with sender as the notification's name instead of
// this engine's segment name.
func (e *Engine) NotifyAs(seg SegmentID, sender, msg string) error {
	return e.notify("NotifyAs", seg, &sender, msg)
}

func (e *Engine) notify(op string, seg SegmentID, sender *string, msg string) error {
	return sendNotify(op, sender, msg, func(csender, cmsg *C.char) error {
		_, err := e.call(op, func(h *C.te_engine) C.int { return C.te_notify_send_as(h, C.te_segment_id(seg), csender, cmsg) })
		return err
	})
}

// sendNotify checks and converts a notification's text and sender (nil:
// the engine's name) and runs send with them; the C strings live until it
// returns.
func sendNotify(op string, sender *string, msg string, send func(csender, cmsg *C.char) error) error {
	if len(msg) > NotifyMax {
		return newError(op, ErrInvalid, fmt.Sprintf("message of %d bytes, at most %d", len(msg), NotifyMax))
	}
	if sender != nil && len(*sender) > NotifyMax {
		return newError(op, ErrInvalid, fmt.Sprintf("sender name of %d bytes, at most %d", len(*sender), NotifyMax))
	}
	cmsg, err := cstring(op, "message", msg)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(cmsg))
	var csender *C.char
	if sender != nil {
		if csender, err = cstring(op, "sender", *sender); err != nil {
			return err
		}
		defer C.free(unsafe.Pointer(csender))
	}
	return send(csender, cmsg)
}

// Notifications takes every notification received and not yet taken.
func (e *Engine) Notifications() ([]Notification, error) {
	var list *C.te_notification
	var n C.size_t
	if _, err := e.call("Notifications", func(h *C.te_engine) C.int { return C.te_notify_fetch(h, &list, &n) }); err != nil {
		return nil, err
	}
	if n == 0 || list == nil {
		return nil, nil
	}
	defer C.te_notifications_free(list, n)
	items := unsafe.Slice(list, int(n))
	out := make([]Notification, len(items))
	for i := range items {
		out[i] = Notification{Name: C.GoString(items[i].name), Msg: C.GoString(items[i].msg)}
	}
	return out, nil
}
